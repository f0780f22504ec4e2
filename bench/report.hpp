// What every dma-bench mode reports: latency samples, a measurement, one case compared with its
// baseline, and the three ways it is printed (a human table, one JSON object per line, and the
// Markdown table `make bench` writes into docs/PERFORMANCE.md). Progress goes to stderr.
//
// Thread-safety: none; a LatencySamples belongs to the thread that records into it (merge()
// them afterwards). Ownership: plain values.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "dma/result.hpp"

namespace dma::bench {

// Per-operation latencies in nanoseconds. Reserve before the timed window so recording does
// not allocate on the hot path.
class LatencySamples {
 public:
  void reserve(std::size_t count) { nanoseconds_.reserve(count); }
  void record(std::chrono::nanoseconds elapsed) {
    if (nanoseconds_.size() < nanoseconds_.capacity()) nanoseconds_.push_back(elapsed.count());
  }
  void merge(const LatencySamples& other);
  std::size_t size() const noexcept { return nanoseconds_.size(); }
  // The q-quantile (0..1) in microseconds; 0 with no samples. Sorts in place.
  double quantile_us(double q);

 private:
  std::vector<std::int64_t> nanoseconds_;
};

// One side (ours or the baseline) of one case.
struct Measurement {
  std::uint64_t operations = 0;
  std::uint64_t bytes = 0;
  std::uint64_t errors = 0;      // failed operations (not counted in operations)
  std::uint64_t mismatches = 0;  // operations whose bytes did not verify
  double seconds = 0;
  double p50_us = 0;
  double p99_us = 0;
  // Heap allocations per operation in the timed window, when the mode counts them.
  std::optional<double> allocations_per_op;
  // Posts the provider refused with -FI_EAGAIN in the timed window, when the mode counts them.
  std::optional<std::uint64_t> eagain;
  // CPU seconds (user + system, every thread of the process) spent in the timed windows, when
  // the mode measures them: the fabric rows' initiator process, whose one side runs at a time;
  // the Redis rows' server (INFO cpu), and in client_cpu_seconds the benchmark's own process,
  // all its clients' threads (dma::Client's progress threads included).
  std::optional<double> cpu_seconds;
  std::optional<double> client_cpu_seconds;
  double ops_per_s() const { return seconds > 0 ? operations / seconds : 0; }
  double gbps() const { return seconds > 0 ? bytes / seconds / 1e9 : 0; }
};

// One interleaved round of a case: each side's figure on the case's basis (GB/s from 64 KiB,
// else ops/s; Case::ratio_basis()), so a round that moved can be told apart from the side that
// moved it.
struct Round {
  double ours = 0;
  double baseline = 0;
  double ratio() const;  // NaN against a zero baseline
};

// One row: ours against the baseline measured in the same run.
struct Case {
  std::string mode;      // "fabric" or "redis"
  std::string provider;  // tcp, net, shm, ...
  std::string op;        // write|read (fabric), get|set (redis)
  std::size_t size = 0;
  std::optional<std::size_t> depth;    // fabric
  std::optional<std::size_t> clients;  // redis
  std::string label;     // what "ours" is, e.g. "dma" or "DMA.GET"
  std::string baseline_label;  // e.g. "raw libfabric" or "GET"
  Measurement ours;
  Measurement baseline;
  // Each interleaved round (ours and the baseline back to back), in order.
  std::vector<Round> rounds;
  // The median of the rounds' ratios; without rounds, ours/baseline over the whole case. GB/s
  // for sizes >= 64 KiB, else ops/s (the figure the goals name). NaN against a zero baseline.
  double ratio() const;
  std::string ratio_basis() const;  // "GB/s" or "ops/s"
  // The lowest and highest round ratio (both ratio() without rounds).
  std::pair<double, double> ratio_range() const;
  // (max - min) / median of the round ratios is above kUnsteadySpread: a machine too busy, or
  // a case too short, for its ratio to be trusted.
  bool unsteady() const;
};
inline constexpr double kUnsteadySpread = 0.20;
// One round from each side's measurement over it, on the basis Case::ratio_basis() names for
// `size`.
Round round_of(const Measurement& ours, const Measurement& baseline, std::size_t size);

// 65536 -> "64k", 1048576 -> "1m", 100 -> "100".
std::string format_size(std::size_t bytes);

// One JSON object, fields in this order (print it with dump(), one line): mode, provider, op, size, depth|clients,
// label, ops_per_s, gbps, p50_us, p99_us, operations, seconds, errors, mismatches,
// allocations_per_op and eagain (when known), baseline {label, same fields}, ratio (the
// median of rounds; null against a zero baseline), ratio_basis, and with rounds: rounds,
// ratio_min, ratio_max, unsteady, and per_round (each round's ours, baseline and ratio).
nlohmann::ordered_json to_json(const Case& row);
// A fixed-width table for a terminal (header included).
std::string to_table(const std::vector<Case>& rows);
// A GitHub Markdown table (header included).
std::string to_markdown(const std::vector<Case>& rows);
// The CPU each side spent per completed operation, one line per measured process ("" when no
// row measured any): `who` names what cpu_seconds measured (the fabric rows' initiator, the
// Redis rows' server); the Redis rows' clients get a line of their own.
std::string cpu_lines(const std::vector<Case>& rows, const std::string& who);
// The same as a markdown table, one row per case that measured it ("" when none did).
std::string cpu_markdown(const std::vector<Case>& rows, const std::string& who);

// A single-line progress display on stderr ("\r" updates); silent when stderr is not a
// terminal unless forced, so logs stay readable.
class Progress {
 public:
  // `force`: print one line per case (no "\r") even when stderr is not a terminal.
  explicit Progress(std::size_t total_cases, bool force = false);
  // Prints a note on its own line (always, terminal or not), e.g. a warning.
  void note(std::string_view text);
  void start_case(std::string_view description);
  void finish_case();
  ~Progress();

 private:
  std::size_t total_;
  std::size_t done_ = 0;
  bool terminal_;
  bool force_;
};

// This process's CPU time so far, user + system over all its threads (getrusage(2)).
double process_cpu_seconds();

// The machine a run measured, for the line above its tables: "2 cores, <CPU model>, Linux
// <release>, TCP congestion control <name>". The congestion control is the host's
// (net.ipv4.tcp_congestion_control): over tcp and net it sets how fast the sockets under both
// sides run, and with it a ratio's spread (docs/PERFORMANCE.md, "Speed, sixteenth pass").
// `proc` is where /proc is (a test's stand-in); what cannot be read is "unknown".
std::string describe_machine(const std::string& proc = "/proc");

}  // namespace dma::bench
