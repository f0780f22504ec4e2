// Private: handing finished transfers to their callers, and checksums to the CRC pool.
//
// A completer called once per transfer would cost a call (and usually a lock) per op; one call
// per batch is the contract (service.hpp). Transfers that asked for a checksum must not have it
// computed on the worker (CRC32C of a 16 MiB value would stall every other transfer), so they go
// to the pool in batches of kChecksumBatch; the one exception, a lone small transfer while the
// worker has nothing else to do, the worker decides and checksums before it gets here
// (worker.hpp, step 5). The flush policy prevents the opposite failure: a
// partial batch left behind waits for unrelated traffic, so it goes as soon as the completion
// queue runs dry and always before the worker parks (a parked worker waits for an unrelated
// message). outstanding() drops before the completer runs, so a caller woken by its completion
// never sees its own transfer still counted.
//
// No allocation per transfer: a checksum batch travels to the pool in a ChecksumJob that comes
// back to a free list when the job is done (its vectors keep their capacity), and the job
// posted is one pointer, which std::function stores without allocating.
//
// Ownership: owned by the Worker; pool jobs hold a raw pointer to their ChecksumJob and through
// it to this Delivery and its ServiceShared, valid because the worker waits for
// ServiceShared::jobs to reach zero before it (and the service) can go. An owning one
// could make a pool thread drop the service's last reference, and with it the pool's, and the
// pool would join its own thread. Thread-safety: the worker thread only; jobs run on the pool.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "dma/service.hpp"
#include "worker/service_shared.hpp"

namespace dma::internal {

inline constexpr std::size_t kChecksumBatch = 32;
// Whether a checksum batch of `batched` should go now: full, the queue ran dry, or parking.
bool checksum_flush_due(std::size_t batched, bool queue_dry, bool parking) noexcept;

class Delivery {
 public:
  explicit Delivery(ServiceShared& shared);

  // Queues one finished transfer; with `checksum`, the CRC32C of [data, data + size) is computed
  // on the pool first (`outcome` must then be a success).
  void add(Completion completion) { batch_.push_back(std::move(completion)); }
  void add_checksummed(Completion completion, const std::byte* data, std::size_t size) {
    checksum_batch_.push_back(ChecksumItem{std::move(completion), data, size});
  }
  // Dispatches the checksum batch if checksum_flush_due, then delivers the rest.
  void flush(bool queue_dry, bool parking);

  std::size_t checksums_batched() const noexcept { return checksum_batch_.size(); }

 private:
  struct ChecksumItem {
    Completion completion;
    const std::byte* data;
    std::size_t size;
  };
  struct ChecksumJob {
    Delivery* owner = nullptr;
    std::vector<ChecksumItem> items;
    std::vector<Completion> done;
  };
  void deliver_now();
  void dispatch_checksums();
  static void run_checksums(ChecksumJob* job);

  ServiceShared& shared_;
  std::vector<Completion> batch_;
  std::vector<ChecksumItem> checksum_batch_;
  // Every job ever made, and the idle ones; free_jobs_ is guarded by shared_.jobs_mutex.
  std::vector<std::unique_ptr<ChecksumJob>> jobs_;
  std::vector<ChecksumJob*> free_jobs_;
};

}  // namespace dma::internal
