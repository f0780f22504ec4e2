// Private: what a FabricService, its worker and the worker's CRC pool jobs share.
//
// The service's callers, the worker thread and the pool threads each outlive one another in a
// different order, so what they share lives in one object all of them hold: the channel, the
// outstanding count (the load signal, dropped before a completion is delivered so a caller woken
// by its completion never sees its own transfer counted), the counters, the batch completer, the
// pool, and the count of pool jobs still running. The worker waits for that count to reach zero
// before it closes the endpoint, so every completion is delivered before the service's
// destructor returns.
//
// Ownership: shared_ptr, held by the service and the worker; pool jobs hold a raw pointer (see
// Delivery). Thread-safety: the atomics and the channel from any thread; jobs under jobs_mutex.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <functional>
#include <mutex>
#include <string>

#include "dma/pool.hpp"
#include "dma/service.hpp"
#include "worker/channel.hpp"

namespace dma::internal {

// Counters shared between the worker and readers (relaxed: approximate while running).
struct AtomicCounters {
  std::atomic<std::uint64_t> submitted{0};
  std::atomic<std::uint64_t> completed{0};
  std::atomic<std::uint64_t> failed{0};
  std::atomic<std::uint64_t> bytes_to_peer{0};
  std::atomic<std::uint64_t> bytes_from_peer{0};
  std::atomic<std::uint64_t> eagain{0};
  std::atomic<std::uint64_t> expired{0};
  std::atomic<std::uint64_t> unattributed_errors{0};
  std::atomic<std::uint64_t> replacements{0};
  std::atomic<std::uint64_t> abandoned{0};
  ServiceCounters snapshot() const;
};

// What every endpoint a service has had adds to: the load signal and the counters outlive a
// replaced endpoint's worker, so a service's figures do not drop when its endpoint is replaced.
struct ServiceTotals {
  std::atomic<std::size_t> outstanding{0};
  AtomicCounters counters;
};

// Lets a watchdog take a worker's table from it while the worker is inside a libfabric call that
// may never return (shm's post to a dead peer's region spins on a lock in it). The worker holds
// the gate while it runs its loop and lends it out around such calls: enter() before the call,
// leave() after. A watchdog that finds the worker lent out and unchanged for the stuck deadline
// claim()s it: from then on it owns the worker's table (answers the callers of every transfer in
// it) until release(); a worker whose leave() finds the gate claimed waits for the release and
// then knows it has been abandoned. Cost to the worker: one store and one compare-exchange per
// call.
class Gate {
 public:
  void enter() noexcept { state_.store(kInCall, std::memory_order_release); }
  // False if the gate was claimed while the worker was in the call (it returns once released).
  bool leave() noexcept {
    int expected = kInCall;
    if (state_.compare_exchange_strong(expected, kRunning, std::memory_order_acq_rel)) return true;
    while (state_.load(std::memory_order_acquire) != kReleased) {
      state_.wait(kClaimed, std::memory_order_acquire);
    }
    return false;
  }
  bool claim() noexcept {
    int expected = kInCall;
    return state_.compare_exchange_strong(expected, kClaimed, std::memory_order_acq_rel);
  }
  void release() noexcept {
    state_.store(kReleased, std::memory_order_release);
    state_.notify_all();
  }
  bool in_call() const noexcept { return state_.load(std::memory_order_acquire) == kInCall; }

 private:
  static constexpr int kRunning = 0, kInCall = 1, kClaimed = 2, kReleased = 3;
  std::atomic<int> state_{kRunning};
};

struct ServiceShared {
  explicit ServiceShared(std::shared_ptr<ServiceTotals> shared_totals =
                             std::make_shared<ServiceTotals>())
      : totals(std::move(shared_totals)),
        outstanding(totals->outstanding),
        counters(totals->counters) {}
  ServiceShared(const ServiceShared&) = delete;
  ServiceShared& operator=(const ServiceShared&) = delete;

  std::shared_ptr<ServiceTotals> totals;
  Channel channel;
  std::atomic<std::size_t>& outstanding;
  AtomicCounters& counters;
  BatchCompleter complete_batch;
  std::shared_ptr<Pool> pool;
  std::mutex jobs_mutex;
  std::condition_variable jobs_done;
  std::size_t jobs = 0;  // pool jobs not yet finished; guarded by jobs_mutex

  // Health, read by the service's watchdog. `turns` counts the worker's passes, `parked` is set
  // while it waits on the channel with nothing live in flight (not turning is then no sign of
  // trouble); `gate` is above.
  std::atomic<std::uint64_t> turns{0};
  std::atomic<bool> parked{false};
  Gate gate;
  // Called once, on the worker thread, when the worker finds its endpoint unusable and retires
  // it (Worker::retire): the service opens a new endpoint. Set before the worker starts.
  std::function<void(const std::string& reason)> on_retired;
  // Set by a bounded shutdown before it closes the channel: the steady clock's count (ns) after
  // which a closing worker fails what is still live rather than wait for it (0: wait).
  std::atomic<std::int64_t> drain_until_ns{0};
  // Set by a shutdown that left this worker behind (stuck inside the provider past its bound):
  // the service, its completer and its callers' state may be gone by the time the worker comes
  // back, so it then stops at once, delivers nothing and frees nothing (Worker::step, Delivery,
  // keep_forever below).
  std::atomic<bool> orphaned{false};
};

// Keeps `leaked` reachable for the rest of the process: what an orphaned worker leaves behind on
// purpose (its Worker, the contexts it never delivered) is never freed, since the provider may
// still reference it, and a leak checker should not report it as lost.
void keep_forever(std::shared_ptr<void> leaked);

}  // namespace dma::internal
