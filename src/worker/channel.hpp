// Private: the worker's one ordered channel, and the messages it carries.
//
// Transfer, AddPeer, RemovePeer and Register travel in one queue because their order is the
// contract: a RemovePeer must be handled after every transfer its client submitted before it
// (or the client's address-vector entry would go while its transfers still target it), and an
// AddPeer before the transfers that rely on it. Separate queues could not promise that.
//
// The consumer swaps the whole batch out under the lock (capacity is kept, so a warm channel
// does not allocate), and a lock-free flag lets a busy worker skip the lock when nothing is
// queued. A blocking take() parks the worker: an idle worker costs no CPU.
//
// Ownership: shared by the service (producers) and its worker (the one consumer) through
// ServiceShared. Thread-safety: push, close, wake and closed from any thread; take from the
// consumer only.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <variant>
#include <vector>

#include "dma/service.hpp"
#include "worker/one_shot.hpp"

namespace dma::internal {

struct AddPeerMessage {
  std::uint64_t client_id;
  FabricAddress address;
  Answer<Status> reply;
};
struct RemovePeerMessage {
  std::uint64_t client_id;
};
struct RegisterMessage {
  std::uintptr_t base;
  std::size_t length;
  Answer<Status> reply;
};
// The service replaces this worker's endpoint: fail what it holds, take no more transfers.
struct RetireMessage {
  std::string reason;
};
using Message = std::variant<TransferRequest, AddPeerMessage, RemovePeerMessage, RegisterMessage,
                             RetireMessage>;

// Multi-producer, single-consumer queue with close and wake.
class Channel {
 public:
  // Appends unless closed. Returns false (and leaves `message` alone) when closed.
  template <typename M>
  bool push(M&& message) {
    {
      std::lock_guard lock(mutex_);
      if (closed_.load(std::memory_order_relaxed)) return false;
      queue_.emplace_back(std::forward<M>(message));
      pending_.store(true, std::memory_order_release);
    }
    ready_.notify_one();
    return true;
  }
  // Moves everything queued into `out` (which must be empty). With `block`, waits until there is
  // something, a wake(), close(), or (if non-zero) `timeout`. Returns false once closed (and
  // nothing was taken).
  bool take(std::vector<Message>& out, bool block,
            std::chrono::microseconds timeout = std::chrono::microseconds(0));
  void close();
  void wake();
  bool closed() const;
  // Whether anything is queued (lock-free; a hint: a push may land right after).
  bool has_pending() const noexcept { return pending_.load(std::memory_order_acquire); }
  // How many times take() has blocked: a test's proof that an idle worker parks rather than
  // polls (counted on the blocking path only).
  std::size_t parks() const noexcept { return parks_.load(std::memory_order_relaxed); }

 private:
  mutable std::mutex mutex_;
  std::condition_variable ready_;
  std::vector<Message> queue_;
  std::atomic<bool> pending_{false};
  bool woken_ = false;
  // Written under mutex_, also read without it by take()'s lock-free fast path.
  std::atomic<bool> closed_{false};
  std::atomic<std::size_t> parks_{0};
};

}  // namespace dma::internal
