// Availability (issue 13): an endpoint that wedges, a worker stuck inside a provider call and an
// operator's replace_endpoint() all end with a new endpoint under the same FabricService that
// keeps serving; every transfer gets exactly one answer; a bounded shutdown returns within its
// bound and still answers every caller.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "dma/protocol.hpp"
#include "dma/service.hpp"
#include "dma/target.hpp"
#include "child_process.hpp"
#include "fixtures.hpp"
#include "worker/post_hook.hpp"

namespace dma {
namespace {

using testing::Buffer;
using testing::Collector;
using testing::eventually;
using testing::loopback;
using testing::pattern;
using testing::start_service;

const std::string kCli = DMA_BINARY_DIR "/bin/dma-cli";

// What on_expired and the contexts' destructors reported, shared with the test (the contexts
// themselves are held by the service).
struct Log {
  std::mutex mutex;
  std::condition_variable changed;
  std::map<std::uint64_t, std::vector<Error>> expired;  // by tag
  std::vector<std::uint64_t> destroyed;                 // tags

  bool wait_expired(std::uint64_t tag) {
    std::unique_lock lock(mutex);
    return changed.wait_for(lock, testing::kDeadline, [&] { return expired.count(tag) > 0; });
  }
  std::vector<Error> expired_of(std::uint64_t tag) {
    std::lock_guard lock(mutex);
    auto found = expired.find(tag);
    return found == expired.end() ? std::vector<Error>{} : found->second;
  }
  bool was_destroyed(std::uint64_t tag) {
    std::lock_guard lock(mutex);
    return std::find(destroyed.begin(), destroyed.end(), tag) != destroyed.end();
  }
};

class Watched : public Buffer {
 public:
  Watched(std::vector<std::byte> initial, std::uint64_t label, Log& log)
      : Buffer(std::move(initial), label), log_(log) {}
  ~Watched() override {
    std::lock_guard lock(log_.mutex);
    log_.destroyed.push_back(tag);
    log_.changed.notify_all();
  }
  void on_expired(const Error& error) override {
    // Notified under the lock: once released, the test may destroy the log.
    std::lock_guard lock(log_.mutex);
    log_.expired[tag].push_back(error);
    log_.changed.notify_all();
  }

 private:
  Log& log_;
};

// A live peer: a Target exposing `size` bytes.
struct Peer {
  // Declared first so it is freed last: the target (its shm progress may still be landing an
  // overrun write) closes before its memory goes.
  std::vector<std::byte> memory;
  std::unique_ptr<Target> target;
  std::optional<Exposed> exposed;

  static std::unique_ptr<Peer> open(const Configuration& configuration, std::size_t size,
                                    std::size_t exposed_size) {
    auto peer = std::make_unique<Peer>();
    auto target = Target::open(configuration);
    EXPECT_TRUE(target) << target.error().describe();
    if (!target) return nullptr;
    peer->target = std::move(*target);
    peer->memory.resize(size);
    auto exposed = peer->target->expose(peer->memory.data(), exposed_size);
    EXPECT_TRUE(exposed) << exposed.error().describe();
    if (!exposed) return nullptr;
    peer->exposed.emplace(std::move(*exposed));
    return peer;
  }
  FabricAddress address() const { return testing::address_of(target->local_address()); }
  // A write of `bytes` to offset 0; `claimed` overrides the region's length (an overrun).
  TransferRequest write(std::unique_ptr<Operands> context, std::size_t length,
                        std::uint64_t client = 1, bool by_address = true,
                        std::size_t offset = 0) const {
    TransferRequest request;
    request.client_id = client;
    if (by_address) request.peer_address = address();
    request.regions.push_back(exposed->region(offset, length));
    request.context = std::move(context);
    return request;
  }
};

std::string message_of(const Outcome& outcome) {
  return outcome ? std::string("ok") : outcome.error().describe();
}

// How long eventually() waits for a replacement here: a hang guard, not a measurement.
constexpr auto kHangGuard = std::chrono::seconds(10);

// ---- bounded shutdown ---------------------------------------------------------------------
// Runs first: in one process, after the wedge test's rounds, shm's progress in this test's
// in-process targets has crashed (SIGSEGV inside libfabric while the service's endpoint closes;
// the in-process shm crash docs/RELIABILITY.md lists as an open problem). ctest runs each test
// in its own process.

TEST(BoundedShutdown, shm_wedged_endpoint_shuts_down_within_its_bound_and_delivers_every_completion) {
  // If this fails, SHUTDOWN with a wedged shm endpoint waits for writes that never complete
  // (the server is SIGKILLed), or callers of those writes are never answered.
  //
  // The peer is a stopped process (SIGSTOP): its writes never complete. (With the overrun
  // write to an in-process target instead, that target's shm progress crashed inside libfabric
  // in 1 to 4 runs of 10 as the endpoint closed: the in-process shm crash above.)
  Configuration configuration = loopback("shm");
  configuration.completion_deadline = std::chrono::milliseconds(0);  // never expire by itself
  configuration.max_in_flight = 1;
  Log log;  // before the collector: contexts it still holds log into it when destroyed
  Collector collector;
  auto service = start_service(configuration, collector);
  ASSERT_TRUE(service);
  testing::Child frozen({kCli, "target", "--provider", "shm", "--size", "65536"});
  ASSERT_TRUE(frozen.running());
  const std::string wire = frozen.read_line();
  auto advertisement = parse_advertisement(wire);
  ASSERT_TRUE(advertisement) << "'" << wire << "': " << advertisement.error().describe();
  ASSERT_EQ("ok", frozen.ask("initiator " + hex_encode(service->local_address())));
  const auto to_frozen = [&](std::uint64_t tag) {
    TransferRequest request;
    request.client_id = 1;
    request.peer_address = testing::address_of(advertisement->address);
    request.regions.push_back(
        RemoteRegion{advertisement->key, advertisement->remote_address + tag * 1024, 1024});
    request.context = std::make_unique<Watched>(pattern(1024, static_cast<std::uint32_t>(tag)),
                                                tag, log);
    return request;
  };
  // One first, so the connection is up before the process stops.
  ASSERT_TRUE(service->submit(to_frozen(0)));
  {
    auto warm = collector.wait_for(1);
    ASSERT_EQ(1u, warm.size());
    ASSERT_TRUE(warm[0].outcome) << message_of(warm[0].outcome);
  }
  ASSERT_NO_FATAL_FAILURE(frozen.freeze());
  // One posted (the cap is one) and never completed; the rest queued behind it, never posted.
  constexpr std::uint64_t kCount = 5;
  for (std::uint64_t tag = 1; tag <= kCount; ++tag) ASSERT_TRUE(service->submit(to_frozen(tag)));
  EXPECT_TRUE(service->shutdown(std::chrono::milliseconds(1000)))
      << "the worker itself is not stuck: it should finish within the bound";
  auto finished = collector.wait_for(kCount, std::chrono::milliseconds(0));
  ASSERT_EQ(kCount, finished.size());
  std::vector<int> seen(kCount + 1, 0);
  for (auto& each : finished) {
    ++seen[testing::buffer_of(each.context)->tag];
    ASSERT_FALSE(each.outcome);
    EXPECT_EQ(ErrorCode::kWorkerGone, each.outcome.error().code()) << message_of(each.outcome);
  }
  for (std::uint64_t tag = 1; tag <= kCount; ++tag) EXPECT_EQ(1, seen[tag]) << tag;
  EXPECT_EQ(0u, service->counters().abandoned);
}

// ---- the shm wedge ------------------------------------------------------------------------

TEST(EndpointReplacement, shm_wedge_is_replaced_later_writes_succeed_and_the_held_buffer_waits_for_shutdown) {
  // If this fails, one write shm never completes (its target died, or the region was overrun)
  // makes every later write on the endpoint expire, until the server restarts; or the service
  // replaces endpoints that were not wedged at all.
  //
  // With both targets in this process, shm does not always hold the later write behind the
  // overrun one (measured: about half the runs complete it). A round where it completes is the
  // negative case: the endpoint is not wedged and must not be replaced. The test runs rounds
  // until one wedges, and checks every round.
  Configuration configuration = loopback("shm");
  configuration.completion_deadline = std::chrono::milliseconds(300);
  bool wedged = false;
  for (int round = 0; round < 12 && !wedged; ++round) {
    Log log;  // before the collector: contexts it still holds log into it when destroyed
    Collector collector;
    auto service = start_service(configuration, collector);
    ASSERT_TRUE(service);
    // The overrun lands in memory the test owns: 64 bytes exposed at the start of 8192.
    auto victim = Peer::open(configuration, 8192, 64);
    auto live = Peer::open(configuration, 4096, 4096);
    ASSERT_TRUE(victim && live);
    ASSERT_TRUE(live->target->add_initiator(service->local_address()));
    const std::vector<std::uint8_t> first_address = service->local_address();

    ASSERT_TRUE(service->submit(
        victim->write(std::make_unique<Watched>(pattern(4096, 1), 1, log), 4096)));
    // Posted behind it on the same endpoint, to a live peer.
    ASSERT_TRUE(
        service->submit(live->write(std::make_unique<Watched>(pattern(512, 2), 2, log), 512)));
    ASSERT_TRUE(log.wait_expired(1)) << "the overrun write was never answered";
    ASSERT_TRUE(eventually(
        [&] { return service->generation() >= 1 || collector.count() >= 1; }, kHangGuard))
        << "the later write neither completed nor caused a replacement";
    if (service->generation() == 0) {
      // Not wedged: the later write completed; nothing may be replaced.
      auto finished = collector.wait_for(1);
      ASSERT_EQ(1u, finished.size());
      EXPECT_EQ(2u, testing::buffer_of(finished[0].context)->tag);
      EXPECT_TRUE(finished[0].outcome) << message_of(finished[0].outcome);
      EXPECT_EQ(0u, service->counters().replacements);
      EXPECT_TRUE(service->shutdown(std::chrono::seconds(20)));
      EXPECT_EQ(0u, service->generation());
      continue;
    }
    wedged = true;
    EXPECT_EQ(1u, service->generation());
    EXPECT_EQ(1u, service->counters().replacements);
    EXPECT_EQ(0u, service->counters().abandoned);
    EXPECT_NE(first_address, service->local_address()) << "a new endpoint has a new address";
    ASSERT_EQ(1u, log.expired_of(1).size()) << "answered more than once";
    // The write stuck behind it was answered too (by the deadline or the replacement).
    ASSERT_TRUE(log.wait_expired(2));
    EXPECT_EQ(1u, log.expired_of(2).size());

    // The live peer learns the new initiator (dma::Client does so after its re-HELLO).
    ASSERT_TRUE(live->target->add_initiator(service->local_address()));
    ASSERT_TRUE(service->submit(
        live->write(std::make_unique<Watched>(pattern(1024, 3), 3, log), 1024, 1, true, 2048)));
    auto finished = collector.wait_for(1);
    ASSERT_EQ(1u, finished.size());
    ASSERT_TRUE(finished[0].outcome) << message_of(finished[0].outcome);
    EXPECT_EQ(3u, testing::buffer_of(finished[0].context)->tag);
    EXPECT_EQ(0, std::memcmp(pattern(1024, 3).data(), live->memory.data() + 2048, 1024));
    finished.clear();  // destroys context 3

    // The wedged write's buffer: answered, but held while the old endpoint is open.
    EXPECT_FALSE(log.was_destroyed(1)) << "freed while the provider may still read it";
    EXPECT_EQ(0u, collector.count());
    EXPECT_TRUE(service->shutdown(std::chrono::seconds(20)));
    auto released = collector.wait_for(2, std::chrono::milliseconds(0));
    std::vector<int> seen(3, 0);
    for (auto& each : released) {
      const std::uint64_t tag = testing::buffer_of(each.context)->tag;
      ASSERT_TRUE(tag == 1 || tag == 2) << tag;
      ++seen[tag];
      EXPECT_FALSE(each.outcome);
    }
    EXPECT_EQ(1, seen[1]) << "the held write's context did not come back at shutdown";
    EXPECT_EQ(1, seen[2]);
    released.clear();
    EXPECT_TRUE(log.was_destroyed(1));
    EXPECT_EQ(1u, log.expired_of(1).size());
  }
  EXPECT_TRUE(wedged) << "shm never held a later write behind the overrun one in 12 rounds";
}

// ---- a worker stuck inside a provider call ------------------------------------------------

// Blocks the first post made while armed until released, as a provider call that never
// returns would (post_hook.hpp).
struct StuckPost {
  std::mutex mutex;
  std::condition_variable changed;
  bool armed = false;
  bool blocked = false;   // a post is inside the hook
  bool released = false;
  bool returned = false;  // the blocked post has left the hook

  void install() {
    internal::set_post_hook([this] {
      std::unique_lock lock(mutex);
      if (!armed) return;
      armed = false;
      blocked = true;
      changed.notify_all();
      changed.wait(lock, [&] { return released; });
      returned = true;
      changed.notify_all();
    });
  }
  void arm() {
    std::lock_guard lock(mutex);
    armed = true;
  }
  bool wait_blocked() {
    std::unique_lock lock(mutex);
    return changed.wait_for(lock, testing::kDeadline, [&] { return blocked; });
  }
  // Lets the stuck post go and waits until it has left the hook; then removes the hook.
  void release() {
    std::unique_lock lock(mutex);
    released = true;
    changed.notify_all();
    if (blocked) changed.wait_for(lock, testing::kDeadline, [&] { return returned; });
    lock.unlock();
    internal::set_post_hook({});
  }
};

class StuckWorker : public ::testing::TestWithParam<std::string> {};

TEST_P(StuckWorker, watchdog_answers_its_callers_replaces_the_endpoint_and_shutdown_stays_bounded) {
  // If this fails, a worker stuck inside libfabric (shm spinning on a dead target's lock)
  // silently stops the service: nobody answers its callers and shutdown never returns.
  Configuration configuration = loopback(GetParam());
  // Long enough that a worker which is merely slow (ThreadSanitizer on a loaded two-core
  // machine: a 200 ms deadline found the *new* worker "stuck" too, in one CI run) is not taken
  // for stuck; the hook below holds the stuck one for as long as the test needs.
  configuration.stuck_deadline = std::chrono::milliseconds(2000);
  Log log;  // before the collector: contexts it still holds log into it when destroyed
  Collector collector;
  auto service = start_service(configuration, collector);
  ASSERT_TRUE(service);
  // The stuck post goes to this peer once the hook lets go, possibly after the test has ended:
  // it must outlive any worker left behind, so it is never closed (kept for the process).
  static std::vector<std::unique_ptr<Peer>>* kept = new std::vector<std::unique_ptr<Peer>>();
  kept->push_back(Peer::open(configuration, 4096, 4096));
  Peer* peer = kept->back().get();
  ASSERT_TRUE(peer);
  ASSERT_TRUE(peer->target->add_initiator(service->local_address()));
  ASSERT_TRUE(service->add_peer(7, peer->target->local_address()));

  // One transfer first, so the connection is up before the worker is stuck.
  ASSERT_TRUE(service->submit(peer->write(std::make_unique<Watched>(pattern(256, 1), 1, log), 256)));
  {
    auto first = collector.wait_for(1);
    ASSERT_EQ(1u, first.size());
    ASSERT_TRUE(first[0].outcome) << message_of(first[0].outcome);
  }
  StuckPost stuck;
  stuck.install();
  stuck.arm();
  ASSERT_TRUE(service->submit(peer->write(std::make_unique<Watched>(pattern(256, 2), 2, log), 256)));
  ASSERT_TRUE(stuck.wait_blocked());
  ASSERT_TRUE(log.wait_expired(2)) << "the stuck transfer's caller was never answered";
  const std::vector<Error> answer = log.expired_of(2);
  ASSERT_EQ(1u, answer.size());
  EXPECT_EQ(ErrorCode::kFabric, answer[0].code());
  EXPECT_EQ(0u, answer[0].message().rfind("endpoint replaced: ", 0)) << answer[0].describe();
  ASSERT_TRUE(eventually([&] { return service->generation() >= 1; }, kHangGuard));
  EXPECT_EQ(1u, service->generation());
  EXPECT_EQ(1u, service->counters().replacements);
  EXPECT_EQ(1u, service->counters().abandoned);

  // Serving on the new endpoint, to the peer add_peer() made (replayed there) and by address.
  ASSERT_TRUE(peer->target->add_initiator(service->local_address()));
  ASSERT_TRUE(service->submit(
      peer->write(std::make_unique<Watched>(pattern(512, 3), 3, log), 512, 7, false, 0)));
  ASSERT_TRUE(service->submit(
      peer->write(std::make_unique<Watched>(pattern(512, 4), 4, log), 512, 1, true, 1024)));
  {
    auto later = collector.wait_for(2);
    ASSERT_EQ(2u, later.size());
    for (auto& each : later) EXPECT_TRUE(each.outcome) << message_of(each.outcome);
  }
  EXPECT_EQ(0, std::memcmp(pattern(512, 3).data(), peer->memory.data(), 512));
  EXPECT_EQ(0, std::memcmp(pattern(512, 4).data(), peer->memory.data() + 1024, 512));

  // The stuck worker cannot drain: the shutdown leaves it behind and says so. The bound is
  // long enough for the healthy worker to drain under ThreadSanitizer on a loaded machine (at
  // 300 ms it too was left behind once: abandoned 2).
  EXPECT_FALSE(service->shutdown(std::chrono::milliseconds(3000)));
  EXPECT_EQ(1u, service->counters().abandoned);
  EXPECT_FALSE(service->shutdown(std::chrono::milliseconds(300))) << "not idempotent";
  service.reset();
  EXPECT_FALSE(log.was_destroyed(2)) << "freed under a worker that may still post it";
  EXPECT_EQ(1u, log.expired_of(2).size()) << "answered twice";
  // The orphaned worker comes back, delivers nothing and frees nothing.
  stuck.release();
  EXPECT_EQ(0u, collector.count());
}

INSTANTIATE_TEST_SUITE_P(Providers, StuckWorker, ::testing::Values("tcp", "shm"));

// ---- replace_endpoint() with transfers in flight -------------------------------------------

class ExplicitReplacement : public ::testing::TestWithParam<std::string> {};

TEST_P(ExplicitReplacement, every_transfer_gets_one_completion_and_peers_and_pins_carry_over) {
  // If this fails, replacing an endpoint loses or duplicates completions, or the new endpoint
  // does not know the peers and pinned memory the old one had.
  constexpr std::size_t kPiece = 1024;
  constexpr std::size_t kEach = 32;
  Configuration configuration = loopback(GetParam());
  configuration.always_register_operands = true;
  configuration.completion_deadline = std::chrono::milliseconds(10000);
  Log log;  // before the collector: contexts it still holds log into it when destroyed
  Collector collector;
  auto service = start_service(configuration, collector);
  ASSERT_TRUE(service);
  auto peer = Peer::open(configuration, kPiece * kEach * 3, kPiece * kEach * 3);
  ASSERT_TRUE(peer);
  ASSERT_TRUE(peer->target->add_initiator(service->local_address()));
  ASSERT_TRUE(service->add_peer(5, peer->target->local_address()));
  // Sources live in one pinned extent.
  std::vector<std::byte> pinned(kPiece * kEach * 3);
  ASSERT_TRUE(service->pin(reinterpret_cast<std::uintptr_t>(pinned.data()), pinned.size()));
  EXPECT_EQ(ServiceCounters{}.replacements, service->counters().replacements);

  // A context whose source is a slice of the pinned extent.
  class Slice : public Operands {
   public:
    Slice(std::span<const std::byte> bytes, std::uint64_t tag) : bytes_(bytes), tag_(tag) {}
    std::span<const std::byte> source() override { return bytes_; }
    std::uint64_t tag() const { return tag_; }

   private:
    std::span<const std::byte> bytes_;
    std::uint64_t tag_;
  };
  const auto submit = [&](std::size_t index) {
    const auto bytes = pattern(kPiece, static_cast<std::uint32_t>(index + 10));
    std::memcpy(pinned.data() + index * kPiece, bytes.data(), kPiece);
    TransferRequest request;
    request.client_id = 5;  // by the add_peer() entry
    request.regions.push_back(peer->exposed->region(index * kPiece, kPiece));
    request.context = std::make_unique<Slice>(
        std::span<const std::byte>(pinned.data() + index * kPiece, kPiece), index);
    return service->submit(std::move(request));
  };
  for (std::size_t index = 0; index < kEach; ++index) ASSERT_TRUE(submit(index));
  ASSERT_TRUE(service->replace_endpoint("operator asked"));
  EXPECT_EQ(1u, service->generation());
  for (std::size_t index = kEach; index < 2 * kEach; ++index) ASSERT_TRUE(submit(index));
  auto around = collector.wait_for(2 * kEach);
  ASSERT_EQ(2 * kEach, around.size());
  std::vector<int> seen(2 * kEach, 0);
  for (auto& each : around) {
    const std::uint64_t tag = static_cast<Slice*>(each.context.get())->tag();
    ASSERT_LT(tag, 2 * kEach);
    ++seen[tag];
    if (!each.outcome) {
      // Failed by the replacement (the old endpoint had it), or by the new endpoint before
      // the target learned its address.
      EXPECT_EQ(ErrorCode::kFabric, each.outcome.error().code()) << message_of(each.outcome);
    } else {
      EXPECT_EQ(0, std::memcmp(pinned.data() + tag * kPiece, peer->memory.data() + tag * kPiece,
                               kPiece));
    }
  }
  for (std::size_t index = 0; index < 2 * kEach; ++index) {
    EXPECT_EQ(1, seen[index]) << "transfer " << index;
  }

  // Once the target knows the new initiator, everything succeeds: the peer entry and the pin
  // were carried over.
  ASSERT_TRUE(peer->target->add_initiator(service->local_address()));
  for (std::size_t index = 2 * kEach; index < 3 * kEach; ++index) ASSERT_TRUE(submit(index));
  auto after = collector.wait_for(kEach);
  ASSERT_EQ(kEach, after.size());
  for (auto& each : after) {
    ASSERT_TRUE(each.outcome) << message_of(each.outcome);
    const std::uint64_t tag = static_cast<Slice*>(each.context.get())->tag();
    EXPECT_EQ(0, std::memcmp(pinned.data() + tag * kPiece, peer->memory.data() + tag * kPiece,
                             kPiece));
  }
  EXPECT_EQ(1u, service->counters().replacements);
  EXPECT_EQ(0u, service->counters().abandoned);
  EXPECT_TRUE(service->shutdown(std::chrono::seconds(20)));
}

INSTANTIATE_TEST_SUITE_P(Providers, ExplicitReplacement, ::testing::Values("tcp", "net", "shm"));

}  // namespace
}  // namespace dma
