// libFuzzer entry for dma::fuzz::module_arguments (fuzz/targets.hpp): run by `make fuzz` over
// fuzz/corpus/module_arguments/; an abort here is an input that breaks an invariant of the parser.
#include <cstddef>
#include <cstdint>

#include "targets.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  dma::fuzz::run_or_abort(&dma::fuzz::module_arguments, data, size);
  return 0;
}
