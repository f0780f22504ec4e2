// Counts heap allocations made through global operator new in dma-bench, so a timed window can
// report allocations per operation (the library's goal is 0 per transfer once warm).
//
// dma-bench replaces the global operator new/delete (allocation_counter.cpp); every thread's
// allocations are counted with one relaxed atomic increment. malloc() called directly (by
// libfabric, for instance) is not counted. Thread-safety: allocation_count() may be read from any
// thread; the figure is exact once the threads being measured are quiescent.
#pragma once

#include <cstdint>

namespace dma::bench {

// Allocations through operator new (all forms) since the process started.
std::uint64_t allocation_count() noexcept;

}  // namespace dma::bench
