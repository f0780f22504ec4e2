// Private: the clock the worker reads its deadlines from.
//
// The worker decides three things by time: when a peer answering -FI_EAGAIN has passed the
// progress deadline, when a posted transfer has passed the completion deadline, and how old an
// answer to "has the shm peer's process exited?" may be. Read straight from steady_clock, those
// decisions could be tested only by sleeping through the deadlines (seconds of real time per
// test, and flaky on a loaded machine). A WorkerClock is the real steady clock unless it was
// made over a ManualClock, whose time only the test moves.
//
// The real clock is CLOCK_MONOTONIC_COARSE: the same clock as steady_clock (its time_points
// compare with steady_clock's), read from the vDSO without the TSC, at the kernel tick's
// resolution (1-4 ms). The busy loop reads it every pass while transfers are in flight and on
// every -FI_EAGAIN; steady_clock::now() there was 8.8 % of a redis-server's samples in a perf
// profile taken during DMA.GETs (issue 10). Deadlines are whole milliseconds and checked at a tenth of their
// length, so a tick of lateness is within what they promise.
// Cost: now() is one well-predicted branch in front of one clock_gettime; no virtual call.
// Ownership: a WorkerClock does not own its ManualClock, which must outlive the worker.
// Thread-safety: a ManualClock is read and moved by the thread that steps the worker only.
#pragma once

#include <time.h>

#include <chrono>

namespace dma::internal {

class ManualClock {
 public:
  using time_point = std::chrono::steady_clock::time_point;
  using duration = std::chrono::steady_clock::duration;
  // Starts at a fixed, non-zero instant, so "never" (time_point{}) stays distinguishable.
  ManualClock() : now_(std::chrono::hours(1)) {}
  time_point now() const noexcept { return now_; }
  void advance(duration by) noexcept { now_ += by; }

 private:
  time_point now_;
};

class WorkerClock {
 public:
  using time_point = std::chrono::steady_clock::time_point;
  WorkerClock() = default;  // the real steady clock
  explicit WorkerClock(const ManualClock& manual) : manual_(&manual) {}
  time_point now() const noexcept {
    if (manual_ != nullptr) return manual_->now();
    timespec now{};
    ::clock_gettime(CLOCK_MONOTONIC_COARSE, &now);
    return time_point(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::seconds(now.tv_sec) + std::chrono::nanoseconds(now.tv_nsec)));
  }

 private:
  const ManualClock* manual_ = nullptr;
};

}  // namespace dma::internal
