// dma-bench handoff: what this machine charges for the hand-offs a DMA command is made of, so
// that a goal a design cannot reach here can be told from one the code misses.
//
// A DMA.GET or DMA.SET through the module crosses threads several times (client -> server main
// thread -> fabric worker -> target progress -> worker -> [CRC pool ->] main thread -> client;
// docs/PERFORMANCE.md, "Where a 1 MiB DMA command's time goes"), where a plain GET crosses two.
// Each crossing wakes a sleeping thread. This measures, on one machine in one run:
//   - a wake-up: one thread blocked in FUTEX_WAIT, woken by another's FUTEX_WAKE, ping-ponged;
//     half a round trip is one hand-off (the raw syscalls: std::atomic::wait spins first, and
//     so would measure the spin);
//   - the same with both threads spinning instead of sleeping: the floor (the cache line's trip);
//   - a 50 us timed sleep (the worker's nap and the target's poll), with the default timer slack
//     and with 1 ns.
// Reported as p50 and p90 over the rounds. No figure is judged.
#include <CLI/CLI.hpp>
#include <linux/futex.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "commands.hpp"

namespace dma::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct Quantiles {
  double p50 = 0;
  double p90 = 0;
};

Quantiles quantiles(std::vector<double> samples) {
  if (samples.empty()) return {};
  std::sort(samples.begin(), samples.end());
  return {samples[samples.size() / 2], samples[samples.size() * 9 / 10]};
}

void futex_wait(std::atomic<std::uint32_t>& word, std::uint32_t seen) {
  (void)::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAIT_PRIVATE, seen,
                  nullptr, nullptr, 0);
}
void futex_wake(std::atomic<std::uint32_t>& word) {
  (void)::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAKE_PRIVATE, 1,
                  nullptr, nullptr, 0);
}

// Half of each ping-pong round trip between two threads, in microseconds. `sleep`: each waits
// in FUTEX_WAIT; otherwise both spin on the word.
std::vector<double> ping_pong(std::size_t rounds, bool sleep) {
  static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t));
  std::atomic<std::uint32_t> ball{0};  // odd: the partner's turn; even: ours
  std::thread partner([&] {
    for (std::uint32_t expected = 1; expected < 2 * rounds; expected += 2) {
      std::uint32_t seen = ball.load(std::memory_order_acquire);
      while (seen != expected) {
        if (sleep) futex_wait(ball, seen);
        seen = ball.load(std::memory_order_acquire);
      }
      ball.store(expected + 1, std::memory_order_release);
      if (sleep) futex_wake(ball);
    }
  });
  std::vector<double> halves;
  halves.reserve(rounds);
  for (std::uint32_t serve = 0; serve < 2 * rounds; serve += 2) {
    const auto started = Clock::now();
    ball.store(serve + 1, std::memory_order_release);
    if (sleep) futex_wake(ball);
    std::uint32_t seen = ball.load(std::memory_order_acquire);
    while (seen != serve + 2) {
      if (sleep) futex_wait(ball, seen);
      seen = ball.load(std::memory_order_acquire);
    }
    halves.push_back(std::chrono::duration<double, std::micro>(Clock::now() - started).count() / 2);
  }
  partner.join();
  return halves;
}

// How long a 50 us timed wait really takes, on a thread with `slack_ns` of timer slack
// (0: the kernel's default).
std::vector<double> timed_naps(std::size_t rounds, unsigned long slack_ns) {
  std::vector<double> naps;
  naps.reserve(rounds);
  std::thread napper([&] {
    if (slack_ns != 0) prctl(PR_SET_TIMERSLACK, slack_ns, 0UL, 0UL, 0UL);
    std::mutex mutex;
    std::condition_variable never;
    for (std::size_t round = 0; round < rounds; ++round) {
      const auto started = Clock::now();
      std::unique_lock lock(mutex);
      never.wait_for(lock, std::chrono::microseconds(50), [] { return false; });
      naps.push_back(std::chrono::duration<double, std::micro>(Clock::now() - started).count());
    }
  });
  napper.join();
  return naps;
}

}  // namespace

void add_handoff_command(CLI::App& app, int* status) {
  auto rounds = std::make_shared<std::size_t>(20000);
  CLI::App* handoff = app.add_subcommand(
      "handoff", "what one thread waking another and a 50 us timed sleep cost on this machine");
  handoff->add_option("--rounds", *rounds, "ping-pongs and naps per measurement")
      ->capture_default_str()
      ->check(CLI::Range(std::size_t{100}, std::size_t{10000000}));
  handoff->callback([rounds, status] {
    const Quantiles woken = quantiles(ping_pong(*rounds, true));
    const Quantiles spun = quantiles(ping_pong(*rounds, false));
    const std::size_t naps = std::min<std::size_t>(*rounds, 4000);
    const Quantiles nap_default = quantiles(timed_naps(naps, 0));
    const Quantiles nap_precise = quantiles(timed_naps(naps, 1));
    std::printf("hand-off                                 p50 us   p90 us\n");
    std::printf("wake a thread asleep in FUTEX_WAIT     %8.1f %8.1f\n", woken.p50, woken.p90);
    std::printf("reach a spinning thread                %8.1f %8.1f\n", spun.p50, spun.p90);
    std::printf("50 us timed wait, default timer slack  %8.1f %8.1f\n", nap_default.p50, nap_default.p90);
    std::printf("50 us timed wait, 1 ns timer slack     %8.1f %8.1f\n", nap_precise.p50, nap_precise.p90);
    *status = 0;
  });
}

}  // namespace dma::bench
