// The soak's report and its PASS rule (report.hpp).
#include "soak/report.hpp"

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <sstream>
#include <vector>

#include "soak/client.hpp"

namespace dma::soak {
namespace {

std::string fixed(double value, int decimals) {
  char text[32];
  std::snprintf(text, sizeof text, "%.*f", decimals, value);
  return text;
}

std::string optional_number(std::optional<long long> value) {
  return value ? std::to_string(*value) : std::string("?");
}

// One labelled line of the report.
void print_line(const std::string& label, const std::string& value) {
  constexpr std::size_t kLabelWidth = 30;
  std::cout << label << std::string(label.size() < kLabelWidth ? kLabelWidth - label.size() : 1, ' ')
            << value << "\n";
}

void print_counts(const Counts& counts) {
  for (const auto& [cause, count] : counts) std::cout << "  " << cause << ": " << count << "\n";
}

// "level 6100 ops/s" and the kills' ratios: min / median / max, how many did not recover.
void print_recovery(const Recovery& recovery, const char* kill) {
  print_line("throughput level",
             recovery.level ? fixed(*recovery.level, 0) +
                                  " ops/s (median 1 s rate, first 2 s and last 1 s left out)"
                            : std::string("? (the run is too short for one)"));
  std::string after = std::to_string(recovery.ratios.size()) + " " + kill + "s judged";
  if (!recovery.ratios.empty()) {
    const auto [low, high] = std::minmax_element(recovery.ratios.begin(), recovery.ratios.end());
    after += ", rate over [t+1 s, t+2 s] / level: min " + fixed(*low, 2) + ", median " +
             fixed(median(recovery.ratios), 2) + ", max " + fixed(*high, 2) + "; " +
             std::to_string(recovery.not_recovered()) + " below " + fixed(kRecovered, 2);
    const char* separator = ": ";
    for (const auto& [at, ratio] : recovery.slow) {
      after += separator + std::string("at ") + fixed(at, 1) + " s (" + fixed(ratio, 2) + ")";
      separator = ", ";
    }
  }
  if (recovery.not_judged > 0) {
    after += "; " + std::to_string(recovery.not_judged) + " not judged (window past the end)";
  }
  print_line("recovery", after);
}

// One condition of the PASS rule.
struct Check {
  std::string rule;
  bool held;
};

// "PASS (rule: a, b)" or "FAIL (not held: b; rule: a, b)".
bool print_result(const std::vector<Check>& checks) {
  std::string rule;
  std::string broken;
  for (const Check& check : checks) {
    rule += (rule.empty() ? "" : ", ") + check.rule;
    if (!check.held) broken += (broken.empty() ? "" : ", ") + check.rule;
  }
  const bool passed = broken.empty();
  print_line("result", std::string(passed ? "PASS" : "FAIL") + " (" +
                           (passed ? "" : "not held: " + broken + "; ") + "rule: " + rule + ")");
  return passed;
}

// What the module logged (endpoint replacements and why, shutdown), for a run that failed.
void print_module_lines(const std::string& log) {
  std::istringstream lines(log);
  std::string line;
  std::cerr << "dma-soak: the module's lines in the server's log:\n";
  while (std::getline(lines, line)) {
    if (line.find("dma") != std::string::npos) std::cerr << "  " << line << "\n";
  }
}

std::string clients_mode(const Options& options, int port) {
  if (options.kill_every > 0) {
    return ", one SIGKILLed and restarted every " + seconds(options.kill_every);
  }
  if (options.kills_server()) {
    return " kept running; the server SIGKILLed " + seconds(options.kill_server_every) +
           " after each start and restarted on port " + std::to_string(port);
  }
  return ", none killed";
}

// Every error a client reports is a live client's: a killed one cannot report the operation
// it died in. The server may fail the killed clients' transfers in flight, no more.
void report_client_kills(const RunSummary& run, std::vector<Check>& checks) {
  const Tally& sum = run.sum;
  const std::uint64_t allowed = run.kills * kInFlightPerClient;
  const std::uint64_t live_errors = sum.error_count() + sum.reconnect_failures();
  print_line("clients killed", std::to_string(run.kills));
  print_line("errors seen by live clients",
             std::to_string(live_errors) + " (" + std::to_string(sum.error_count()) +
                 " operations, " + std::to_string(sum.reconnect_failures()) + " reconnects)");
  print_counts(sum.errors);
  print_counts(sum.reconnects);
  print_line("server-side failed transfers",
             optional_number(run.failed_transfers) + " (allowed: kills " +
                 std::to_string(run.kills) + " x " + std::to_string(kInFlightPerClient) +
                 " in flight = " + std::to_string(allowed) + ")");
  checks.push_back({"0 errors seen by live clients", live_errors == 0});
  checks.push_back({"server-side failed transfers <= kills x " +
                        std::to_string(kInFlightPerClient),
                    run.failed_transfers && *run.failed_transfers >= 0 &&
                        static_cast<std::uint64_t>(*run.failed_transfers) <= allowed});
}

// Each client may lose its operation in flight per server kill; its reconnect attempts while
// the server is down fail, and are counted apart.
void report_server_kills(const Options& options, const RunSummary& run,
                         std::vector<Check>& checks) {
  const Tally& sum = run.sum;
  const std::uint64_t allowed = static_cast<std::uint64_t>(options.clients) * run.kills *
                                kInFlightPerClient;
  print_line("servers killed", std::to_string(run.kills) + (run.restart_failed
                                                                ? ", the last restart FAILED"
                                                                : ", every restart started"));
  print_line("operation errors", std::to_string(sum.error_count()) + " (allowed: clients " +
                                     std::to_string(options.clients) + " x server kills " +
                                     std::to_string(run.kills) + " = " + std::to_string(allowed) +
                                     ")");
  print_counts(sum.errors);
  print_line("reconnect failures", std::to_string(sum.reconnect_failures()) +
                                       " (attempts while the server was down; allowed)");
  print_counts(sum.reconnects);
  print_line("server-side failed transfers",
             optional_number(run.failed_transfers) + " (last incarnation; not judged)");
  checks.push_back({"operation errors <= clients x server kills", sum.error_count() <= allowed});
  checks.push_back({"every restarted server started", !run.restart_failed});
}

}  // namespace

std::string seconds(double value) {
  std::ostringstream out;
  out << value << " s";
  return out.str();
}

std::string megabytes(std::optional<std::size_t> bytes) {
  if (!bytes) return "?";
  char text[32];
  std::snprintf(text, sizeof text, "%.1f MiB", static_cast<double>(*bytes) / (1 << 20));
  return text;
}

int report(const Options& options, const RunSummary& run) {
  const Tally& sum = run.sum;
  print_line("provider", options.provider);
  print_line("clients", std::to_string(options.clients) + " processes" +
                            clients_mode(options, run.port));
  print_line("duration", seconds(run.elapsed));
  print_line("operations", std::to_string(sum.operations()) + " (" + std::to_string(sum.sets) +
                               " DMA.SET, " + std::to_string(sum.gets) + " DMA.GET), " +
                               fixed(sum.operations() / run.elapsed, 0) + " ops/s");
  print_line("bytes", std::to_string(sum.bytes) + " (" +
                          fixed(static_cast<double>(sum.bytes) / 1e6 / run.elapsed, 1) + " MB/s)");
  std::vector<Check> checks{{"0 mismatches", sum.mismatches == 0}};
  if (options.kills_server()) {
    report_server_kills(options, run, checks);
  } else {
    report_client_kills(run, checks);
  }
  print_line("mismatches", std::to_string(sum.mismatches));
  print_recovery(run.recovery, options.kills_server() ? "restart" : "kill");
  checks.push_back({std::string(options.kills_server() ? "all restarts" : "all kills") +
                        " recovered within 2 s (rate over [t+1 s, t+2 s] >= " +
                        fixed(kRecovered, 2) + " x level)",
                    run.recovery.not_recovered() == 0});
  checks.push_back({"a throughput level above 0", run.recovery.level && *run.recovery.level > 0});
  const std::string incarnation = options.kills_server() ? " (last incarnation)" : "";
  print_line("server RSS", megabytes(run.rss_at_start) + " at start, " + megabytes(run.rss_end) +
                               " at end" + incarnation);
  print_line("server", run.server_died      ? "DIED"
                       : run.restart_failed ? "NOT RESTARTED"
                                            : "alive");
  if (run.server_died) std::cerr << "dma-soak: the server died:\n" << run.server_log << "\n";
  print_line("server exit",
             (run.server_exit ? std::to_string(*run.server_exit) : std::string("-")) + incarnation);
  print_line("client crashes", std::to_string(run.client_crashes));
  // The server exits 0 on SHUTDOWN (bounded by the module's shutdown-deadline-ms even with
  // wedged endpoints).
  checks.push_back({"no client exited on its own", run.client_crashes == 0});
  checks.push_back({"server never died on its own", !run.server_died});
  checks.push_back({"server exit 0", run.server_exit && *run.server_exit == 0});
  checks.push_back({"some work done", sum.operations() > 0});
  const bool passed = print_result(checks);
  if (!passed) print_module_lines(run.server_log);
  return passed ? 0 : 1;
}

}  // namespace dma::soak
