// A small fixed thread pool: runs CRC32C of completed transfers (and their completion batches)
// off the fabric worker. Thread-safe; shared by every service of a ServiceSet.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>

#include "dma/export.hpp"
#include "dma/result.hpp"

namespace dma {

class DMA_EXPORT Pool {
 public:
  // Starts `threads` (>= 1) threads named "dma-crc-NN".
  static Result<std::shared_ptr<Pool>> create(std::size_t threads);
  // Runs every job already posted, then joins.
  ~Pool();
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  // Queues `job` to run on one of the pool's threads. Never blocks on the job.
  void post(std::function<void()> job);
  std::size_t threads() const noexcept;

  struct State;

 private:
  explicit Pool(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace dma
