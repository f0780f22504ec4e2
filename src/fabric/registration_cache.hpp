// Private: the process-wide cache of local memory registrations, grouped by domain.
//
// A registration pins pages when it is taken; it goes stale when those pages are unmapped,
// decommitted or madvise()d away, so whoever reclaims them calls dma::invalidate() first.
// Entries are grouped by domain; invalidate() retires across every domain. The registry is the
// one piece of process-wide mutable state in the library, because pages are process-wide.
//
// Leases: a transfer holds a std::shared_ptr<Registration> (a lease) from post to completion. An
// invalidate() removes the registry's reference at once (nothing new can bind) but the region
// is closed only when the last lease drops, so "free one value while its neighbour's write is on
// the wire" never closes a descriptor that is posted. References are always dropped outside the
// registry lock: closing a region may re-enter an allocator hook that calls invalidate().
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "fabric/fid.hpp"

namespace dma::internal {

// The thread allowed to call into a domain (FI_THREAD_DOMAIN), and how to wake it when a close is
// queued for it. Given when the endpoint is opened, by whoever owns the thread that will use it.
struct DomainOwner {
  // std::thread::id() means any thread: the callers serialise every call themselves (a Target
  // holds its lock around each one), so a close may run wherever the last lease drops.
  std::thread::id thread;
  std::function<void()> wake;  // may be empty; called outside any lock of ours

  // The calling thread owns the domain; `wake` rouses it when another thread queues a close.
  static DomainOwner calling_thread(std::function<void()> wake = {}) {
    return DomainOwner{std::this_thread::get_id(), std::move(wake)};
  }
  static DomainOwner any_thread() { return DomainOwner{}; }
};

// Closes memory regions on the thread that owns their domain. A registration's last lease may
// drop on any thread (an allocator hook calling invalidate(), a CRC pool thread), but under
// FI_THREAD_DOMAIN only the owning thread may touch the domain, so other threads queue the close
// and wake the owner. Thread-safe; the owner is fixed at construction.
class DeferredCloses {
 public:
  explicit DeferredCloses(DomainOwner owner) : owner_(std::move(owner)) {}
  ~DeferredCloses() { drain(); }
  DeferredCloses(const DeferredCloses&) = delete;
  DeferredCloses& operator=(const DeferredCloses&) = delete;

  // Closes now on the owner thread (or on any thread without an owner), else queues and wakes
  // the owner.
  void close(FidPtr<fid_mr> region) noexcept;
  // Closes everything queued. Owner thread only.
  void drain() noexcept;
  bool pending() const noexcept { return pending_.load(std::memory_order_acquire); }

 private:
  const DomainOwner owner_;
  std::mutex mutex_;
  std::vector<FidPtr<fid_mr>> queued_;  // guarded by mutex_
  std::atomic<bool> pending_{false};
};

// A live fi_mr_reg. Its region is closed (through DeferredCloses, on the domain's owner thread)
// when the last holder drops it.
class Registration {
 public:
  Registration(FidPtr<fid_mr> region, std::shared_ptr<DeferredCloses> closes)
      : region_(std::move(region)), closes_(std::move(closes)) {}
  ~Registration() { closes_->close(std::move(region_)); }
  Registration(const Registration&) = delete;
  Registration& operator=(const Registration&) = delete;

  fid_mr* memory_region() const noexcept { return region_.get(); }
  // fi_mr_desc: the local descriptor to pass with an operand (needed under FI_MR_LOCAL).
  void* descriptor() const noexcept { return fi_mr_desc(region_.get()); }
  // fi_mr_key: the key a peer uses to reach this region (remote registrations only).
  std::uint64_t key() const noexcept { return fi_mr_key(region_.get()); }

 private:
  FidPtr<fid_mr> region_;
  std::shared_ptr<DeferredCloses> closes_;
};

using Lease = std::shared_ptr<Registration>;

// The registry. `domain` is the fid_domain's address, used only as a key.
namespace registry {
// Records [base, end) on `domain` so covering() finds it and invalidate() retires it. The
// registry keeps its own lease; a registration previously tracked at the same base is released.
void track(std::uintptr_t base, std::uintptr_t end, std::uintptr_t domain, const Lease& lease);
// A lease on the tracked registration covering [start, end) on `domain`, if any.
Lease covering(std::uintptr_t start, std::uintptr_t end, std::uintptr_t domain);
// Retires every entry on `domain`; an endpoint calls it before closing the domain.
void clear_domain(std::uintptr_t domain);
// How many entries `domain` has (tests, DMA.INFO).
std::size_t size(std::uintptr_t domain);
}  // namespace registry

}  // namespace dma::internal
