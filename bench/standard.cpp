#include <CLI/CLI.hpp>

#include "commands.hpp"

namespace dma::bench {
// Stub: issue 5 (helper B) fills this in.
void add_standard_command(CLI::App&, int*) {}
}  // namespace dma::bench
