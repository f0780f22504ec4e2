// `dma-bench redis`'s command line (redis_bench.hpp has what it runs).
#include <CLI/CLI.hpp>

#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "commands.hpp"
#include "dma/configuration.hpp"
#include "redis_bench.hpp"
#include "support/command_line.hpp"

namespace dma::bench {

void add_redis_command(CLI::App& app, int* status) {
  auto* command = app.add_subcommand(
      "redis", "DMA.GET/DMA.SET through the module against plain GET/SET, verified by CRC32C");
  struct Arguments {
    RedisOptions options;
    double duration_s = 2;
    bool json = false;
    std::string registration = "per-op";
    std::string client_memory = "buffer";
    std::uint64_t memory_check = 0;
    std::uint64_t cpu_check = 0;
  };
  auto arguments = std::make_shared<Arguments>();
  command->add_option("--provider", arguments->options.provider, "tcp, net, shm, ...")
      ->capture_default_str();
  support::add_count_list(*command, "--clients", arguments->options.clients, "client counts");
  support::add_size_list(*command, "--sizes", arguments->options.sizes, "value sizes");
  command->add_option("--ops", arguments->options.ops, "get, set or both (comma-separated)")
      ->delimiter(',')
      ->check(CLI::IsMember({"get", "set"}))
      ->capture_default_str();
  command->add_option("--duration", arguments->duration_s, "seconds per side per case")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  command->add_option("--host", arguments->options.host,
                      "an existing server (default: start redis-server with the module here)");
  command->add_option("--port", arguments->options.port, "its port");
  command->add_flag("--json", arguments->json, "one JSON object per case per line");
  command->add_option("--registration", arguments->registration,
                      "per-op: dma::Client (exposes the buffer per call); once: buffers exposed "
                      "once per case")
      ->capture_default_str()
      ->check(CLI::IsMember({"per-op", "once"}));
  command->add_option("--client-memory", arguments->client_memory,
                      "buffer: the clients' values and GET landings are dma::Buffers (huge "
                      "pages from 1 MiB, include/dma/memory.hpp); heap: std::vectors (malloc)")
      ->capture_default_str()
      ->check(CLI::IsMember({"buffer", "heap"}));
  command->add_option("--inline-max", arguments->options.inline_max,
                      "the module's inline-max and the clients' threshold: values up to it "
                      "travel in the command or reply (0: every value over the fabric; default: "
                      "the module's, " + std::to_string(kDefaultInlineMax) + ")");
  command->add_option("--module-argument", arguments->options.module_arguments,
                      "a module load argument for the server it starts, as NAME VALUE (say "
                      "worker-checksum-max 0; repeatable; README.md, Configuration)")
      ->expected(2)
      ->take_all();
  command->add_option("--expect-window-us", arguments->options.expect_window_us,
                      "how long each client's target polls on after a DMA.GET is sent "
                      "(Client::Options::expect_window; 0: it sleeps until the write rings it; "
                      "default: the Client's)")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1000000}));
  command->add_flag("--busy-poll", arguments->options.busy_poll,
                    "clients' targets poll without sleeping while a DMA command runs (a core "
                    "per waiting client; see Client::Options::busy_poll)");
  command->add_option("--cpu-check", arguments->cpu_check,
                      "instead of the cases: the server's CPU time per DMA.GET of the first "
                      "size, over N GETs (INFO cpu)");
  command->add_option("--memory-check", arguments->memory_check,
                      "instead of the cases: the server's RSS before and after N 4k DMA.GETs");
  command->callback([arguments, status] {
    Arguments& a = *arguments;
    if (!a.options.host.empty() && a.options.port == 0) {
      std::cerr << "dma-bench redis: --host needs --port\n";
      *status = 2;
      return;
    }
    if (a.options.module_arguments.size() % 2 != 0) {
      std::cerr << "dma-bench redis: --module-argument takes a NAME and a VALUE\n";
      *status = 2;
      return;
    }
    if (!a.options.host.empty() && !a.options.module_arguments.empty()) {
      std::cerr << "dma-bench redis: --module-argument configures the server it starts, not "
                   "one at --host\n";
      *status = 2;
      return;
    }
    a.options.duration = std::chrono::milliseconds(static_cast<long>(a.duration_s * 1000));
    a.options.expose_once = a.registration == "once";
    a.options.heap_memory = a.client_memory == "heap";
    if (a.cpu_check > 0 || a.memory_check > 0) {
      Progress progress(1);
      Status checked = a.cpu_check > 0 ? cpu_check(a.options, a.cpu_check, progress)
                                       : memory_check(a.options, a.memory_check, progress);
      if (!checked) {
        std::cerr << "dma-bench redis: " << checked.error().describe() << "\n";
        *status = 1;
      }
      return;
    }
    std::vector<Case> rows;
    {
      Progress progress(a.options.ops.size() * a.options.sizes.size() * a.options.clients.size());
      auto ran = run_redis(a.options, progress);
      if (!ran) {
        progress.note("dma-bench redis: " + ran.error().describe());
        *status = 1;
        return;
      }
      rows = std::move(*ran);
    }
    if (a.json) {
      for (const Case& row : rows) std::printf("%s\n", to_json(row).dump().c_str());
    } else {
      std::printf("%s%smachine: %s\n", to_table(rows).c_str(), cpu_lines(rows, "server").c_str(),
                  describe_machine().c_str());
    }
    std::fflush(stdout);
    for (const Case& row : rows) {
      if (row.ours.mismatches + row.baseline.mismatches + row.ours.errors +
              row.baseline.errors != 0) {
        *status = 1;
      }
    }
  });
}

}  // namespace dma::bench
