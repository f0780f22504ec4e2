// dma-bench's subcommands. Each add_* registers one subcommand on `app`; its callback runs the
// mode and stores the process exit status in *status (0 success, 1 a failure or a mismatch,
// 2 bad arguments).
#pragma once

namespace CLI {
class App;
}

namespace dma::bench {

void add_fabric_commands(CLI::App& app, int* status);    // fabric_bench.cpp: `fabric` (+ hidden helpers)
void add_redis_command(CLI::App& app, int* status);      // redis_command.cpp: `redis`
void add_standard_command(CLI::App& app, int* status);   // standard.cpp: `standard`
void add_handoff_command(CLI::App& app, int* status);    // handoff.cpp: `handoff`

}  // namespace dma::bench
