// CRC32C throughput on one core (issue goal: >= 10 GB/s). Bytes/s is reported by Google
// Benchmark as bytes_per_second.
#include <benchmark/benchmark.h>

#include <cstddef>
#include <vector>

#include "dma/protocol.hpp"

namespace {

void crc32c_throughput(benchmark::State& state) {
  std::vector<std::byte> bytes(static_cast<std::size_t>(state.range(0)), std::byte{0x5a});
  for (auto _ : state) {
    benchmark::DoNotOptimize(dma::crc32c(bytes));
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * state.range(0));
}
BENCHMARK(crc32c_throughput)->Arg(64)->Arg(4096)->Arg(1 << 20)->Arg(16 << 20);

}  // namespace
