#include "worker/service_shared.hpp"

#include <mutex>
#include <vector>

namespace dma::internal {

ServiceCounters AtomicCounters::snapshot() const {
  ServiceCounters out;
  out.submitted = submitted.load(std::memory_order_relaxed);
  out.completed = completed.load(std::memory_order_relaxed);
  out.failed = failed.load(std::memory_order_relaxed);
  out.bytes_to_peer = bytes_to_peer.load(std::memory_order_relaxed);
  out.bytes_from_peer = bytes_from_peer.load(std::memory_order_relaxed);
  out.eagain = eagain.load(std::memory_order_relaxed);
  out.expired = expired.load(std::memory_order_relaxed);
  out.unattributed_errors = unattributed_errors.load(std::memory_order_relaxed);
  out.replacements = replacements.load(std::memory_order_relaxed);
  out.abandoned = abandoned.load(std::memory_order_relaxed);
  return out;
}

void keep_forever(std::shared_ptr<void> leaked) {
  static std::mutex mutex;
  // Never destroyed, so what it holds stays reachable from a global at exit.
  static auto* kept = new std::vector<std::shared_ptr<void>>();
  std::lock_guard lock(mutex);
  kept->push_back(std::move(leaked));
}

}  // namespace dma::internal
