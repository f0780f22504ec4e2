// Pinning the calling thread (and the threads it starts afterwards, which inherit it) to one
// CPU, for benchmarks that must give both sides the same cores (dma-bench fabric --pin).
// Thread-safety: affects the calling thread only.
#pragma once

#include "dma/result.hpp"

namespace dma::support {

// sched_setaffinity to `cpu` alone; kInvalidArgument naming the CPU if the kernel refuses
// (no such CPU, or outside the allowed set).
Status pin_to_cpu(int cpu);

}  // namespace dma::support
