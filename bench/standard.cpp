// `dma-bench standard`: the fixed matrix `make bench` runs, so figures in docs/PERFORMANCE.md
// are reproducible by one command:
//   fabric: tcp, net, shm x write, read x 64, 4k, 64k, 1m, 16m x depth 1, 64 (run_fabric)
//   redis:  tcp, shm x get, set x 4k, 1m, 16m x 1, 4 clients (run_redis)
// Prints the table; with --update FILE rewrites the part of FILE between `<!-- bench:begin -->`
// and `<!-- bench:end -->` with Markdown tables, the date, the machine and the exact command.
// A part that fails (a provider missing here) is reported and skipped; the exit status is then 1,
// as it is for any error or mismatch in the rows.

#include <CLI/CLI.hpp>

#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "commands.hpp"
#include "fabric_bench.hpp"
#include "redis_bench.hpp"
#include "report.hpp"

namespace dma::bench {
namespace {

constexpr std::string_view kBegin = "<!-- bench:begin -->";
constexpr std::string_view kEnd = "<!-- bench:end -->";

const std::vector<std::string> kFabricProviders{"tcp", "net", "shm"};
const std::vector<std::string> kFabricOps{"write", "read"};
const std::vector<std::string> kRedisProviders{"tcp", "shm"};

std::string today() {
  const std::time_t now = std::time(nullptr);
  char text[32];
  std::tm local{};
  localtime_r(&now, &local);
  std::strftime(text, sizeof text, "%Y-%m-%d %H:%M", &local);
  return text;
}

// The 1-minute load average (/proc/loadavg), so a reader can tell an idle run from a busy one.
std::string load_average() {
  std::ifstream loadavg("/proc/loadavg");
  std::string one_minute;
  loadavg >> one_minute;
  return one_minute.empty() ? "unknown" : one_minute;
}

// Replaces what lies between the markers in `path` with `section`. Fails, changing nothing, if
// the file or either marker is missing.
Status update_file(const std::string& path, const std::string& section) {
  std::ifstream in(path);
  if (!in) return fail(ErrorCode::kNotFound, "cannot read " + path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();
  const auto begin = text.find(kBegin);
  const auto end = text.find(kEnd);
  if (begin == std::string::npos || end == std::string::npos || end < begin) {
    return fail(ErrorCode::kInvalidArgument, path + " has no " + std::string(kBegin) + " ... " +
                                                 std::string(kEnd) + " section");
  }
  const std::string updated = text.substr(0, begin + kBegin.size()) + "\n" + section +
                              text.substr(end);
  const std::string temporary = path + ".tmp";
  {
    std::ofstream out(temporary, std::ios::trunc);
    out << updated;
    if (!out.flush()) return fail(ErrorCode::kResourceExhausted, "cannot write " + temporary);
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    return fail(ErrorCode::kResourceExhausted, "cannot replace " + path);
  }
  return {};
}

bool clean(const std::vector<Case>& rows) {
  for (const Case& row : rows) {
    if (row.ours.errors + row.ours.mismatches + row.baseline.errors + row.baseline.mismatches) {
      return false;
    }
  }
  return true;
}

}  // namespace

void add_standard_command(CLI::App& app, int* status) {
  auto* command = app.add_subcommand(
      "standard", "the standard fabric and redis matrix (what `make bench` runs)");
  struct Arguments {
    std::string update;
    double duration_s = 1;
    std::string parts = "fabric,redis";
  };
  auto arguments = std::make_shared<Arguments>();
  command->add_option("--update", arguments->update,
                      "rewrite the <!-- bench:begin/end --> section of this Markdown file");
  command->add_option("--duration", arguments->duration_s, "seconds per side per case")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  command->add_option("--parts", arguments->parts, "fabric,redis (either or both)")
      ->capture_default_str()
      ->check([](const std::string& value) {
        return value == "fabric" || value == "redis" || value == "fabric,redis" ||
                       value == "redis,fabric"
                   ? std::string()
                   : std::string("--parts is fabric, redis or fabric,redis");
      });
  command->callback([arguments, status] {
    Arguments& a = *arguments;
    const std::string load_before = load_average();
    const auto duration = std::chrono::milliseconds(static_cast<long>(a.duration_s * 1000));
    const bool fabric = a.parts.find("fabric") != std::string::npos;
    const bool redis = a.parts.find("redis") != std::string::npos;

    const FabricOptions fabric_defaults;
    const RedisOptions redis_defaults;
    std::size_t total = 0;
    if (fabric) {
      total += kFabricProviders.size() * kFabricOps.size() * fabric_defaults.sizes.size() *
               fabric_defaults.depths.size();
    }
    if (redis) total += kRedisProviders.size() * 2 * redis_defaults.sizes.size() * 2;

    std::vector<Case> fabric_rows;
    std::vector<Case> redis_rows;
    std::vector<std::string> failures;
    {
      Progress progress(total);
      if (fabric) {
        for (const std::string& provider : kFabricProviders) {
          for (const std::string& op : kFabricOps) {
            FabricOptions options;
            options.provider = provider;
            options.op = op;
            options.duration = duration;
            // Both sides on the same cores (initiators on CPU 0, targets on CPU 1): unpinned,
            // four busy threads on two cores measured the scheduler (docs/PERFORMANCE.md).
            options.pin = std::thread::hardware_concurrency() >= 2;
            auto rows = run_fabric(options, progress);
            if (!rows) {
              failures.push_back("fabric " + provider + " " + op + ": " + rows.error().describe());
              progress.note("dma-bench standard: " + failures.back());
              continue;
            }
            fabric_rows.insert(fabric_rows.end(), rows->begin(), rows->end());
          }
        }
      }
      if (redis) {
        for (const std::string& provider : kRedisProviders) {
          RedisOptions options;
          options.provider = provider;
          options.clients = {1, 4};
          options.ops = {"get", "set"};
          options.duration = duration;
          auto rows = run_redis(options, progress);
          if (!rows) {
            failures.push_back("redis " + provider + ": " + rows.error().describe());
            progress.note("dma-bench standard: " + failures.back());
            continue;
          }
          redis_rows.insert(redis_rows.end(), rows->begin(), rows->end());
        }
      }
    }
    std::vector<Case> all = fabric_rows;
    all.insert(all.end(), redis_rows.begin(), redis_rows.end());
    std::printf("%smachine: %s\n", to_table(all).c_str(), describe_machine().c_str());
    std::fflush(stdout);
    if (!failures.empty() || !clean(all)) *status = 1;

    if (a.update.empty()) return;
    std::ostringstream exact_command;
    exact_command << "dma-bench standard --duration " << a.duration_s << " --parts " << a.parts
                  << " --update " << a.update;
    const std::string exact = exact_command.str();
    std::ostringstream section;
    section << "Measured " << today() << " on " << describe_machine() << ", by `" << exact
            << "` (`make bench`). " << a.duration_s
            << " s per side per case, the two sides alternating in at least five rounds (in the "
               "fabric rows the other side's target frozen meanwhile). Load average before the "
               "run: "
            << load_before
            << ". Ratio: the median of the rounds' ours / baseline, in GB/s from 64 KiB up, in "
               "ops/s below, with the lowest and highest round in brackets; * marks rounds "
               "spread more than 20 % of the median.\n";
    if (!failures.empty()) {
      section << "\nNot measured in this run:\n";
      for (const std::string& failure : failures) section << "- " << failure << "\n";
    }
    if (redis) {
      section << "\n### Redis: DMA.GET/DMA.SET against GET/SET\n\n"
              << "Command: `dma-bench redis --provider P --clients 1,4 --sizes 4k,1m,16m "
                 "--ops get,set --duration "
              << a.duration_s << "` for P in tcp, shm (redis-server 7 with the module, loopback).\n\n"
              << to_markdown(redis_rows);
      if (const std::string cpu = cpu_markdown(redis_rows, "server"); !cpu.empty()) {
        section << "\nCPU per completed operation, us, in the same windows (user + system, every "
                   "thread): the server's (INFO cpu), and the clients' (this benchmark's process, "
                   "dma::Client's progress threads included).\n\n"
                << cpu;
      }
    }
    if (fabric) {
      section << "\n### Fabric: FabricService against raw libfabric\n\n"
              << "Command: `dma-bench fabric --provider P --op O --sizes 64,4k,64k,1m,16m "
                 "--depth 1,64 --duration "
              << a.duration_s << (std::thread::hardware_concurrency() >= 2 ? " --pin" : "")
              << "` for P in tcp, net, shm and O in write, read.\n\n"
              << to_markdown(fabric_rows);
      if (const std::string cpu = cpu_markdown(fabric_rows, "initiator"); !cpu.empty()) {
        section << "\nCPU per completed operation, us, in the same windows (user + system, every "
                   "thread of the initiator's process; the targets run in processes of their "
                   "own).\n\n"
                << cpu;
      }
    }
    section << "\n";
    if (Status updated = update_file(a.update, section.str()); !updated) {
      std::cerr << "dma-bench standard: " << updated.error().describe() << "\n";
      *status = 1;
      return;
    }
    std::cerr << "dma-bench standard: updated " << a.update << "\n";
  });
}

}  // namespace dma::bench
