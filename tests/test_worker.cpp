// The worker loop stepped by the test itself: a Worker built on the test thread over a real
// loopback endpoint, whose clock is a ManualClock only the test moves. Every policy that
// depends on time (the progress deadline, the completion deadline, parking) is tested here
// without sleeping through it, and every ordering promise (RemovePeer after its client's
// transfers, -FI_EAGAIN to the back of the queue) pass by pass.
//
// The peers: a dma::Target in this process (its own progress thread makes it a live peer), shm's
// write past an exposed region, which shm never completes (docs/PROVIDERS.md, "shm"; CompletionDeadline in
// test_deadlines.cpp relies on it too, and both fail rather than skip if shm ever completes it),
// and 127.0.0.1:1, where nothing listens, so tcp answers every post -FI_EAGAIN.
#include <gtest/gtest.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_eq.h>
#include <sys/mman.h>

#include <array>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dma/protocol.hpp"
#include "dma/service.hpp"
#include "dma/target.hpp"
#include "fixtures.hpp"
#include "worker/worker.hpp"

namespace dma {
namespace {

using internal::ManualClock;
using internal::ServiceShared;
using internal::Worker;
using internal::WorkerClock;
using internal::WorkerOptions;
using testing::Buffer;
using testing::Collector;
using testing::loopback;
using testing::pattern;

// `FI_SOCKADDR_IN` for 127.0.0.1:1: tcp's connect never establishes, every post is -FI_EAGAIN.
constexpr std::uint8_t kDeadPeer[16] = {2, 0, 0, 1, 127, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0};

// A Buffer that records that (and with what) it expired.
class ExpiringBuffer : public Buffer {
 public:
  using Buffer::Buffer;
  void on_expired(const Error& error) override { expiry = error; }
  std::optional<Error> expiry;
};

// A worker stepped by the test, its completions in `collector`.
class Stepped {
 public:
  // `wake_after`, if given, says of each batch whether to wake the channel once the batch is
  // in `collector` (a test's way to end a park from a pool thread).
  explicit Stepped(const Configuration& configuration,
                   std::chrono::milliseconds held_poll_interval = internal::kHeldPollInterval,
                   std::function<bool(std::span<Completion>)> wake_after = nullptr)
      : shared_(std::make_shared<ServiceShared>()) {
    auto pool = Pool::create(1);
    EXPECT_TRUE(pool) << pool.error().describe();
    shared_->pool = std::move(*pool);
    shared_->complete_batch = [completer = collector.completer(), wake_after = std::move(wake_after),
                               shared = shared_.get()](std::span<Completion> batch) {
      const bool wake = wake_after && wake_after(batch);
      completer(batch);
      if (wake) shared->channel.wake();
    };
    auto worker = Worker::open(configuration, {}, shared_,
                               WorkerOptions{WorkerClock(clock), held_poll_interval});
    EXPECT_TRUE(worker) << worker.error().describe();
    if (worker) worker_ = std::move(*worker);
  }
  ~Stepped() {
    if (worker_) shut_down();
  }

  // What FabricService::submit does, without its thread.
  void submit(TransferRequest request) {
    shared_->outstanding.fetch_add(1);
    ASSERT_TRUE(shared_->channel.push(std::move(request)));
  }
  // Steps (never blocking) until `done` or the test deadline; false on the deadline.
  bool step_until(const std::function<bool()>& done) {
    const auto give_up = std::chrono::steady_clock::now() + testing::kDeadline;
    while (!done()) {
      if (std::chrono::steady_clock::now() > give_up) return false;
      worker_->step(false);
    }
    return true;
  }
  // What the service's destructor does: closes the channel, steps until the worker is done, and
  // waits for its pool jobs. Moves the clock past any completion deadline so held transfers end.
  void shut_down() {
    shared_->channel.close();
    const auto give_up = std::chrono::steady_clock::now() + testing::kDeadline;
    while (worker_->step(false)) {
      clock.advance(std::chrono::milliseconds(100));
      if (std::chrono::steady_clock::now() > give_up) {
        ADD_FAILURE() << "the worker never finished shutting down";
        return;
      }
    }
    std::unique_lock lock(shared_->jobs_mutex);
    EXPECT_TRUE(shared_->jobs_done.wait_for(lock, testing::kDeadline,
                                            [&] { return shared_->jobs == 0; }));
    lock.unlock();
    worker_.reset();
  }

  Worker& worker() { return *worker_; }
  ServiceShared& shared() { return *shared_; }
  explicit operator bool() const { return worker_ != nullptr; }

  ManualClock clock;
  Collector collector;

 private:
  std::shared_ptr<ServiceShared> shared_;
  std::unique_ptr<Worker> worker_;
};

// A live in-process peer with `length` exposed bytes.
struct Peer {
  explicit Peer(const Configuration& configuration, std::size_t length, std::uint32_t seed = 1)
      : memory(pattern(length, seed)) {
    auto opened = Target::open(configuration);
    EXPECT_TRUE(opened) << opened.error().describe();
    target = std::move(*opened);
    auto region = target->expose(memory.data(), memory.size());
    EXPECT_TRUE(region) << region.error().describe();
    exposed.emplace(std::move(*region));
  }
  ~Peer() { exposed.reset(); }
  TransferRequest write(std::uint64_t client, std::size_t offset, std::vector<std::byte> value,
                        bool checksum = false) const {
    TransferRequest request;
    request.client_id = client;
    request.peer_address = testing::address_of(target->local_address());
    request.regions.push_back(exposed->region(offset, value.size()));
    request.want_checksum = checksum;
    request.context = std::make_unique<Buffer>(std::move(value), client);
    return request;
  }
  // A read of [offset, offset + length) of the exposed bytes into a fresh Buffer tagged `client`.
  TransferRequest read(std::uint64_t client, std::size_t offset, std::size_t length,
                       bool checksum = false) const {
    TransferRequest request;
    request.client_id = client;
    request.peer_address = testing::address_of(target->local_address());
    request.regions.push_back(exposed->region(offset, length));
    request.direction = Direction::kFromPeer;
    request.length = length;
    request.want_checksum = checksum;
    request.context = std::make_unique<Buffer>(std::vector<std::byte>{}, client);
    return request;
  }
  std::vector<std::byte> memory;
  std::unique_ptr<Target> target;
  std::optional<Exposed> exposed;  // optional: Exposed's default constructor is not usable here
};

// Reads all of `peer`'s exposed bytes as one checksummed transfer, steps `stepped` until it is
// delivered, and checks it: every byte, and their CRC32C. Call with ASSERT_NO_FATAL_FAILURE.
void read_all_checksummed(Stepped& stepped, const Peer& peer) {
  stepped.submit(peer.read(1, 0, peer.memory.size(), /*checksum=*/true));
  ASSERT_TRUE(stepped.step_until([&] { return stepped.collector.count() == 1; }));
  auto finished = stepped.collector.wait_for(1, std::chrono::milliseconds(0));
  ASSERT_EQ(1u, finished.size());
  ASSERT_TRUE(finished[0].outcome) << finished[0].outcome.error().describe();
  EXPECT_EQ(peer.memory.size(), finished[0].outcome->bytes);
  EXPECT_EQ(crc32c(peer.memory), finished[0].outcome->checksum.value());
  EXPECT_EQ(peer.memory, testing::buffer_of(finished[0].context)->bytes);
}

TransferRequest to_dead_peer(std::uint64_t client) {
  return TransferRequest::single(client, testing::address_of(kDeadPeer), 0, 0, Direction::kToPeer,
                                 0, std::make_unique<Buffer>(pattern(64, 1), client));
}

// shm's never-completing write: 4096 bytes into a region exposed as 64, which sits at the start
// of a larger buffer so the overrun lands in memory the test owns.
struct Overrun {
  Overrun() {
    auto opened = Target::open(loopback("shm"));
    EXPECT_TRUE(opened) << opened.error().describe();
    target = std::move(*opened);
    auto region = target->expose(memory.data(), 64);
    EXPECT_TRUE(region) << region.error().describe();
    exposed.emplace(std::move(*region));
  }
  ~Overrun() { exposed.reset(); }
  TransferRequest write(std::uint64_t client, std::uint32_t seed) const {
    TransferRequest request;
    request.client_id = client;
    request.peer_address = testing::address_of(target->local_address());
    request.regions.push_back(exposed->region(0, 4096));  // claims more than was exposed
    request.context = std::make_unique<ExpiringBuffer>(pattern(4096, seed), client);
    return request;
  }
  std::vector<std::byte> memory = std::vector<std::byte>(8192);
  std::unique_ptr<Target> target;
  std::optional<Exposed> exposed;  // optional: Exposed's default constructor is not usable here
};

// ---- -FI_EAGAIN and the progress deadline --------------------------------------------------

TEST(SteppedWorker, a_transfer_answered_eagain_goes_behind_another_peers_and_is_posted_later) {
  // If this fails, one peer that is not ready (tcp still connecting, shm's queue full) keeps
  // the head of the queue and every other peer's transfer behind it waits, or a refused
  // transfer is dropped. tcp answers a connection's first post -FI_EAGAIN, deterministically:
  // rxm only starts the connect inside that post, and the handshake needs the target's reply.
  Configuration configuration = loopback("tcp");
  Stepped stepped(configuration);
  ASSERT_TRUE(stepped);
  Peer first(configuration, 4096);
  Peer second(configuration, 4096);
  ASSERT_TRUE(first.target->add_initiator(stepped.worker().endpoint().local_address()));
  ASSERT_TRUE(second.target->add_initiator(stepped.worker().endpoint().local_address()));
  stepped.submit(first.write(1, 0, pattern(4096, 20)));
  stepped.submit(second.write(2, 0, pattern(4096, 21)));
  stepped.worker().step(false);
  ASSERT_EQ(1u, stepped.shared().counters.eagain.load()) << "the first post was not refused";
  EXPECT_EQ(0u, stepped.worker().in_flight());
  ASSERT_EQ(2u, stepped.worker().queued());
  EXPECT_EQ(2u, static_cast<const Buffer*>(stepped.worker().queued_context(0))->tag)
      << "the refused transfer kept the head of the queue before another peer's";
  EXPECT_EQ(1u, static_cast<const Buffer*>(stepped.worker().queued_context(1))->tag);

  // Time does not move: only the connections coming up let them through.
  ASSERT_TRUE(stepped.step_until([&] { return stepped.collector.count() == 2; }));
  auto finished = stepped.collector.wait_for(2, std::chrono::milliseconds(0));
  for (auto& done : finished) ASSERT_TRUE(done.outcome) << done.outcome.error().describe();
  first.target->synchronize();
  second.target->synchronize();
  EXPECT_EQ(pattern(4096, 20), first.memory);
  EXPECT_EQ(pattern(4096, 21), second.memory);
}

TEST(SteppedWorker, a_transfer_answered_eagain_keeps_its_place_before_its_own_peers) {
  // If this fails, a refused transfer goes behind the later ones to the same peer, which gains
  // nothing (the peer refuses them as well) and starves it: shm takes small writes one at a
  // time, so the transfer at the front at a refusing pass went to the back again and again
  // (64 B writes at depth 64: p99 1.0-1.3 ms, 0.14-0.26 ms keeping their order; raw's 0.15).
  Configuration configuration = loopback("tcp");
  Stepped stepped(configuration);
  ASSERT_TRUE(stepped);
  Peer peer(configuration, 8192);
  ASSERT_TRUE(peer.target->add_initiator(stepped.worker().endpoint().local_address()));
  stepped.submit(peer.write(1, 0, pattern(4096, 22)));
  stepped.submit(peer.write(2, 4096, pattern(4096, 23)));
  stepped.worker().step(false);
  ASSERT_EQ(1u, stepped.shared().counters.eagain.load()) << "the first post was not refused";
  ASSERT_EQ(2u, stepped.worker().queued());
  EXPECT_EQ(1u, static_cast<const Buffer*>(stepped.worker().queued_context(0))->tag)
      << "the refused transfer went behind a later one to the same peer";
  EXPECT_EQ(2u, static_cast<const Buffer*>(stepped.worker().queued_context(1))->tag);

  ASSERT_TRUE(stepped.step_until([&] { return stepped.collector.count() == 2; }));
  auto finished = stepped.collector.wait_for(2, std::chrono::milliseconds(0));
  for (auto& done : finished) ASSERT_TRUE(done.outcome) << done.outcome.error().describe();
  peer.target->synchronize();
  EXPECT_EQ(0, std::memcmp(pattern(4096, 22).data(), peer.memory.data(), 4096));
  EXPECT_EQ(0, std::memcmp(pattern(4096, 23).data(), peer.memory.data() + 4096, 4096));
}

TEST(SteppedWorker, a_refusing_peer_fails_at_the_progress_deadline_and_not_a_tick_before) {
  // If this fails, a peer that never accepts a connection either holds its transfers (and
  // callers) forever, or a peer only slow to connect is failed early as unreachable.
  Configuration configuration = loopback("tcp");
  configuration.progress_deadline = std::chrono::milliseconds(1000);
  Stepped stepped(configuration);
  ASSERT_TRUE(stepped);
  stepped.submit(to_dead_peer(1));
  stepped.worker().step(false);
  ASSERT_EQ(1u, stepped.worker().queued());
  stepped.clock.advance(std::chrono::milliseconds(999));
  stepped.worker().step(false);
  EXPECT_EQ(1u, stepped.worker().queued()) << "failed before the progress deadline";
  EXPECT_EQ(0u, stepped.collector.count());
  stepped.clock.advance(std::chrono::milliseconds(1));
  stepped.worker().step(false);
  EXPECT_EQ(0u, stepped.worker().queued());
  auto finished = stepped.collector.wait_for(1, std::chrono::milliseconds(0));
  ASSERT_EQ(1u, finished.size());
  ASSERT_FALSE(finished[0].outcome);
  EXPECT_EQ(ErrorCode::kUnreachable, finished[0].outcome.error().code());
  EXPECT_NE(std::string::npos, finished[0].outcome.error().message().find("progress deadline"));
}

TEST(SteppedWorker, the_progress_deadline_runs_on_the_peers_clock_not_each_transfers) {
  // If this fails, the deadline is per transfer again: a transfer sent to the back of a deep
  // queue by one -FI_EAGAIN fails as "unreachable" at its next turn though its peer took posts
  // all along (3,800 of 4,000 on shm), or, here, a peer that has refused everything for the
  // whole deadline still gets a fresh deadline for each new transfer.
  Configuration configuration = loopback("tcp");
  configuration.progress_deadline = std::chrono::milliseconds(1000);
  Stepped stepped(configuration);
  ASSERT_TRUE(stepped);
  stepped.submit(to_dead_peer(1));
  stepped.worker().step(false);  // the peer's first refusal, at t0
  stepped.clock.advance(std::chrono::milliseconds(600));
  stepped.submit(to_dead_peer(2));  // another client on the same address, first refused at t0+600
  stepped.worker().step(false);
  stepped.worker().step(false);
  ASSERT_EQ(2u, stepped.worker().queued());
  ASSERT_GE(stepped.shared().counters.eagain.load(), 3u) << "each transfer must have been refused";
  stepped.clock.advance(std::chrono::milliseconds(400));  // t0+1000: the peer's deadline
  stepped.worker().step(false);
  stepped.worker().step(false);
  auto finished = stepped.collector.wait_for(2, std::chrono::milliseconds(0));
  ASSERT_EQ(2u, finished.size()) << "the later transfer got a deadline of its own";
  for (auto& done : finished) {
    ASSERT_FALSE(done.outcome);
    EXPECT_EQ(ErrorCode::kUnreachable, done.outcome.error().code());
  }
}

// ---- RemovePeer ------------------------------------------------------------------------------

TEST(SteppedWorker, remove_peer_is_handled_only_after_the_clients_transfers) {
  // If this fails, a disconnecting client's address-vector entry goes while its transfers still
  // target it: they fail, or land wherever the next insert puts another client.
  Configuration configuration = loopback("tcp");
  Stepped stepped(configuration);
  ASSERT_TRUE(stepped);
  Peer peer(configuration, 16 * 4096);
  ASSERT_TRUE(peer.target->add_initiator(stepped.worker().endpoint().local_address()));
  constexpr std::size_t kCount = 16;
  for (std::size_t index = 0; index < kCount; ++index) {
    stepped.submit(peer.write(5, index * 4096, pattern(4096, static_cast<std::uint32_t>(index))));
  }
  ASSERT_TRUE(stepped.shared().channel.push(internal::RemovePeerMessage{5}));
  stepped.worker().step(false);  // takes all of it in
  EXPECT_EQ(kCount, stepped.worker().clients().outstanding(5));
  EXPECT_TRUE(stepped.worker().clients().removal_pending(5));
  EXPECT_TRUE(stepped.worker().peers().holds(5)) << "removed under its own transfers";
  ASSERT_TRUE(stepped.step_until([&] { return stepped.collector.count() == kCount; }));
  for (auto& done : stepped.collector.wait_for(kCount, std::chrono::milliseconds(0))) {
    ASSERT_TRUE(done.outcome) << done.outcome.error().describe();
  }
  EXPECT_FALSE(stepped.worker().peers().holds(5)) << "released once its transfers finished";
  EXPECT_FALSE(stepped.worker().clients().removal_pending(5));
  EXPECT_EQ(0u, stepped.worker().peers().clients());
  EXPECT_EQ(0, stepped.worker().peers().holders(peer.target->local_address()));
  peer.target->synchronize();
  for (std::size_t index = 0; index < kCount; ++index) {
    ASSERT_EQ(0, std::memcmp(pattern(4096, static_cast<std::uint32_t>(index)).data(),
                             peer.memory.data() + index * 4096, 4096));
  }
}

TEST(SteppedWorker, add_peer_twice_and_from_two_clients_shares_one_address_vector_entry) {
  // If this fails, a client re-sending its hello stacks references (its entry never leaves the
  // vector) or duplicates the entry (two slots for one address), and two clients on one host
  // cost two entries.
  Configuration configuration = loopback("tcp");
  Stepped stepped(configuration);
  ASSERT_TRUE(stepped);
  Peer peer(configuration, 4096);
  ASSERT_TRUE(peer.target->add_initiator(stepped.worker().endpoint().local_address()));
  const FabricAddress address = testing::address_of(peer.target->local_address());
  std::vector<internal::Waiter<Status>> answers;
  for (std::uint64_t client : {1, 1, 2}) {
    auto [answer, waiter] = internal::one_shot<Status>();
    ASSERT_TRUE(stepped.shared().channel.push(
        internal::AddPeerMessage{client, address, std::move(answer)}));
    answers.push_back(std::move(waiter));
  }
  stepped.worker().step(false);
  for (auto& answer : answers) {
    bool timed_out = false;
    auto added = answer.wait_for(std::chrono::milliseconds(0), timed_out);
    ASSERT_TRUE(added.has_value()) << "not answered in the pass that took it in";
    EXPECT_TRUE(*added) << added->error().describe();
  }
  EXPECT_EQ(1u, stepped.worker().peers().index_size()) << "one address, one entry";
  EXPECT_EQ(2, stepped.worker().peers().holders(peer.target->local_address()));
  // A transfer naming no address uses that entry.
  TransferRequest request = peer.write(1, 0, pattern(4096, 30));
  request.peer_address = FabricAddress();
  stepped.submit(std::move(request));
  ASSERT_TRUE(stepped.step_until([&] { return stepped.collector.count() == 1; }));
  auto finished = stepped.collector.wait_for(1, std::chrono::milliseconds(0));
  ASSERT_TRUE(finished[0].outcome) << finished[0].outcome.error().describe();
  peer.target->synchronize();
  EXPECT_EQ(pattern(4096, 30), peer.memory);
}

// ---- the completion deadline -----------------------------------------------------------------

TEST(SteppedWorker, a_posted_transfer_expires_at_the_completion_deadline_and_is_held_until_shutdown) {
  // If this fails, a transfer the provider never completes either holds its caller forever, is
  // failed before its deadline, or its buffer is handed back while the provider may still read
  // it.
  Configuration configuration = loopback("shm");
  configuration.completion_deadline = std::chrono::milliseconds(1000);
  Stepped stepped(configuration);
  ASSERT_TRUE(stepped);
  Overrun overrun;
  stepped.submit(overrun.write(1, 3));
  ASSERT_TRUE(stepped.step_until([&] { return stepped.worker().in_flight() == 1; }));
  // The scan runs at most every tenth of the deadline, which bounds how late it expires.
  stepped.clock.advance(std::chrono::milliseconds(999));
  stepped.worker().step(false);
  EXPECT_EQ(0u, stepped.worker().held()) << "expired before its deadline";
  EXPECT_EQ(0u, stepped.shared().counters.expired.load());
  stepped.clock.advance(std::chrono::milliseconds(100));
  stepped.worker().step(false);
  ASSERT_EQ(0u, stepped.collector.count())
      << "shm completed the overrun write: this test (and CompletionDeadline) need a rewrite";
  EXPECT_EQ(1u, stepped.worker().held()) << "not expired within a tenth past its deadline";
  EXPECT_EQ(1u, stepped.shared().counters.expired.load());
  EXPECT_TRUE(stepped.worker().idle()) << "an expired transfer still counts against the cap";

  stepped.shut_down();
  auto released = stepped.collector.wait_for(1, std::chrono::milliseconds(0));
  ASSERT_EQ(1u, released.size());
  ASSERT_FALSE(released[0].outcome);
  EXPECT_EQ(ErrorCode::kTimedOut, released[0].outcome.error().code());
  auto* buffer = static_cast<ExpiringBuffer*>(released[0].context.get());
  ASSERT_TRUE(buffer->expiry.has_value()) << "on_expired was not called";
  EXPECT_EQ(ErrorCode::kTimedOut, buffer->expiry->code());
  EXPECT_EQ(pattern(4096, 3), buffer->bytes);
}

TEST(SteppedWorker, shutdown_with_a_never_completing_write_in_flight_ends_it_at_the_deadline) {
  // If this fails, dropping a service with a write shm never completes hangs its destructor,
  // or fails the write as "worker gone" though it was posted and its buffer may still be read.
  Configuration configuration = loopback("shm");
  configuration.completion_deadline = std::chrono::milliseconds(300);
  Stepped stepped(configuration);
  ASSERT_TRUE(stepped);
  Overrun overrun;
  stepped.submit(overrun.write(1, 4));
  ASSERT_TRUE(stepped.step_until([&] { return stepped.worker().in_flight() == 1; }));
  stepped.shared().channel.close();
  // Closed, but a transfer is live: the worker carries on (time standing still) ...
  for (int pass = 0; pass < 100; ++pass) ASSERT_TRUE(stepped.worker().step(false));
  ASSERT_EQ(0u, stepped.collector.count())
      << "shm completed the overrun write: this test (and CompletionDeadline) need a rewrite";
  // ... until the deadline expires it; then it closes the endpoint and hands it back.
  stepped.clock.advance(std::chrono::milliseconds(300));
  const auto give_up = std::chrono::steady_clock::now() + testing::kDeadline;
  while (stepped.worker().step(false)) {
    ASSERT_LT(std::chrono::steady_clock::now(), give_up) << "shutdown hangs";
  }
  auto finished = stepped.collector.wait_for(1, std::chrono::milliseconds(0));
  ASSERT_EQ(1u, finished.size());
  ASSERT_FALSE(finished[0].outcome);
  EXPECT_EQ(ErrorCode::kTimedOut, finished[0].outcome.error().code())
      << finished[0].outcome.error().describe();
}

TEST(SteppedWorker, shm_shutdown_posts_a_transfer_refused_at_first_contact_before_closing_the_endpoint) {
  // If this fails, a service dropped right after its first post to an shm peer closes its
  // endpoint while its connection request still waits in the peer's queue, and the peer's
  // progress, reading it, maps and reads the region that close just unmapped: SIGSEGV in the
  // peer (Races.dropping_a_service_*/shm crashed 1-3 runs in 100 this way). shm refuses the first
  // post to a peer deterministically: it sends the request and answers -FI_EAGAIN.
  Configuration configuration = loopback("shm");
  Stepped stepped(configuration);
  ASSERT_TRUE(stepped);
  Peer peer(configuration, 8192);
  stepped.submit(peer.write(1, 0, pattern(4096, 30)));
  stepped.worker().step(false);
  ASSERT_EQ(1u, stepped.shared().counters.eagain.load()) << "the first post was not refused";
  ASSERT_EQ(0u, stepped.worker().in_flight());
  stepped.shared().channel.close();
  // Time stands still: only the peer reading the request lets the transfer through.
  const auto give_up = std::chrono::steady_clock::now() + testing::kDeadline;
  while (stepped.worker().step(false)) {
    ASSERT_LT(std::chrono::steady_clock::now(), give_up) << "shutdown hangs";
  }
  auto finished = stepped.collector.wait_for(1, std::chrono::milliseconds(0));
  ASSERT_EQ(1u, finished.size());
  ASSERT_TRUE(finished[0].outcome)
      << "failed while the peer still held our connection request: "
      << finished[0].outcome.error().describe();
  peer.target->synchronize();
  EXPECT_EQ(0, std::memcmp(pattern(4096, 30).data(), peer.memory.data(), 4096));
}

// ---- parking -----------------------------------------------------------------------------------

TEST(SteppedWorker, an_idle_worker_parks_on_the_channel_and_a_busy_one_does_not) {
  // If this fails, an idle service costs a core polling its queue, or a busy one sleeps with
  // work to do.
  Configuration configuration = loopback("tcp");
  configuration.worker_idle_poll = std::chrono::microseconds(0);  // parks at once (next test)
  Stepped stepped(configuration);
  ASSERT_TRUE(stepped);
  Worker& worker = stepped.worker();
  ASSERT_TRUE(worker.idle());
  EXPECT_EQ(std::chrono::milliseconds(0), worker.park_timeout()) << "idle: until a message";
  const std::size_t before = stepped.shared().channel.parks();
  stepped.shared().channel.wake();  // so the park returns at once
  ASSERT_TRUE(worker.step(true));
  EXPECT_EQ(before + 1, stepped.shared().channel.parks()) << "the idle worker did not park";
  ASSERT_TRUE(worker.step(false));
  EXPECT_EQ(before + 1, stepped.shared().channel.parks()) << "step(false) must never park";

  stepped.submit(to_dead_peer(1));  // queued and refused: work, not idleness
  ASSERT_TRUE(worker.step(true));
  ASSERT_FALSE(worker.idle());
  for (int pass = 0; pass < 10; ++pass) ASSERT_TRUE(worker.step(true));
  EXPECT_EQ(before + 2, stepped.shared().channel.parks())
      << "parked with a transfer queued (only the pass that took it in may park)";
}

TEST(SteppedWorker, an_shm_peer_is_rung_after_each_write_but_only_every_kReadsPerRing_reads) {
  // If this fails, every DMA.SET over shm wakes the client's progress thread for a read that
  // shm already copied inside fi_read (it then polls on the core the server needs), or a
  // client's command queue fills with the fast reads' notices because nothing wakes it to
  // drain them, and posts are refused. A read whose copy does need the peer (no cross-memory
  // attach) is rung after the reap: ctest runs TargetProgress.*shm with FI_SHM_DISABLE_CMA=1.
  Configuration configuration = loopback("shm");
  Stepped stepped(configuration);
  ASSERT_TRUE(stepped);
  Worker& worker = stepped.worker();
  Peer peer(configuration, 4096, 41);
  auto read = [&] {
    TransferRequest request;
    request.client_id = 1;
    request.peer_address = testing::address_of(peer.target->local_address());
    request.regions.push_back(peer.exposed->whole());
    request.direction = Direction::kFromPeer;
    request.length = 4096;
    request.context = std::make_unique<Buffer>();
    return request;
  };
  std::size_t done = 0;
  auto finish = [&](TransferRequest request) {
    stepped.submit(std::move(request));
    ++done;
    ASSERT_TRUE(stepped.step_until([&] { return stepped.collector.count() == done; }));
  };
  // The first post to a peer may be refused while shm connects, and a refusal rings.
  finish(read());
  const auto entry = worker.peers().find(1);
  ASSERT_NE(nullptr, entry);
  const std::uint32_t unrung = entry->progress.unrung_reads;
  ASSERT_GE(unrung, 1u);
  const std::uint64_t rings = worker.peer_rings();
  for (std::uint32_t n = unrung + 1; n < internal::kReadsPerRing; ++n) finish(read());
  EXPECT_EQ(rings, worker.peer_rings()) << "a read that shm copied in fi_read rang the peer";
  EXPECT_EQ(internal::kReadsPerRing - 1, entry->progress.unrung_reads);
  EXPECT_EQ(0u, worker.peer_rings_deferred())
      << "a read was still in flight after its reap (no cross-memory attach here?)";
  finish(read());
  EXPECT_EQ(rings + 1, worker.peer_rings()) << "kReadsPerRing reads did not ring once";
  EXPECT_EQ(0u, entry->progress.unrung_reads);
  finish(peer.write(1, 0, pattern(64, 42)));
  EXPECT_EQ(rings + 2, worker.peer_rings()) << "a write did not ring its peer";
  for (const auto& finished : stepped.collector.wait_for(done, std::chrono::milliseconds(0))) {
    EXPECT_TRUE(finished.outcome) << finished.outcome.error().describe();
  }
}

TEST(SteppedWorker, a_reap_that_frees_room_posts_the_next_queued_transfer_in_the_same_step) {
  // If this fails, the next transfer waits for the callbacks of the last one before it is
  // posted. shm moves a delivery-complete write of up to 4 KiB through one bounce buffer per
  // peer: one at a time, the rest refused with -FI_EAGAIN, and the reap that returns a write's
  // completion is what frees the buffer. Posting only on the next step kept the target idle
  // through every delivery (64 B writes at depth 64: 0.88 of raw libfabric, 0.96 with this).
  // The peer is a bare target endpoint whose progress the test drives, so that each write is
  // copied exactly when the test says.
  Configuration configuration = loopback("shm");
  Stepped stepped(configuration);
  ASSERT_TRUE(stepped);
  Worker& worker = stepped.worker();
  auto opened = internal::Endpoint::open(configuration, internal::Role::kTarget);
  ASSERT_TRUE(opened) << opened.error().describe();
  std::unique_ptr<internal::Endpoint> target = std::move(*opened);
  std::vector<std::byte> memory(128);
  auto exposed = target->register_memory(reinterpret_cast<std::uintptr_t>(memory.data()),
                                         memory.size(), FI_REMOTE_READ | FI_REMOTE_WRITE);
  ASSERT_TRUE(exposed) << exposed.error().describe();
  const auto progress = [&] {
    std::array<fi_cq_entry, 4> entries;
    (void)fi_cq_read(target->completion_queue(), entries.data(), entries.size());
  };
  const auto write = [&](std::uint64_t client, std::size_t offset, std::uint32_t seed) {
    const std::uint64_t remote =
        (target->virtual_addresses() ? reinterpret_cast<std::uint64_t>(memory.data()) : 0) +
        offset;
    return TransferRequest::single(client, testing::address_of(target->local_address()),
                                   (*exposed)->key(), remote, Direction::kToPeer, 64,
                                   std::make_unique<Buffer>(pattern(64, seed), client));
  };
  // The first write settles the connection (shm refuses first contact until the peer's
  // progress has read our request).
  stepped.submit(write(1, 0, 60));
  ASSERT_TRUE(stepped.step_until([&] {
    progress();
    return stepped.collector.count() == 1;
  }));

  stepped.submit(write(1, 0, 61));
  stepped.submit(write(2, 64, 62));
  worker.step(false);
  ASSERT_EQ(1u, worker.in_flight());
  ASSERT_EQ(1u, worker.queued()) << "shm took both writes at once: its bounce buffer is not "
                                    "one per peer any more (docs/PROVIDERS.md, \"shm\")";
  progress();  // the peer copies the first write and answers it
  ASSERT_EQ(0, std::memcmp(pattern(64, 61).data(), memory.data(), 64));

  worker.step(false);
  EXPECT_EQ(2u, stepped.collector.count()) << "the step did not reap the first write";
  EXPECT_EQ(0u, worker.queued()) << "the queued write waited for the next step";
  EXPECT_EQ(1u, worker.in_flight());
  ASSERT_TRUE(stepped.step_until([&] {
    progress();
    return stepped.collector.count() == 3;
  }));
  for (const auto& finished : stepped.collector.wait_for(3, std::chrono::milliseconds(0))) {
    EXPECT_TRUE(finished.outcome) << finished.outcome.error().describe();
  }
  EXPECT_EQ(0, std::memcmp(pattern(64, 62).data(), memory.data() + 64, 64));
  stepped.shut_down();
}

TEST(SteppedWorker, an_idle_worker_polls_on_for_worker_idle_poll_after_work_then_parks) {
  // If this fails, a worker that just ran out of work sleeps at once, and the next transfer
  // (a client's next DMA.GET, typically within ~150 us) waits for a thread to wake; or it
  // never stops polling, and an idle service costs a core; or it polls again after every
  // wake-up that brought no work.
  Configuration configuration = loopback("shm");
  configuration.worker_idle_poll = std::chrono::milliseconds(50);
  Stepped stepped(configuration);
  ASSERT_TRUE(stepped);
  Worker& worker = stepped.worker();
  const std::size_t before = stepped.shared().channel.parks();
  stepped.shared().channel.wake();  // so that the park, when it comes, returns at once
  const auto started = std::chrono::steady_clock::now();
  ASSERT_TRUE(worker.step(true));
  EXPECT_EQ(before, stepped.shared().channel.parks()) << "parked instead of polling on";
  EXPECT_EQ(1u, worker.idle_polls());
  const auto give_up = started + testing::kDeadline;
  while (stepped.shared().channel.parks() == before) {
    ASSERT_LT(std::chrono::steady_clock::now(), give_up) << "the idle worker never parked";
    ASSERT_TRUE(worker.step(true));
  }
  EXPECT_GE(std::chrono::steady_clock::now() - started, configuration.worker_idle_poll)
      << "parked before worker_idle_poll had passed";
  // A wake-up that brings no work does not start another poll.
  const std::uint64_t polls = worker.idle_polls();
  stepped.shared().channel.wake();
  ASSERT_TRUE(worker.step(true));
  EXPECT_EQ(before + 2, stepped.shared().channel.parks());
  EXPECT_EQ(polls, worker.idle_polls());
  // Work does: after a transfer completes the worker polls on again.
  Peer peer(configuration, 8192);
  stepped.submit(peer.write(1, 0, pattern(4096, 31)));
  ASSERT_TRUE(stepped.step_until([&] { return stepped.collector.count() == 1; }));
  ASSERT_TRUE(worker.step(true));
  EXPECT_EQ(before + 2, stepped.shared().channel.parks()) << "parked right after a transfer";
  EXPECT_EQ(polls + 1, worker.idle_polls());
}

TEST(SteppedWorker, a_worker_waiting_on_a_transfer_that_produces_nothing_naps_instead_of_spinning) {
  // If this fails, a worker with one long transfer in flight (16 MiB that the peer copies for
  // milliseconds) spins a whole core through it, or naps while the transfer is still young.
  Configuration configuration = loopback("shm");
  Stepped stepped(configuration);
  ASSERT_TRUE(stepped);
  Overrun overrun;
  stepped.submit(overrun.write(1, 7));
  ASSERT_TRUE(stepped.step_until([&] { return stepped.worker().in_flight() == 1; }));
  ASSERT_FALSE(stepped.worker().idle());
  // The first quiet passes spin (no nap before kSpinBeforeNap of nothing) ...
  for (int pass = 0; pass < 63; ++pass) ASSERT_TRUE(stepped.worker().step(true));
  EXPECT_EQ(0u, stepped.worker().naps()) << "napped before the transfer was quiet for long";
  // ... then, with nothing reaped, the worker naps on the channel (each nap ends by itself).
  const std::size_t parks = stepped.shared().channel.parks();
  const auto give_up = std::chrono::steady_clock::now() + testing::kDeadline;
  while (stepped.worker().naps() == 0) {
    ASSERT_LT(std::chrono::steady_clock::now(), give_up) << "the worker never napped";
    ASSERT_TRUE(stepped.worker().step(true));
  }
  EXPECT_EQ(parks + 1, stepped.shared().channel.parks()) << "a nap is a timed park";
  ASSERT_EQ(0u, stepped.collector.count())
      << "shm completed the overrun write: this test (and CompletionDeadline) need a rewrite";
  EXPECT_EQ(1u, stepped.worker().in_flight());
}

TEST(SteppedWorker, a_worker_holding_only_expired_transfers_parks_and_wakes_to_reap_them) {
  // If this fails, one stuck transfer costs a whole core until shutdown (a spinning worker), or
  // a late completion of it is never reaped (a worker parked for good).
  Configuration configuration = loopback("shm");
  configuration.completion_deadline = std::chrono::milliseconds(100);
  configuration.worker_idle_poll = std::chrono::microseconds(0);
  Stepped stepped(configuration);
  ASSERT_TRUE(stepped);
  Overrun overrun;
  stepped.submit(overrun.write(1, 6));
  ASSERT_TRUE(stepped.step_until([&] { return stepped.worker().in_flight() == 1; }));
  stepped.clock.advance(std::chrono::milliseconds(100));
  stepped.worker().step(false);
  ASSERT_EQ(1u, stepped.worker().held());
  ASSERT_TRUE(stepped.worker().idle());
  EXPECT_EQ(internal::kHeldPollInterval, stepped.worker().park_timeout());
  const std::size_t before = stepped.shared().channel.parks();
  // No wake: the park itself must end, after kHeldPollInterval of real time.
  ASSERT_TRUE(stepped.worker().step(true));
  EXPECT_EQ(before + 1, stepped.shared().channel.parks());
  EXPECT_EQ(1u, stepped.worker().held());
}

TEST(SteppedWorker, a_partial_checksum_batch_goes_to_the_pool_before_the_worker_parks) {
  // If this fails, a checksummed completion reaped alongside held (expired) pieces waits in a
  // partial batch while the worker parks, until an unrelated message or the poll comes.
  // The held-poll interval is the test deadline, so only the flush can end the park: the
  // pool's delivery of the checksummed completion wakes the channel.
  Configuration configuration = loopback("shm");
  configuration.completion_deadline = std::chrono::milliseconds(100);
  configuration.worker_idle_poll = std::chrono::microseconds(0);  // the pass parks at once
  configuration.worker_checksum_max = 0;  // the idle worker would checksum it itself (next test)
  Stepped stepped(configuration,
                  std::chrono::duration_cast<std::chrono::milliseconds>(testing::kDeadline),
                  [](std::span<Completion> batch) {
                    for (Completion& completion : batch) {
                      if (completion.outcome && completion.outcome->checksum) return true;
                    }
                    return false;
                  });
  ASSERT_TRUE(stepped);
  Overrun overrun;
  stepped.submit(overrun.write(1, 7));
  ASSERT_TRUE(stepped.step_until([&] { return stepped.worker().in_flight() == 1; }));
  stepped.clock.advance(std::chrono::milliseconds(100));
  stepped.worker().step(false);
  ASSERT_EQ(1u, stepped.worker().held());

  // A checksummed write to another peer, reaped while the expired one is still held: the
  // completion queue is not dry (something was reaped, something is in flight), so the batch
  // stays partial after that pass.
  Peer peer(loopback("shm"), 4096, 40);
  TransferRequest read;
  read.client_id = 2;
  read.peer_address = testing::address_of(peer.target->local_address());
  read.regions.push_back(peer.exposed->whole());
  read.direction = Direction::kFromPeer;
  read.length = 4096;
  read.want_checksum = true;
  read.context = std::make_unique<Buffer>();
  stepped.submit(std::move(read));
  ASSERT_TRUE(stepped.step_until([&] {
    return stepped.worker().checksums_batched() == 1 || stepped.collector.count() > 0;
  })) << "the second write never completed behind the held one";
  ASSERT_EQ(1u, stepped.worker().checksums_batched());
  ASSERT_TRUE(stepped.worker().idle());
  ASSERT_TRUE(stepped.worker().step(true));
  auto finished = stepped.collector.wait_for(1, std::chrono::milliseconds(0));
  ASSERT_EQ(1u, finished.size()) << "the park ended without the checksummed completion";
  ASSERT_TRUE(finished[0].outcome) << finished[0].outcome.error().describe();
  EXPECT_EQ(crc32c(pattern(4096, 40)), finished[0].outcome->checksum.value());
  EXPECT_EQ(pattern(4096, 40), testing::buffer_of(finished[0].context)->bytes);
}

TEST(SteppedWorker, a_lone_small_checksum_is_computed_on_the_idle_worker_and_others_on_the_pool) {
  // If this fails, either every checksum waits for a pool thread to wake (the hand-off took
  // longer than a 1 MiB checksum on the project's VM), or the worker computes checksums it
  // should hand off: one larger than worker_checksum_max, or one while another transfer waits
  // for it.
  Peer peer(loopback("shm"), 8192, 41);
  const auto read_of = [&](std::uint64_t client, std::size_t offset, std::size_t length) {
    return peer.read(client, offset, length, /*checksum=*/true);
  };
  const auto checksum_of = [&](std::size_t offset, std::size_t length) {
    return crc32c(std::span<const std::byte>(peer.memory.data() + offset, length));
  };
  Configuration configuration = loopback("shm");
  configuration.worker_checksum_max = 4096;
  configuration.max_in_flight = 1;  // a second transfer waits in the queue behind the first
  Stepped stepped(configuration);
  ASSERT_TRUE(stepped);
  const auto step_until_delivered = [&](std::size_t count) {
    EXPECT_TRUE(stepped.step_until([&] { return stepped.collector.count() >= count; }));
    return stepped.collector.wait_for(count, std::chrono::milliseconds(0));
  };

  // Alone, and within the bound: the pass that reaps it delivers it, checksummed, itself.
  stepped.submit(read_of(1, 0, 4096));
  auto alone = step_until_delivered(1);
  ASSERT_EQ(1u, alone.size());
  ASSERT_TRUE(alone[0].outcome) << alone[0].outcome.error().describe();
  EXPECT_EQ(checksum_of(0, 4096), alone[0].outcome->checksum.value());
  EXPECT_EQ(1u, stepped.worker().checksums_here());

  // One byte over the bound: the pool.
  stepped.submit(read_of(1, 0, 4097));
  auto larger = step_until_delivered(1);
  ASSERT_EQ(1u, larger.size());
  ASSERT_TRUE(larger[0].outcome) << larger[0].outcome.error().describe();
  EXPECT_EQ(checksum_of(0, 4097), larger[0].outcome->checksum.value());
  EXPECT_EQ(1u, stepped.worker().checksums_here()) << "a checksum over the bound ran on the worker";

  // Two, the second queued behind the first (one in flight at a time): the first ends while the
  // second waits for the worker, so the pool takes it; the second ends alone.
  stepped.submit(read_of(1, 0, 2048));
  stepped.submit(read_of(2, 2048, 2048));
  auto pair = step_until_delivered(2);
  ASSERT_EQ(2u, pair.size());
  for (const auto& finished : pair) {
    ASSERT_TRUE(finished.outcome) << finished.outcome.error().describe();
    const std::size_t offset = testing::buffer_of(finished.context)->tag == 1 ? 0 : 2048;
    EXPECT_EQ(checksum_of(offset, 2048), finished.outcome->checksum.value());
  }
  EXPECT_EQ(2u, stepped.worker().checksums_here())
      << "the first of two was checksummed on the worker while the second waited for it";
}

TEST(SteppedWorker, a_large_checksummed_read_is_checksummed_piece_by_piece_as_it_lands) {
  // If this fails, a large DMA.SET's checksum waits for the whole value to land and then takes
  // a pass over all of it (a fifth of a 16 MiB DMA.SET over shm), or the pieces' checksums are
  // joined wrong and every large value is refused as corrupt.
  const std::size_t length = 3 * internal::kStreamPiece + 4096 + 5;  // 4 pieces, the last short
  Peer peer(loopback("shm"), length, 42);
  Configuration configuration = loopback("shm");
  Stepped stepped(configuration);
  ASSERT_TRUE(stepped);
  ASSERT_NO_FATAL_FAILURE(read_all_checksummed(stepped, peer));
  EXPECT_EQ(4u, stepped.worker().pieces_streamed());
  EXPECT_EQ(0u, stepped.worker().checksums_here());

  // Two taken in together: the first streams (the worker had nothing else), the second, taken
  // in behind it, is checksummed whole on the pool; both checksums right.
  for (std::uint64_t client : {2, 3}) stepped.submit(peer.read(client, 0, length, /*checksum=*/true));
  ASSERT_TRUE(stepped.step_until([&] { return stepped.collector.count() == 2; }));
  auto both = stepped.collector.wait_for(2, std::chrono::milliseconds(0));
  ASSERT_EQ(2u, both.size());
  for (const auto& each : both) {
    ASSERT_TRUE(each.outcome) << each.outcome.error().describe();
    EXPECT_EQ(crc32c(peer.memory), each.outcome->checksum.value());
  }
  EXPECT_EQ(8u, stepped.worker().pieces_streamed()) << "a transfer queued behind another streamed";

  // The pieces: at least kStreamPiece, at most kMaxStreamPieces of them, none past max_piece.
  EXPECT_EQ(0u, internal::stream_piece_for(internal::kStreamPiece, std::size_t{1} << 30));
  EXPECT_EQ(internal::kStreamPiece,
            internal::stream_piece_for(internal::kStreamPiece + 1, std::size_t{1} << 30));
  EXPECT_EQ(std::size_t{8} << 20,
            internal::stream_piece_for(std::size_t{512} << 20, std::size_t{1} << 30));
  EXPECT_EQ(0u, internal::stream_piece_for(std::size_t{512} << 20, std::size_t{4} << 20))
      << "128 pieces of max_piece: more than kMaxStreamPieces";
}

TEST(SteppedWorker, a_checksummed_read_the_worker_checksums_lands_in_pieces_it_checksums_as_they_land_except_on_shm) {
  // If this fails, a 1 MiB DMA.SET over tcp is read in one piece (one 1 MiB read took twice as
  // long as four of 256 KiB in flight together here) and its checksum is then read back from
  // memory, or the pieces' checksums are joined wrong and such values are refused as corrupt;
  // or shm, which copies a read inside the post on the worker's own thread, is split for no
  // gain (docs/PERFORMANCE.md, "Speed, ninth pass").
  const std::size_t length = 3 * internal::kHerePiece + 1000;  // 4 pieces, the last short
  for (const std::string provider : {"tcp", "shm"}) {
    SCOPED_TRACE(provider);
    Peer peer(loopback(provider), length, 43);
    Configuration configuration = loopback(provider);
    ASSERT_GE(configuration.worker_checksum_max, length);
    Stepped stepped(configuration);
    ASSERT_TRUE(stepped);
    ASSERT_NO_FATAL_FAILURE(read_all_checksummed(stepped, peer));
    EXPECT_EQ(0u, stepped.worker().pieces_streamed()) << "a piece went to the pool";
    if (provider == "shm") {
      EXPECT_EQ(0u, stepped.worker().pieces_here());
      EXPECT_EQ(1u, stepped.worker().checksums_here());
    } else {
      EXPECT_EQ(4u, stepped.worker().pieces_here());
      EXPECT_EQ(0u, stepped.worker().checksums_here());
    }
  }
  // Pieces of kHerePiece, unless that would make more than kMaxStreamPieces.
  EXPECT_EQ(0u, internal::stream_piece_for(internal::kHerePiece, std::size_t{1} << 30,
                                           internal::kHerePiece));
  EXPECT_EQ(internal::kHerePiece, internal::stream_piece_for(internal::kHerePiece + 1,
                                                             std::size_t{1} << 30,
                                                             internal::kHerePiece));
  EXPECT_EQ(std::size_t{1} << 20, internal::stream_piece_for(std::size_t{64} << 20,
                                                             std::size_t{1} << 30,
                                                             internal::kHerePiece));
}

TEST(SteppedWorker, a_streamed_read_that_fails_part_way_is_answered_with_its_error) {
  // If this fails, a large read whose second piece fails is answered as a success (with a
  // checksum of what did land), or a stream whose transfer expires with a piece still in the
  // provider's hands is never closed and its caller never answered.
  // shm reports the failed piece (a read of unmapped memory, -EFAULT inside fi_read) as an
  // error entry without its context, so the piece never comes back: the completion deadline
  // fails the transfer, and the piece is held until the endpoint closes at shutdown.
  const std::size_t piece = internal::kStreamPiece;
  void* mapped = ::mmap(nullptr, 2 * piece, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                        -1, 0);
  ASSERT_NE(MAP_FAILED, mapped);
  auto* bytes = static_cast<std::byte*>(mapped);
  std::memset(bytes, 0x5A, piece);
  ASSERT_EQ(0, ::munmap(bytes + piece, piece));  // the second piece reads unmapped memory
  {
    auto opened = Target::open(loopback("shm"));
    ASSERT_TRUE(opened) << opened.error().describe();
    auto exposed = (*opened)->expose(bytes, 2 * piece);
    ASSERT_TRUE(exposed) << exposed.error().describe();
    Configuration configuration = loopback("shm");
    configuration.completion_deadline = std::chrono::milliseconds(100);
    Stepped stepped(configuration);
    ASSERT_TRUE(stepped);
    TransferRequest read;
    read.client_id = 1;
    read.peer_address = testing::address_of((*opened)->local_address());
    read.regions.push_back(exposed->whole());
    read.direction = Direction::kFromPeer;
    read.length = 2 * piece;
    read.want_checksum = true;
    read.context = std::make_unique<ExpiringBuffer>();
    stepped.submit(std::move(read));
    ASSERT_TRUE(stepped.step_until([&] {
      return stepped.worker().pieces_streamed() == 1 && stepped.worker().in_flight() == 1;
    })) << "the first piece was not checksummed as it landed";
    stepped.clock.advance(std::chrono::milliseconds(100));
    stepped.worker().step(false);
    ASSERT_EQ(1u, stepped.worker().held());
    EXPECT_EQ(0u, stepped.collector.count()) << "answered while the provider still holds a piece";
    stepped.shut_down();
    auto finished = stepped.collector.wait_for(1, std::chrono::milliseconds(0));
    ASSERT_EQ(1u, finished.size());
    ASSERT_FALSE(finished[0].outcome) << "a read of unmapped memory succeeded";
    EXPECT_EQ(ErrorCode::kTimedOut, finished[0].outcome.error().code())
        << finished[0].outcome.error().describe();
    EXPECT_TRUE(static_cast<ExpiringBuffer*>(finished[0].context.get())->expiry.has_value());
  }
  ::munmap(bytes, piece);
}

}  // namespace
}  // namespace dma
