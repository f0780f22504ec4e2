// Private: the clock the worker reads its deadlines from.
//
// The worker decides three things by time: when a peer answering -FI_EAGAIN has passed the
// progress deadline, when a posted transfer has passed the completion deadline, and how old an
// answer to "has the shm peer's process exited?" may be. Read straight from steady_clock, those
// decisions could be tested only by sleeping through the deadlines (seconds of real time per
// test, and flaky on a loaded machine). A WorkerClock is the real steady clock unless it was
// made over a ManualClock, whose time only the test moves.
//
// Cost: now() is one well-predicted branch in front of steady_clock::now(); no virtual call.
// Ownership: a WorkerClock does not own its ManualClock, which must outlive the worker.
// Thread-safety: a ManualClock is read and moved by the thread that steps the worker only.
#pragma once

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
    return manual_ == nullptr ? std::chrono::steady_clock::now() : manual_->now();
  }

 private:
  const ManualClock* manual_ = nullptr;
};

}  // namespace dma::internal
