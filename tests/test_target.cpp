// dma::Target's progress thread: it polls without pause while a Busy token lives and sleeps
// between polls otherwise. Counted in polls, not CPU time, so a loaded machine cannot make
// these pass or fail.

#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

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

INSTANTIATE_TEST_SUITE_P(Providers, TargetProgress, ::testing::Values("tcp", "net", "shm"),
                         [](const auto& param_info) { return param_info.param; });

}  // namespace
}  // namespace dma
