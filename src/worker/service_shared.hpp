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
#include <mutex>

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
  ServiceCounters snapshot() const;
};

struct ServiceShared {
  Channel channel;
  std::atomic<std::size_t> outstanding{0};
  AtomicCounters counters;
  BatchCompleter complete_batch;
  std::shared_ptr<Pool> pool;
  std::mutex jobs_mutex;
  std::condition_variable jobs_done;
  std::size_t jobs = 0;  // pool jobs not yet finished; guarded by jobs_mutex
};

}  // namespace dma::internal
