// `dma-bench fabric-target` (hidden): the child process a `dma-bench fabric` run RMAs into.
// --kind ours runs a dma::Target; --kind raw a raw-libfabric endpoint whose only job is to
// register the buffer and drive progress (fi_cq_read in a loop). Both fill their buffer with the
// pattern of --seed, print their advertisement ("<hex address> <key> <remote address>") as the
// first line on stdout, then answer one line per command on stdin:
//   initiator <hex>        -> "ok" (the initiator's address is now in the target's AV)
//   crc <offset> <length>  -> CRC32C of those buffer bytes, decimal
//   quit (or EOF)          -> exits 0, closing the endpoint cleanly (shm unlinks its region)
// Errors go to stderr with exit status 1.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace dma::bench {

struct TargetOptions {
  std::string kind = "ours";  // ours|raw
  std::string provider = "tcp";
  std::string bind = "127.0.0.1";
  std::size_t bytes = 0;
  std::uint32_t seed = 1;
  // Sleep between progress polls; 0 spins (both kinds; ours on shm polls when rung,
  // docs/PROVIDERS.md, "shm").
  std::chrono::microseconds poll_interval{0};
  int cpu = -1;  // >= 0: the whole process runs on this CPU (dma-bench fabric --pin)
  // > 0: the benchmark's pid; the target dies with it (SIGKILL), stopped or not.
  long parent = 0;
};

// Runs the target until quit/EOF; returns the process exit status.
int run_fabric_target(const TargetOptions& options);

}  // namespace dma::bench
