// dma-bench: the library measured against its baselines in the same run (raw libfabric on the
// same provider; Redis's own GET/SET). See `dma-bench --help` and docs/PERFORMANCE.md.
#include <CLI/CLI.hpp>

#include "commands.hpp"

int main(int argc, char** argv) {
  CLI::App app{"dma-bench: dma-libfabric against raw libfabric and against Redis, in one run"};
  app.require_subcommand(1);
  int status = 0;
  dma::bench::add_fabric_commands(app, &status);
  dma::bench::add_redis_command(app, &status);
  dma::bench::add_standard_command(app, &status);
  dma::bench::add_handoff_command(app, &status);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error);
  }
  return status;
}
