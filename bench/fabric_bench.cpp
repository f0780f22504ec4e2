#include "fabric_bench.hpp"

#include <CLI/CLI.hpp>

#include "commands.hpp"

namespace dma::bench {
// Stub: issue 5 (helper A) fills this in.
void add_fabric_commands(CLI::App&, int*) {}
Result<std::vector<Case>> run_fabric(const FabricOptions&, Progress&) {
  return fail(ErrorCode::kInvalidArgument, "dma-bench fabric is not built yet");
}
}  // namespace dma::bench
