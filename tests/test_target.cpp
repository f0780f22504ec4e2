// dma::Target's progress thread: it polls without pause while a Busy token lives and sleeps
// between polls otherwise. Counted in polls, not CPU time, so a loaded machine cannot make
// these pass or fail.

#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "dma/protocol.hpp"
#include "dma/service.hpp"
#include "dma/target.hpp"
#include "fixtures.hpp"

namespace dma {
namespace {

using testing::loopback;

// Waits (at most the test deadline) until `target` has polled `count` more times than `from`.
bool polled_at_least(const Target& target, std::uint64_t from, std::uint64_t count) {
  const auto deadline = std::chrono::steady_clock::now() + testing::kDeadline;
  while (target.progress_polls() < from + count) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

class TargetProgress : public ::testing::TestWithParam<const char*> {};

TEST_P(TargetProgress, a_busy_token_wakes_the_thread_and_keeps_it_polling_until_dropped) {
  // If this fails, a client waiting for a DMA reply leaves its provider unprogressed for a
  // whole poll interval (the server's write or read waits on it), or an idle client spins.
  Target::Options options;
  options.poll_interval = std::chrono::seconds(10);
  auto target = Target::open(loopback(GetParam()), {}, options);
  ASSERT_TRUE(target) << target.error().describe();
  ASSERT_TRUE(polled_at_least(**target, 0, 1)) << "the progress thread never polled";

  // Idle: asleep for its 10 s interval.
  const std::uint64_t asleep = (*target)->progress_polls();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_LE((*target)->progress_polls(), asleep + 1) << "an idle target polled without sleeping";

  {
    const Target::Busy busy = (*target)->busy();
    const Target::Busy nested = (*target)->busy();
    // Woken at once (not after the 10 s sleep) and polling without pause.
    EXPECT_TRUE(polled_at_least(**target, (*target)->progress_polls(), 1000))
        << "a busy token did not wake the progress thread into polling";
  }
  // Both tokens gone: back to sleep (at most the poll in progress and one more).
  const std::uint64_t dropped = (*target)->progress_polls();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_LE((*target)->progress_polls(), dropped + 2) << "the target kept polling without a token";
}

TEST_P(TargetProgress, callers_get_the_endpoint_while_the_thread_busy_polls) {
  // If this fails, a spinning progress thread keeps expose() (and the Exposed destructors) out
  // of the endpoint lock: a client hangs registering its next buffer.
  Target::Options options;
  options.poll_interval = std::chrono::microseconds(0);  // always spinning
  auto target = Target::open(loopback(GetParam()), {}, options);
  ASSERT_TRUE(target) << target.error().describe();
  std::vector<std::byte> memory(1 << 16);
  const std::uint64_t before = (*target)->progress_polls();
  for (int round = 0; round < 2000; ++round) {
    auto exposed = (*target)->expose(memory.data() + (round % 16) * 4096, 4096);
    ASSERT_TRUE(exposed) << exposed.error().describe();
    (*target)->synchronize();
  }
  EXPECT_TRUE(polled_at_least(**target, before, 1000)) << "the progress thread stopped polling";
  // A moved-from and a default token release nothing twice.
  Target::Busy first = (*target)->busy();
  Target::Busy second = std::move(first);
  Target::Busy third;
  third = std::move(second);
}

TEST_P(TargetProgress, an_idle_target_with_the_default_interval_backs_off_to_a_few_polls_a_second) {
  // If this fails, every idle client burns CPU polling its completion queue every 50 us (15 %
  // of a core on the project VM), taking it from the server and from busy clients.
  auto target = Target::open(loopback(GetParam()));
  ASSERT_TRUE(target) << target.error().describe();
  ASSERT_TRUE(polled_at_least(**target, 0, 1)) << "the progress thread never polled";
  // Long enough for the sleeps to have doubled up to the cap (10 ms) many times over.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const std::uint64_t before = (*target)->progress_polls();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  // At the cap, 500 ms hold about 50 sleeps (one poll each, two on shm); every 50 us would be
  // thousands.
  EXPECT_LE((*target)->progress_polls() - before, 200u) << "an idle target kept polling fast";
  // A Busy token still brings it back at once.
  const Target::Busy busy = (*target)->busy();
  EXPECT_TRUE(polled_at_least(**target, (*target)->progress_polls(), 1000))
      << "a busy token did not wake a backed-off target";
}

TEST_P(TargetProgress, a_target_asleep_for_an_hour_serves_a_write_and_a_read_at_once) {
  // If this fails, a transfer to an idle client waits for the target's next timed poll: every
  // DMA.GET and DMA.SET pays up to a poll interval (10 ms once the target has backed off), or,
  // with a long interval, hangs. On shm the copy runs in the target's progress, and the
  // worker's ring after each post starts it (liveness_mark.hpp, "doorbell"); on tcp and net
  // the provider's own progress thread lands it (FI_PROGRESS_AUTO, docs/PROVIDERS.md).
  Target::Options options;
  options.poll_interval = std::chrono::hours(1);
  auto target = Target::open(loopback(GetParam()), {}, options);
  ASSERT_TRUE(target) << target.error().describe();
  ASSERT_TRUE(polled_at_least(**target, 0, 1)) << "the progress thread never polled";
  std::vector<std::byte> memory(64 * 1024);
  auto exposed = (*target)->expose(memory.data(), memory.size());
  ASSERT_TRUE(exposed) << exposed.error().describe();

  testing::Collector collector;
  auto service = testing::start_service(loopback(GetParam()), collector);
  ASSERT_NE(nullptr, service);
  const std::vector<std::byte> value = testing::pattern(memory.size(), 11);
  ASSERT_TRUE(service->submit(testing::write_into(**target, *exposed, value)));
  // Bounded by the test deadline (a minute), not by the target's hour.
  auto written = collector.wait_for(1);
  ASSERT_EQ(1u, written.size());
  ASSERT_TRUE(written[0].outcome) << written[0].outcome.error().describe();
  (*target)->synchronize();
  EXPECT_EQ(value, memory) << "the write completed but its bytes are not in the target's memory";

  TransferRequest read;
  read.client_id = 1;
  read.peer_address = testing::address_of((*target)->local_address());
  read.regions.push_back(exposed->whole());
  read.direction = Direction::kFromPeer;
  read.length = memory.size();
  read.want_checksum = true;
  read.context = std::make_unique<testing::Buffer>();
  ASSERT_TRUE(service->submit(std::move(read)));
  auto finished = collector.wait_for(1);
  ASSERT_EQ(1u, finished.size());
  ASSERT_TRUE(finished[0].outcome) << finished[0].outcome.error().describe();
  EXPECT_EQ(value, testing::buffer_of(finished[0].context)->bytes);
  EXPECT_EQ(crc32c(value), finished[0].outcome->checksum.value());
}

TEST(TargetDoorbell, a_ring_from_our_own_process_wakes_the_target_without_keeping_it_polling) {
  // If this fails, a Busy token or the destructor cannot wake a target asleep on its doorbell
  // (a client waits a whole poll interval, or ~Target hangs for it), or the target takes its
  // own wake-up for a peer's ring and polls on as if a transfer were coming.
  Target::Options options;
  options.poll_interval = std::chrono::hours(1);
  auto target = Target::open(loopback("shm"), {}, options);
  ASSERT_TRUE(target) << target.error().describe();
  ASSERT_TRUE(polled_at_least(**target, 0, 1)) << "the progress thread never polled";
  {
    const Target::Busy busy = (*target)->busy();
    EXPECT_TRUE(polled_at_least(**target, (*target)->progress_polls(), 1000))
        << "a busy token did not wake a target asleep on its doorbell";
  }
  // Without a peer's ring there is no lingering: back to sleep after at most the poll under
  // way and the one before the sleep.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const std::uint64_t asleep = (*target)->progress_polls();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_LE((*target)->progress_polls(), asleep + 2) << "the target kept polling without a ring";
  target->reset();  // returns only if the destructor's ring woke the hour-long sleep
}

TEST(TargetDoorbell, a_spinning_shm_target_polls_when_rung_and_not_flat_out) {
  // If this fails, a target with a core of its own (a zero poll interval) polls shm flat out
  // again: each poll takes the cache line of the region lock that every post to it needs, and
  // its initiator's 64 B reads ran at 0.82-0.87 of raw libfabric's instead of 1.4. Or it no
  // longer polls when rung, and a write to it waits.
  Target::Options options;
  options.poll_interval = std::chrono::microseconds(0);
  auto target = Target::open(loopback("shm"), {}, options);
  ASSERT_TRUE(target) << target.error().describe();
  ASSERT_TRUE(polled_at_least(**target, 0, 1)) << "the progress thread never polled";
  // Unrung it polls every few microseconds; flat out it polled every ~30 ns here. One poll
  // per microsecond is a bound that no load can break (a slower machine polls less).
  const auto start = std::chrono::steady_clock::now();
  const std::uint64_t before = (*target)->progress_polls();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const std::uint64_t polls = (*target)->progress_polls() - before;
  const auto elapsed = std::chrono::duration_cast<std::chrono::microseconds>(
      std::chrono::steady_clock::now() - start);
  EXPECT_GE(polls, 1u) << "a spinning target stopped polling unrung";
  EXPECT_LE(polls, static_cast<std::uint64_t>(elapsed.count()))
      << "an unrung spinning target polled flat out";

  // A write rung by our service lands (the ring starts the target's copy).
  std::vector<std::byte> memory(4096);
  auto exposed = (*target)->expose(memory.data(), memory.size());
  ASSERT_TRUE(exposed) << exposed.error().describe();
  testing::Collector collector;
  auto service = testing::start_service(loopback("shm"), collector);
  ASSERT_NE(nullptr, service);
  const std::vector<std::byte> value = testing::pattern(memory.size(), 12);
  for (std::uint64_t round = 0; round < 100; ++round) {
    ASSERT_TRUE(service->submit(testing::write_into(**target, *exposed, value)));
    auto done = collector.wait_for(1);  // returns (and takes) what has arrived
    ASSERT_EQ(1u, done.size());
    ASSERT_TRUE(done[0].outcome) << done[0].outcome.error().describe();
  }
  (*target)->synchronize();
  EXPECT_EQ(value, memory);
}

TEST(TargetExpect, an_expected_transfer_its_progress_serves_keeps_it_polling_for_the_window_then_it_sleeps) {
  // If this fails, a client's DMA.GET over shm waits for its target to be woken by the server's
  // write, or its DMA.SET over tcp or net waits for the provider's thread to wake and serve the
  // read (Client::Options::expect_window: the wake-up then overlaps the server's work); or a
  // target told to expect a transfer polls on past the window, or for a transfer its progress
  // does not serve (on tcp and net polling for a write made 1 MiB DMA.GETs slower), costing the
  // client a core.
  struct Case {
    const char* provider;
    Target::Expected served;
    Target::Expected not_served;
  };
  for (const Case& each : {Case{"shm", Target::Expected::kWrite, Target::Expected::kRead},
                           Case{"tcp", Target::Expected::kRead, Target::Expected::kWrite},
                           Case{"net", Target::Expected::kRead, Target::Expected::kWrite}}) {
    SCOPED_TRACE(each.provider);
    Target::Options options;
    options.poll_interval = std::chrono::hours(1);
    auto target = Target::open(loopback(each.provider), {}, options);
    ASSERT_TRUE(target) << target.error().describe();
    ASSERT_TRUE(polled_at_least(**target, 0, 1)) << "the progress thread never polled";
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const std::uint64_t before = (*target)->progress_polls();
    EXPECT_FALSE((*target)->expect(each.not_served, std::chrono::seconds(1)));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_LE((*target)->progress_polls(), before + 2)
        << "the target polled for a transfer its progress does not serve";
    const auto window = std::chrono::seconds(1);
    const auto ends = std::chrono::steady_clock::now() + window;
    EXPECT_TRUE((*target)->expect(each.served, window));
    EXPECT_TRUE(polled_at_least(**target, (*target)->progress_polls(), 1000))
        << "expect() did not wake a sleeping target into polling";
    ASSERT_LT(std::chrono::steady_clock::now(), ends)
        << "the window ended before the polls were seen";
    // Past the window: asleep again (at most the poll under way and the one before the sleep).
    std::this_thread::sleep_until(ends + std::chrono::milliseconds(50));
    const std::uint64_t asleep = (*target)->progress_polls();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_LE((*target)->progress_polls(), asleep + 2) << "the target polled on past the window";
  }
}

INSTANTIATE_TEST_SUITE_P(Providers, TargetProgress, ::testing::Values("tcp", "net", "shm"),
                         [](const auto& param_info) { return param_info.param; });

}  // namespace
}  // namespace dma
