#include "support/cpu.hpp"

#include <cerrno>
#include <cstring>
#include <string>

namespace dma::support {

Status pin_to_cpu(int cpu) {
  if (cpu < 0 || cpu >= CPU_SETSIZE) {
    return fail(ErrorCode::kInvalidArgument, "no CPU " + std::to_string(cpu));
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (::sched_setaffinity(0, sizeof(set), &set) != 0) {
    const int error = errno;
    return fail(ErrorCode::kInvalidArgument,
                "cannot pin to CPU " + std::to_string(cpu) + ": " + std::strerror(error));
  }
  return {};
}

Result<ScopedCpuPin> ScopedCpuPin::pin(int cpu) {
  cpu_set_t previous;
  CPU_ZERO(&previous);
  if (::sched_getaffinity(0, sizeof(previous), &previous) != 0) {
    const int error = errno;
    return fail(ErrorCode::kInvalidArgument,
                std::string("cannot read this thread's CPUs: ") + std::strerror(error));
  }
  DMA_TRY(pin_to_cpu(cpu));
  return ScopedCpuPin(previous);
}

ScopedCpuPin::~ScopedCpuPin() {
  if (active_) (void)::sched_setaffinity(0, sizeof(previous_), &previous_);
}

}  // namespace dma::support
