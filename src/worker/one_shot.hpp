// Private: a one-shot answer from the worker to a blocked caller.
//
// The worker holds the Answer, the caller the Waiter. If the Answer is destroyed without being
// sent (the worker died, or dropped the message unanswered while shutting down), the waiter wakes
// with nothing instead of hanging. Thread-safe between the two sides.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>

namespace dma::internal {

template <typename T>
class OneShotState {
 public:
  void set(std::optional<T> value) {
    {
      std::lock_guard lock(mutex_);
      if (done_) return;
      value_ = std::move(value);
      done_ = true;
    }
    ready_.notify_all();
  }
  // nullopt: the sender went away without answering.
  std::optional<T> wait() {
    std::unique_lock lock(mutex_);
    ++blocked_;
    ready_.wait(lock, [&] { return done_; });
    --blocked_;
    return std::move(value_);
  }
  // How many threads are inside wait(), for a test that must answer a waiter already blocked.
  std::size_t blocked() {
    std::lock_guard lock(mutex_);
    return blocked_;
  }
  // nullopt if the sender went away or `timeout` passed; `timed_out` tells which.
  std::optional<T> wait_for(std::chrono::milliseconds timeout, bool& timed_out) {
    std::unique_lock lock(mutex_);
    timed_out = !ready_.wait_for(lock, timeout, [&] { return done_; });
    if (timed_out) return std::nullopt;
    return std::move(value_);
  }

 private:
  std::mutex mutex_;
  std::condition_variable ready_;
  std::optional<T> value_;
  bool done_ = false;
  std::size_t blocked_ = 0;
};

// The sending half. Move-only; sends nothing (waking the waiter empty-handed) if destroyed
// unanswered.
template <typename T>
class Answer {
 public:
  explicit Answer(std::shared_ptr<OneShotState<T>> state) : state_(std::move(state)) {}
  Answer(Answer&&) noexcept = default;
  Answer& operator=(Answer&& other) noexcept {
    if (this != &other) {
      abandon();
      state_ = std::move(other.state_);
    }
    return *this;
  }
  Answer(const Answer&) = delete;
  Answer& operator=(const Answer&) = delete;
  ~Answer() { abandon(); }

  void send(T value) {
    if (state_) state_->set(std::move(value));
    state_.reset();
  }

 private:
  void abandon() {
    if (state_) state_->set(std::nullopt);
    state_.reset();
  }
  std::shared_ptr<OneShotState<T>> state_;
};

template <typename T>
class Waiter {
 public:
  explicit Waiter(std::shared_ptr<OneShotState<T>> state) : state_(std::move(state)) {}
  std::optional<T> wait() { return state_->wait(); }
  std::optional<T> wait_for(std::chrono::milliseconds timeout, bool& timed_out) {
    return state_->wait_for(timeout, timed_out);
  }
  // Whether a thread is blocked in wait() (tests).
  bool blocked() const { return state_->blocked() != 0; }

 private:
  std::shared_ptr<OneShotState<T>> state_;
};

template <typename T>
std::pair<Answer<T>, Waiter<T>> one_shot() {
  auto state = std::make_shared<OneShotState<T>>();
  return {Answer<T>(state), Waiter<T>(state)};
}

}  // namespace dma::internal
