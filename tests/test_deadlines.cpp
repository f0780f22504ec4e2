// Deadlines and dead peers: a posted transfer that never completes fails at the completion
// deadline while the service keeps serving everyone else, its operand stays held while the
// provider may still touch it, and a target killed mid-transfer fails exactly its own transfers.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstring>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "dma/protocol.hpp"
#include "dma/service.hpp"
#include "dma/target.hpp"
#include "child_process.hpp"
#include "fixtures.hpp"

namespace dma {
namespace {

using testing::Buffer;
using testing::Collector;
using testing::loopback;
using testing::pattern;
using testing::start_service;

const std::string kCli = DMA_BINARY_DIR "/bin/dma-cli";

// What on_expired reported, shared with the test (the context itself is held by the service).
struct ExpiryLog {
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<Error> errors;

  bool wait_for_count(std::size_t count) {
    std::unique_lock lock(mutex);
    return changed.wait_for(lock, testing::kDeadline, [&] { return errors.size() >= count; });
  }
};

// A Buffer that logs its expiry and records whether its bytes were freed early.
class WatchedBuffer : public Buffer {
 public:
  WatchedBuffer(std::vector<std::byte> initial, ExpiryLog& log)
      : Buffer(std::move(initial)), log_(log) {}
  void on_expired(const Error& error) override {
    // Notified under the lock: once it is released the test may destroy the log.
    std::lock_guard lock(log_.mutex);
    log_.errors.push_back(error);
    log_.changed.notify_all();
  }

 private:
  ExpiryLog& log_;
};


// A write shm never completes: 4096 bytes into a region exposed as 64 (docs/PROVIDERS.md, "shm"). The
// exposed bytes sit at the start of `memory`, which is large enough that the overrun lands in
// memory the test owns.
TransferRequest never_completing_write(const Target& target, const Exposed& exposed,
                                       std::uint64_t client, std::unique_ptr<Operands> context) {
  TransferRequest request;
  request.client_id = client;
  request.peer_address = testing::address_of(target.local_address());
  request.regions.push_back(exposed.region(0, 4096));  // claims more than was exposed
  request.context = std::move(context);
  return request;
}

TEST(CompletionDeadline, shm_s_never_completing_write_fails_at_the_deadline_and_is_held_until_shutdown) {
  // If this fails, shm's bad delivery-complete write either hangs its caller forever or hands
  // back a buffer the provider may still read.
  Configuration configuration = loopback("shm");
  configuration.completion_deadline = std::chrono::milliseconds(300);
  Collector collector;
  auto service = start_service(configuration, collector);
  ASSERT_TRUE(service);
  auto target = Target::open(configuration);
  ASSERT_TRUE(target) << target.error().describe();
  std::vector<std::byte> memory(8192);
  auto exposed = (*target)->expose(memory.data(), 64);
  ASSERT_TRUE(exposed) << exposed.error().describe();
  ExpiryLog log;
  ASSERT_TRUE(service->submit(never_completing_write(
      **target, *exposed, 1, std::make_unique<WatchedBuffer>(pattern(4096, 3), log))));
  ASSERT_TRUE(log.wait_for_count(1)) << "the stuck write never expired";
  {
    std::lock_guard lock(log.mutex);
    EXPECT_EQ(ErrorCode::kTimedOut, log.errors[0].code()) << log.errors[0].describe();
    EXPECT_NE(std::string::npos, log.errors[0].message().find("completion deadline"))
        << log.errors[0].describe();
  }
  EXPECT_EQ(1u, service->counters().expired);
  EXPECT_EQ(0u, collector.count()) << "handed back while the provider may still read it";

  // Shutdown closes the endpoint under the held write and only then hands its context back.
  service.reset();
  auto released = collector.wait_for(1, std::chrono::milliseconds(0));
  ASSERT_EQ(1u, released.size());
  ASSERT_FALSE(released[0].outcome);
  EXPECT_EQ(ErrorCode::kTimedOut, released[0].outcome.error().code());
  ASSERT_NE(nullptr, released[0].context);
  EXPECT_EQ(pattern(4096, 3), testing::buffer_of(released[0].context)->bytes);
}

// ---- a peer that hangs (SIGSTOP) with transfers posted ----------------------------------

class HungPeer : public ::testing::TestWithParam<std::string> {};

TEST_P(HungPeer, its_transfers_expire_other_clients_keep_flowing_and_late_completions_release_them) {
  // If this fails, one frozen client (a stopped process, a wedged host) holds the in-flight
  // cap forever: with the cap at one, the whole server stops. And a transfer it eventually
  // completes must come back as the failure already reported, with its own buffer.
  constexpr std::size_t kValue = 1 << 20;
  constexpr std::size_t kStuck = 4;
  Configuration configuration = loopback(GetParam());
  configuration.completion_deadline = std::chrono::milliseconds(500);
  configuration.max_in_flight = 1;
  Collector collector;
  auto service = start_service(configuration, collector);
  ASSERT_TRUE(service);

  testing::Child frozen({kCli, "target", "--provider", GetParam(), "--bind", "127.0.0.1",
                         "--size", std::to_string(kValue * kStuck)});
  ASSERT_TRUE(frozen.running());
  const std::string wire = frozen.read_line();
  auto advertisement = parse_advertisement(wire);
  ASSERT_TRUE(advertisement) << "'" << wire << "': " << advertisement.error().describe();
  ASSERT_EQ("ok", frozen.ask("initiator " + hex_encode(service->local_address())));
  // One transfer first, so the connection is up before the process freezes.
  ExpiryLog log;
  const auto to_frozen = [&](std::size_t slot, std::uint32_t seed) {
    TransferRequest request;
    request.client_id = 1;
    request.peer_address = testing::address_of(advertisement->address);
    request.regions.push_back(
        RemoteRegion{advertisement->key, advertisement->remote_address + slot * kValue, kValue});
    request.context = std::make_unique<WatchedBuffer>(pattern(kValue, seed), log);
    return request;
  };
  ASSERT_TRUE(service->submit(to_frozen(0, 1)));
  auto warm = collector.wait_for(1);
  ASSERT_EQ(1u, warm.size());
  ASSERT_TRUE(warm[0].outcome) << warm[0].outcome.error().describe();

  ASSERT_NO_FATAL_FAILURE(frozen.freeze());
  for (std::size_t slot = 0; slot < kStuck; ++slot) {
    ASSERT_TRUE(service->submit(to_frozen(slot, static_cast<std::uint32_t>(10 + slot))));
  }
  ASSERT_TRUE(log.wait_for_count(1)) << "nothing expired while the peer was frozen";

  // Another client, through the one-slot cap, while the frozen one's transfers are held.
  auto good_target = Target::open(configuration);
  ASSERT_TRUE(good_target) << good_target.error().describe();
  ASSERT_TRUE((*good_target)->add_initiator(service->local_address()));
  constexpr std::size_t kSmall = 4096;
  constexpr std::size_t kCount = 32;
  std::vector<std::byte> good_memory(kSmall * kCount);
  auto good_exposed = (*good_target)->expose(good_memory.data(), good_memory.size());
  ASSERT_TRUE(good_exposed) << good_exposed.error().describe();
  for (std::size_t index = 0; index < kCount; ++index) {
    TransferRequest request;
    request.client_id = 2;
    request.peer_address = testing::address_of((*good_target)->local_address());
    request.regions.push_back(good_exposed->region(index * kSmall, kSmall));
    request.context = std::make_unique<Buffer>(pattern(kSmall, 100 + index), 2);
    ASSERT_TRUE(service->submit(std::move(request)));
  }
  std::vector<Collector::Finished> finished;
  while (finished.size() < kCount) {
    auto more = collector.wait_for(1);
    ASSERT_FALSE(more.empty()) << "the other client's transfers stopped flowing";
    for (auto& done : more) finished.push_back(std::move(done));
  }
  for (auto& done : finished) {
    ASSERT_EQ(2u, testing::buffer_of(done.context)->tag)
        << "a frozen client's transfer came back early: "
        << (done.outcome ? std::string("succeeded") : done.outcome.error().describe());
    ASSERT_TRUE(done.outcome) << done.outcome.error().describe();
  }
  (*good_target)->synchronize();
  for (std::size_t index = 0; index < kCount; ++index) {
    const auto expected = pattern(kSmall, 100 + index);
    ASSERT_EQ(0, std::memcmp(expected.data(), good_memory.data() + index * kSmall, kSmall))
        << "value " << index;
  }
  EXPECT_GE(service->counters().expired, 1u);

  // The peer wakes: whatever it completes comes back as the failure it already was, with its
  // buffer; whatever it does not is released at shutdown. Every one comes back exactly once.
  ASSERT_NO_FATAL_FAILURE(frozen.thaw());
  service.reset();
  auto released = collector.wait_for(kStuck, std::chrono::milliseconds(0));
  ASSERT_EQ(kStuck, released.size());
  std::size_t expired = 0;
  for (auto& done : released) {
    ASSERT_NE(nullptr, done.context);
    if (!done.outcome) expired += done.outcome.error().code() == ErrorCode::kTimedOut ? 1 : 0;
  }
  std::lock_guard lock(log.mutex);
  EXPECT_EQ(log.errors.size(), expired) << "each expiry reported must come back as a failure";
}

INSTANTIATE_TEST_SUITE_P(Providers, HungPeer, ::testing::Values("tcp", "net"),
                         [](const auto& param_info) { return param_info.param; });

TEST(CompletionDeadline, a_transfer_handle_reports_the_expiry_and_returns_its_context_only_when_released) {
  // If this fails, a caller waiting on a handle either hangs on a stuck transfer or gets its
  // buffer back while the provider may still write from it.
  Configuration configuration = loopback("shm");
  configuration.completion_deadline = std::chrono::milliseconds(200);
  auto service = FabricService::start(configuration, nullptr, nullptr);
  ASSERT_TRUE(service) << service.error().describe();
  auto target = Target::open(configuration);
  ASSERT_TRUE(target) << target.error().describe();
  std::vector<std::byte> memory(8192);
  auto exposed = (*target)->expose(memory.data(), 64);
  ASSERT_TRUE(exposed) << exposed.error().describe();
  auto handle = (*service)->transfer(
      never_completing_write(**target, *exposed, 1, std::make_unique<Buffer>(pattern(4096, 5))));
  ASSERT_TRUE(handle) << handle.error().describe();
  Outcome outcome = handle->wait_for(testing::kDeadline);
  ASSERT_FALSE(outcome);
  EXPECT_EQ(ErrorCode::kTimedOut, outcome.error().code()) << outcome.error().describe();
  EXPECT_EQ(nullptr, handle->take_context()) << "the context came back while the provider holds it";
  service->reset();
  auto context = handle->take_context();
  ASSERT_NE(nullptr, context);
  EXPECT_EQ(pattern(4096, 5), testing::buffer_of(context)->bytes);
}

// That a worker holding only expired transfers parks (waking every kHeldPollInterval to reap
// them) instead of spinning is SteppedWorker.a_worker_holding_only_expired_transfers_parks_and_
// wakes_to_reap_them: counted parks on a stepped worker, not CPU ticks over a slept second.

// ---- a target process killed mid-transfer -----------------------------------------------

// ---- the progress deadline is about the peer, not one operation's wait ------------------------

class ProgressDeadline : public ::testing::TestWithParam<std::string> {};

TEST_P(ProgressDeadline, a_live_peer_behind_a_deep_queue_is_never_failed_as_unreachable) {
  // If this fails, a busy server fails transfers to healthy clients as "unreachable": an
  // operation answered -FI_EAGAIN goes to the back of a long queue, and by its next turn more
  // than the progress deadline has passed, though the peer took other posts all along.
  constexpr std::size_t kValue = 4096;
  constexpr std::size_t kTransfers = 4000;
  Configuration configuration = loopback(GetParam());
  configuration.progress_deadline = std::chrono::milliseconds(20);
  auto service = FabricService::start(configuration, nullptr, nullptr);
  ASSERT_TRUE(service) << service.error().describe();
  auto target = Target::open(configuration);
  ASSERT_TRUE(target) << target.error().describe();
  ASSERT_TRUE((*target)->add_initiator((*service)->local_address()));
  std::vector<std::byte> memory(kValue * kTransfers);
  auto exposed = (*target)->expose(memory.data(), memory.size());
  ASSERT_TRUE(exposed) << exposed.error().describe();

  std::vector<Transfer> transfers;
  for (std::size_t slot = 0; slot < kTransfers; ++slot) {
    TransferRequest request;
    request.client_id = 1;
    request.peer_address = testing::address_of((*target)->local_address());
    request.regions.push_back(exposed->region(slot * kValue, kValue));
    request.context = std::make_unique<Buffer>(pattern(kValue, static_cast<std::uint32_t>(slot)));
    auto handle = (*service)->transfer(std::move(request));
    ASSERT_TRUE(handle) << handle.error().describe();
    transfers.push_back(std::move(*handle));
  }
  std::size_t failed = 0;
  std::string first;
  for (Transfer& transfer : transfers) {
    Outcome outcome = transfer.wait_for(testing::kDeadline);
    ASSERT_TRUE(transfer.ready());
    if (!outcome && failed++ == 0) first = outcome.error().describe();
  }
  const ServiceCounters counters = (*service)->counters();
  EXPECT_EQ(0u, failed) << failed << " of " << kTransfers << " failed; the first: " << first
                        << " (" << counters.eagain << " -FI_EAGAIN answers)";
  if (GetParam() == "shm") {
    // shm answers -FI_EAGAIN routinely (docs/PROVIDERS.md, "shm"; hundreds of thousands here): the case this
    // test guards. tcp and net answer it only while connecting, and are here to hold the promise.
    EXPECT_GT(counters.eagain, 0u) << "the deep queue never met -FI_EAGAIN";
  }
  (*target)->synchronize();
  for (std::size_t slot = 0; slot < kTransfers; slot += 97) {
    const auto expected = pattern(kValue, static_cast<std::uint32_t>(slot));
    ASSERT_EQ(0, std::memcmp(expected.data(), memory.data() + slot * kValue, kValue)) << slot;
  }
}

INSTANTIATE_TEST_SUITE_P(Providers, ProgressDeadline, ::testing::Values("tcp", "net", "shm"),
                         [](const auto& param_info) { return param_info.param; });

class KilledTarget : public ::testing::TestWithParam<std::string> {};

TEST_P(KilledTarget, every_transfer_to_it_fails_and_other_clients_are_untouched) {
  // If this fails, a client that crashes with transfers in flight hangs the server's callers,
  // or its failure leaks into other clients' transfers.
  constexpr std::size_t kValue = 256 << 10;
  constexpr std::size_t kSlots = 64;
  Configuration configuration = loopback(GetParam());
  configuration.completion_deadline = std::chrono::seconds(5);
  // The survivor's connection is set up while the dead target's transfers churn through
  // -FI_EAGAIN; under tsan that took over the default second once (a false "unreachable").
  configuration.progress_deadline = std::chrono::seconds(5);
  auto service = FabricService::start(configuration, nullptr, nullptr);
  ASSERT_TRUE(service) << service.error().describe();

  testing::Child doomed({kCli, "target", "--provider", GetParam(), "--bind", "127.0.0.1",
                         "--size", std::to_string(kValue * kSlots)});
  ASSERT_TRUE(doomed.running());
  const std::string wire = doomed.read_line();
  auto advertisement = parse_advertisement(wire);
  ASSERT_TRUE(advertisement) << "'" << wire << "': " << advertisement.error().describe();
  ASSERT_EQ("ok", doomed.ask("initiator " + hex_encode((*service)->local_address())));
  const FabricAddress doomed_address = testing::address_of(advertisement->address);

  auto survivor = Target::open(configuration);
  ASSERT_TRUE(survivor) << survivor.error().describe();
  ASSERT_TRUE((*survivor)->add_initiator((*service)->local_address()));
  std::vector<std::byte> survivor_memory(kValue * kSlots);
  auto survivor_exposed = (*survivor)->expose(survivor_memory.data(), survivor_memory.size());
  ASSERT_TRUE(survivor_exposed) << survivor_exposed.error().describe();

  const auto to_doomed = [&](std::size_t slot, Direction direction) {
    TransferRequest request;
    request.client_id = 1;
    request.peer_address = doomed_address;
    request.regions.push_back(
        RemoteRegion{advertisement->key, advertisement->remote_address + slot * kValue, kValue});
    request.direction = direction;
    request.length = kValue;
    request.context = std::make_unique<Buffer>(pattern(kValue, static_cast<std::uint32_t>(slot)));
    auto handle = (*service)->transfer(std::move(request));
    EXPECT_TRUE(handle) << handle.error().describe();
    return std::move(*handle);
  };
  const auto to_survivor = [&](std::size_t slot) {
    TransferRequest request;
    request.client_id = 2;
    request.peer_address = testing::address_of((*survivor)->local_address());
    request.regions.push_back(survivor_exposed->region(slot * kValue, kValue));
    request.context = std::make_unique<Buffer>(pattern(kValue, static_cast<std::uint32_t>(500 + slot)));
    auto handle = (*service)->transfer(std::move(request));
    EXPECT_TRUE(handle) << handle.error().describe();
    return std::move(*handle);
  };

  // shm (libfabric 1.17) posts by spinning on a lock in the target's shared region, which the
  // target holds while it copies; a target killed holding it leaves a poster that is spinning at
  // that instant spinning forever, inside libfabric, where nothing can interrupt it
  // (peer_process.hpp; it hung a CI run). We cannot survive that, so on shm the kill comes
  // between transfers: what is tested there is that nothing is posted to the dead process
  // afterwards (a post would find the lock held by the dead and never return).
  const bool kill_between_transfers = GetParam() == "shm";
  // A first wave in flight as the target dies, the survivor's transfers interleaved.
  std::vector<Transfer> doomed_wave;
  std::vector<Transfer> survivor_wave;
  for (std::size_t slot = 0; slot < kSlots; ++slot) {
    doomed_wave.push_back(to_doomed(slot, slot % 2 ? Direction::kFromPeer : Direction::kToPeer));
    survivor_wave.push_back(to_survivor(slot));
  }
  if (kill_between_transfers) {
    for (Transfer& transfer : doomed_wave) {
      Outcome outcome = transfer.wait_for(testing::kDeadline);
      ASSERT_TRUE(outcome) << (outcome ? "" : outcome.error().describe());
    }
  }
  doomed.kill_now();
  // A second wave after its death: none of the dead target's can succeed, all the survivor's
  // must.
  std::vector<Transfer> after_death;
  std::vector<Transfer> survivor_after;
  for (std::size_t slot = 0; slot < kSlots; ++slot) {
    after_death.push_back(to_doomed(slot, slot % 2 ? Direction::kFromPeer : Direction::kToPeer));
    survivor_after.push_back(to_survivor(slot));
  }

  for (Transfer& transfer : doomed_wave) {
    // Success (it landed before the kill) or an error; never a hang.
    (void)transfer.wait_for(testing::kDeadline);
    EXPECT_TRUE(transfer.ready()) << "a transfer in flight as its target died never finished";
  }
  for (Transfer& transfer : after_death) {
    Outcome outcome = transfer.wait_for(testing::kDeadline);
    ASSERT_TRUE(transfer.ready()) << "a transfer to a killed process never finished";
    ASSERT_FALSE(outcome) << "a transfer to a killed process succeeded";
    if (kill_between_transfers) {
      // Refused before any call into the provider, naming the dead process.
      EXPECT_EQ(ErrorCode::kUnreachable, outcome.error().code()) << outcome.error().describe();
      EXPECT_NE(std::string::npos, outcome.error().describe().find("has exited"))
          << outcome.error().describe();
    }
  }
  // Every provider serves the survivor in full. (On shm a write in flight to a process that
  // dies is never answered and blocks every later write on the endpoint until the completion
  // deadline, docs/PROVIDERS.md, "shm"; that case is CompletionDeadline's, and is not reached here since the
  // kill comes between transfers.)
  const auto check_survivor = [&](Transfer& transfer, std::size_t slot, const char* wave) {
    Outcome outcome = transfer.wait_for(testing::kDeadline);
    ASSERT_TRUE(transfer.ready()) << wave << " survivor slot " << slot << " never finished";
    ASSERT_TRUE(outcome) << wave << " survivor slot " << slot << ": "
                         << outcome.error().describe();
  };
  for (std::size_t slot = 0; slot < kSlots; ++slot) check_survivor(survivor_wave[slot], slot, "first");
  for (std::size_t slot = 0; slot < kSlots; ++slot) check_survivor(survivor_after[slot], slot, "second");
  // Once the dead target's transfers are all over, the survivor is served in full.
  std::vector<Transfer> survivor_last;
  for (std::size_t slot = 0; slot < kSlots; ++slot) survivor_last.push_back(to_survivor(slot));
  for (std::size_t slot = 0; slot < kSlots; ++slot) check_survivor(survivor_last[slot], slot, "last");
  (*survivor)->synchronize();
  for (std::size_t slot = 0; slot < kSlots; ++slot) {
    const auto expected = pattern(kValue, static_cast<std::uint32_t>(500 + slot));
    ASSERT_EQ(0, std::memcmp(expected.data(), survivor_memory.data() + slot * kValue, kValue))
        << "survivor slot " << slot;
  }
}

INSTANTIATE_TEST_SUITE_P(Providers, KilledTarget, ::testing::Values("tcp", "net", "shm"),
                         [](const auto& param_info) { return param_info.param; });

}  // namespace
}  // namespace dma
