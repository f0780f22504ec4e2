#include "redis_bench.hpp"

#include <CLI/CLI.hpp>

#include "commands.hpp"

namespace dma::bench {
// Stub: issue 5 (helper B) fills this in.
void add_redis_command(CLI::App&, int*) {}
Result<std::vector<Case>> run_redis(const RedisOptions&, Progress&) {
  return fail(ErrorCode::kInvalidArgument, "dma-bench redis is not built yet");
}
}  // namespace dma::bench
