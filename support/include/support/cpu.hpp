// Pinning the calling thread (and the threads it starts meanwhile, which inherit it) to one CPU,
// for benchmarks that must give both sides the same cores (dma-bench fabric --pin).
// Thread-safety: affects the calling thread only.
#pragma once

#include <sched.h>

#include "dma/result.hpp"

namespace dma::support {

// sched_setaffinity to `cpu` alone, for good (a child process pins itself so before it starts
// any thread); kInvalidArgument naming the CPU if the kernel refuses (no such CPU, or outside
// the allowed set).
Status pin_to_cpu(int cpu);

// The calling thread on `cpu` until this is destroyed, then back on the CPUs it had: what runs
// after (dma-bench standard's Redis rows, a redis-server it starts) must not inherit the pin.
// Destroy it on the thread that made it.
class ScopedCpuPin {
 public:
  static Result<ScopedCpuPin> pin(int cpu);
  ScopedCpuPin(ScopedCpuPin&& other) noexcept : previous_(other.previous_), active_(other.active_) {
    other.active_ = false;
  }
  ScopedCpuPin& operator=(ScopedCpuPin&&) = delete;
  ~ScopedCpuPin();

 private:
  explicit ScopedCpuPin(const cpu_set_t& previous) : previous_(previous), active_(true) {}
  cpu_set_t previous_;
  bool active_;
};

}  // namespace dma::support
