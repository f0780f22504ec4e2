// `dma-bench fabric`: our FabricService as the initiator in this process against our Target in a
// child process, interleaved case by case with a raw-libfabric baseline (a plain initiator loop
// here, a target process that only drives progress), same provider, sizes, depth and working set.
//
// How ours is driven: a closed loop. `depth` transfers are submitted; the batch completer (on the
// service's worker thread) records each one and submits the next, reusing the finished
// transfer's Operands, so the window measures the service (channel, worker, provider) and not a
// thread hand-off of the benchmark's own. Latency is submit() to the completer, per transfer; the
// raw loop measures post to fi_cq_read the same way. Each case runs ours and raw in alternating
// rounds (ours first, then raw first, ...) so machine noise hits both alike, each verified by
// CRC32C of the last slot it moved.
//
// Thread-safety: run_fabric is not reentrant (one run at a time per process).
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

#include "report.hpp"

namespace dma::bench {

struct FabricOptions {
  std::string provider = "tcp";
  std::string op = "write";  // write|read
  std::vector<std::size_t> sizes{64, 4096, 65536, std::size_t{1} << 20, std::size_t{16} << 20};
  std::vector<std::size_t> depths{1, 64};
  std::chrono::milliseconds duration{2000};  // per side per case
  bool cold = false;  // a working set larger than the caches, cycled through
  std::string bind = "127.0.0.1";  // local address for IP providers (both sides)
  // How long both targets sleep between progress polls; 0 busy-polls (as the ceilings in
  // docs/PROVIDERS.md, "Measured ceilings", were measured).
  std::chrono::microseconds target_poll_interval{0};
  // The target our FabricService runs against: "ours" (dma::Target) or "raw" (the baseline's
  // progress-only target), which isolates the initiator's cost from the target's.
  std::string ours_target = "ours";
  // Pins the initiators (this process: our worker, the raw loop) to CPU 0 and both targets to
  // CPU 1, so that each side runs the same threads on the same cores whatever the scheduler
  // would do: on two cores four busy threads otherwise measure who got the CPU.
  bool pin = false;
};

// Runs every (size, depth) case, ours and raw interleaved; progress on `progress`.
Result<std::vector<Case>> run_fabric(const FabricOptions& options, Progress& progress);

// run_fabric's cases plus the initiator's resident set size around our windows.
struct FabricRun {
  std::vector<Case> cases;
  std::size_t rss_before_bytes = 0;  // before our first window
  std::size_t rss_after_bytes = 0;   // after our last window
};
Result<FabricRun> run_fabric_detailed(const FabricOptions& options, Progress& progress);

}  // namespace dma::bench
