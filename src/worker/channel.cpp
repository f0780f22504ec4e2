#include "worker/channel.hpp"

namespace dma::internal {

bool Channel::take(std::vector<Message>& out, bool block, std::chrono::microseconds timeout) {
  if (!block) {
    // closed_ first: every push made before the close is then visible in pending_. Read the
    // other way round, pushes and the close could both land between the two loads, and the
    // worker, told "closed" with messages still queued, exited without them: their completions
    // were never delivered (996 of 1000 in one Races.dropping_a_service_* run).
    const bool closed = closed_.load(std::memory_order_acquire);
    if (!pending_.load(std::memory_order_acquire)) return !closed;
  }
  std::unique_lock lock(mutex_);
  if (block) {
    parks_.fetch_add(1, std::memory_order_relaxed);
    const auto ready = [&] {
      return !queue_.empty() || woken_ || closed_.load(std::memory_order_relaxed);
    };
    if (timeout.count() > 0) {
      ready_.wait_for(lock, timeout, ready);
    } else {
      ready_.wait(lock, ready);
    }
  }
  woken_ = false;
  out.swap(queue_);
  pending_.store(false, std::memory_order_release);
  return !closed_.load(std::memory_order_relaxed) || !out.empty();
}

void Channel::close() {
  {
    std::lock_guard lock(mutex_);
    closed_.store(true, std::memory_order_release);
  }
  ready_.notify_all();
}

void Channel::wake() {
  {
    std::lock_guard lock(mutex_);
    woken_ = true;
  }
  ready_.notify_all();
}

bool Channel::closed() const { return closed_.load(std::memory_order_acquire); }

}  // namespace dma::internal
