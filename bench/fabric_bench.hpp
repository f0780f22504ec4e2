// `dma-bench fabric`: our FabricService as the initiator in this process against our Target in a
// child process, interleaved case by case with a raw-libfabric baseline (a plain initiator loop
// here, a target process that only drives progress), same provider, sizes, depth and working set.
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
};

// Runs every (size, depth) case, ours and raw interleaved; progress on `progress`.
Result<std::vector<Case>> run_fabric(const FabricOptions& options, Progress& progress);

}  // namespace dma::bench
