// The closed loop that drives our FabricService in `dma-bench fabric`: keeps `depth` transfers
// submitted by resubmitting from the batch completer, reusing each finished transfer's Operands,
// so a warm window allocates nothing of its own.
//
// Ownership: OursLoop owns the FabricService (and so its worker thread) and the transfers'
// Operands. Thread-safety: run_window() and the accessors are for one driving thread; the
// completer runs on the service's worker and shares only the atomics and the drain handshake.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "dma/configuration.hpp"
#include "dma/protocol.hpp"
#include "dma/service.hpp"
#include "report.hpp"

namespace dma::bench {

// One timed window of ours: the same fields the raw loop takes.
struct OursJob {
  Direction direction = Direction::kToPeer;
  std::byte* local = nullptr;  // slot i is local + i * size
  std::size_t size = 0;
  std::size_t slots = 1;
  std::size_t depth = 1;
  std::uint64_t remote = 0;  // remote slot i is remote + i * size
  std::uint64_t key = 0;
  std::size_t first_slot = 0;
  std::chrono::nanoseconds duration{0};
  std::chrono::milliseconds drain_deadline{10000};
};

struct OursRun {
  std::uint64_t operations = 0;
  std::uint64_t bytes = 0;
  std::uint64_t errors = 0;
  std::uint64_t allocations = 0;  // operator new calls in the window, all threads
  std::uint64_t eagain = 0;       // the service's -FI_EAGAIN count over the window
  double seconds = 0;
  std::size_t next_slot = 0;
  std::optional<std::size_t> last_slot;
  std::optional<Error> first_error;
};

class OursLoop {
 public:
  // Starts a service on `configuration` and adds the target (`peer`) as client 1.
  static Result<std::unique_ptr<OursLoop>> start(const Configuration& configuration,
                                                 std::span<const std::uint8_t> peer,
                                                 std::size_t max_depth);
  ~OursLoop();
  OursLoop(const OursLoop&) = delete;
  OursLoop& operator=(const OursLoop&) = delete;

  // A copy: FabricService::local_address() is one (it changes when the endpoint is replaced).
  std::vector<std::uint8_t> local_address() const { return service_->local_address(); }
  EndpointDescription describe() const { return service_->describe(); }

  // Runs one window; per-transfer latencies inside it go to `samples` (reserved by the caller).
  // The window ends with the first batch of completions at or after job.duration, which it
  // counts (so even a zero duration counts one). Fails if the transfers do not all complete
  // within job.drain_deadline after the window.
  Result<OursRun> run_window(const OursJob& job, LatencySamples& samples);

 private:
  class Slot;
  OursLoop() = default;
  void on_batch(std::span<Completion> batch);
  // Points `operand` at the next slot and submits it. Worker thread (or the driver before the
  // loop starts).
  void submit(std::unique_ptr<Operands> operand, std::size_t slot, bool from_worker);

  // Set by run_window before the first submit, read by the completer.
  OursJob job_;
  LatencySamples* samples_ = nullptr;
  std::size_t next_slot_ = 0;  // worker-owned while running
  std::size_t last_slot_ = 0;  // worker-owned while running
  // The window's end: the completer counts the first batch delivered at or after `deadline_`
  // and closes the window with it, as the raw loop counts the reap that crosses its deadline.
  // Closed at an arbitrary instant instead, a window lost the part of a wave it had paid for:
  // shm copies a read inside fi_read, so 16 MiB reads at depth 64 complete in waves of 64
  // (~100 ms here), and ours ran 4-7 % short of raw at that size for no other reason.
  std::chrono::steady_clock::time_point deadline_;  // set before running_, read after it
  std::atomic<bool> running_{false};
  std::atomic<std::uint64_t> operations_{0};
  std::atomic<std::uint64_t> bytes_{0};
  std::atomic<std::uint64_t> errors_{0};
  // The drain handshake: transfers handed back by the completer once the window has stopped.
  std::mutex mutex_;
  std::condition_variable drained_;
  std::vector<std::unique_ptr<Operands>> spare_;  // capacity reserved for max_depth_
  std::size_t max_depth_ = 0;
  std::optional<Error> first_error_;
  bool closed_ = false;                         // the window has ended (under mutex_)
  std::chrono::steady_clock::time_point ended_;  // when (under mutex_)
  // Declared last so it is destroyed first: its destructor delivers every completion, which
  // touches the members above.
  std::unique_ptr<FabricService> service_;
};

}  // namespace dma::bench
