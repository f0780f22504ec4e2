// libFuzzer entry for dma::fuzz::advertisement (fuzz/targets.hpp): run by `make fuzz` over
// fuzz/corpus/advertisement/; an abort here is an input that breaks an invariant of the parser.
#include <cstddef>
#include <cstdint>

#include "targets.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  dma::fuzz::run_or_abort(&dma::fuzz::advertisement, data, size);
  return 0;
}
