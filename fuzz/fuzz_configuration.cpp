// libFuzzer entry for dma::fuzz::configuration (fuzz/targets.hpp): run by `make fuzz` over
// fuzz/corpus/configuration/; an abort here is an input that breaks an invariant of the parser.
#include <cstddef>
#include <cstdint>

#include "targets.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  dma::fuzz::run_or_abort(&dma::fuzz::configuration, data, size);
  return 0;
}
