#include "report.hpp"

#include <sys/resource.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>

namespace dma::bench {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

// A number printed for people: fixed decimals, no exponent.
std::string fixed(double value, int decimals) {
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", decimals, value);
  return text;
}

// `value` rounded to `decimals` places, as a JSON number; JSON has no NaN or Inf, so a ratio
// against a zero baseline is null.
nlohmann::ordered_json rounded(double value, int decimals) {
  if (!std::isfinite(value)) return nullptr;
  const double scale = std::pow(10.0, decimals);
  return std::round(value * scale) / scale;
}

// The measurement's fields, shared by ours and the baseline, added to `out`.
void add_measurement(nlohmann::ordered_json& out, const Measurement& m) {
  out["ops_per_s"] = rounded(m.ops_per_s(), 1);
  out["gbps"] = rounded(m.gbps(), 4);
  out["p50_us"] = rounded(m.p50_us, 2);
  out["p99_us"] = rounded(m.p99_us, 2);
  out["operations"] = m.operations;
  out["seconds"] = rounded(m.seconds, 3);
  out["errors"] = m.errors;
  out["mismatches"] = m.mismatches;
  if (m.allocations_per_op) out["allocations_per_op"] = rounded(*m.allocations_per_op, 3);
  if (m.eagain) out["eagain"] = *m.eagain;
  if (m.cpu_seconds && m.operations > 0) {
    out["cpu_us_per_op"] = rounded(*m.cpu_seconds * 1e6 / static_cast<double>(m.operations), 2);
  }
  if (m.client_cpu_seconds && m.operations > 0) {
    out["client_cpu_us_per_op"] =
        rounded(*m.client_cpu_seconds * 1e6 / static_cast<double>(m.operations), 2);
  }
}

std::string count_column(const Case& row) {
  if (row.depth) return "d" + std::to_string(*row.depth);
  if (row.clients) return "c" + std::to_string(*row.clients);
  return "-";
}

std::string rate(double ops_per_s) {
  if (ops_per_s >= 1e6) return fixed(ops_per_s / 1e6, 2) + "M";
  if (ops_per_s >= 1e3) return fixed(ops_per_s / 1e3, 1) + "k";
  return fixed(ops_per_s, 0);
}

std::string pad(std::string text, std::size_t width, bool left = false) {
  if (text.size() >= width) return text;
  const std::string fill(width - text.size(), ' ');
  return left ? text + fill : fill + text;
}

std::string allocations(const Measurement& m) {
  return m.allocations_per_op ? fixed(*m.allocations_per_op, 2) : "-";
}

}  // namespace

void LatencySamples::merge(const LatencySamples& other) {
  nanoseconds_.insert(nanoseconds_.end(), other.nanoseconds_.begin(), other.nanoseconds_.end());
}

double LatencySamples::quantile_us(double q) {
  if (nanoseconds_.empty()) return 0;
  q = std::clamp(q, 0.0, 1.0);
  const auto index = static_cast<std::size_t>(q * static_cast<double>(nanoseconds_.size() - 1) + 0.5);
  std::nth_element(nanoseconds_.begin(), nanoseconds_.begin() + static_cast<std::ptrdiff_t>(index),
                   nanoseconds_.end());
  return static_cast<double>(nanoseconds_[index]) / 1e3;
}

namespace {

constexpr std::size_t kGbpsFrom = std::size_t{64} << 10;

double figure_of(const Measurement& side, std::size_t size) {
  return size >= kGbpsFrom ? side.gbps() : side.ops_per_s();
}

double ratio_of(double ours, double baseline) {
  return baseline > 0 ? ours / baseline : std::numeric_limits<double>::quiet_NaN();
}

std::vector<double> ratios_of(const std::vector<Round>& rounds) {
  std::vector<double> ratios;
  ratios.reserve(rounds.size());
  for (const Round& round : rounds) ratios.push_back(round.ratio());
  return ratios;
}

}  // namespace

double Round::ratio() const { return ratio_of(ours, baseline); }

Round round_of(const Measurement& ours, const Measurement& baseline, std::size_t size) {
  return Round{figure_of(ours, size), figure_of(baseline, size)};
}

double Case::ratio() const {
  if (rounds.empty()) return ratio_of(figure_of(ours, size), figure_of(baseline, size));
  std::vector<double> sorted = ratios_of(rounds);
  std::sort(sorted.begin(), sorted.end());
  const std::size_t middle = sorted.size() / 2;
  return sorted.size() % 2 == 1 ? sorted[middle] : (sorted[middle - 1] + sorted[middle]) / 2;
}

std::pair<double, double> Case::ratio_range() const {
  if (rounds.empty()) return {ratio(), ratio()};
  const std::vector<double> ratios = ratios_of(rounds);
  const auto [low, high] = std::minmax_element(ratios.begin(), ratios.end());
  return {*low, *high};
}

bool Case::unsteady() const {
  const double median = ratio();
  if (rounds.size() < 2 || !(median > 0)) return false;
  const auto [low, high] = ratio_range();
  return (high - low) / median > kUnsteadySpread;
}

std::string Case::ratio_basis() const { return size >= kGbpsFrom ? "GB/s" : "ops/s"; }

std::string format_size(std::size_t bytes) {
  if (bytes >= (std::size_t{1} << 30) && bytes % (std::size_t{1} << 30) == 0) return std::to_string(bytes >> 30) + "g";
  if (bytes >= kMiB && bytes % kMiB == 0) return std::to_string(bytes >> 20) + "m";
  if (bytes >= 1024 && bytes % 1024 == 0) return std::to_string(bytes >> 10) + "k";
  return std::to_string(bytes);
}

nlohmann::ordered_json to_json(const Case& row) {
  nlohmann::ordered_json out;
  out["mode"] = row.mode;
  out["provider"] = row.provider;
  out["op"] = row.op;
  out["size"] = row.size;
  if (row.depth) out["depth"] = *row.depth;
  if (row.clients) out["clients"] = *row.clients;
  out["label"] = row.label;
  add_measurement(out, row.ours);
  nlohmann::ordered_json baseline;
  baseline["label"] = row.baseline_label;
  add_measurement(baseline, row.baseline);
  out["baseline"] = std::move(baseline);
  out["ratio"] = rounded(row.ratio(), 3);
  out["ratio_basis"] = row.ratio_basis();
  if (!row.rounds.empty()) {
    const auto [low, high] = row.ratio_range();
    out["rounds"] = row.rounds.size();
    out["ratio_min"] = rounded(low, 3);
    out["ratio_max"] = rounded(high, 3);
    out["unsteady"] = row.unsteady();
    // GB/s to the MB/s, ops/s to the op.
    const int decimals = row.ratio_basis() == "GB/s" ? 3 : 0;
    nlohmann::ordered_json per_round = nlohmann::ordered_json::array();
    for (const Round& round : row.rounds) {
      nlohmann::ordered_json one;
      one["ours"] = rounded(round.ours, decimals);
      one["baseline"] = rounded(round.baseline, decimals);
      one["ratio"] = rounded(round.ratio(), 3);
      per_round.push_back(std::move(one));
    }
    out["per_round"] = std::move(per_round);
  }
  return out;
}

namespace {

// "0.953 [0.91-0.98]", with " *" when the rounds spread more than kUnsteadySpread; "-" against
// a zero baseline.
std::string ratio_with_range(const Case& row, int decimals) {
  const double r = row.ratio();
  if (!std::isfinite(r)) return "-";
  std::string text = fixed(r, decimals);
  if (!row.rounds.empty()) {
    const auto [low, high] = row.ratio_range();
    text += " [" + fixed(low, 2) + "-" + fixed(high, 2) + "]";
    if (row.unsteady()) text += " *";
  }
  return text;
}

}  // namespace

std::string to_table(const std::vector<Case>& rows) {
  // Ours and the baseline side by side, one row per case.
  std::string out;
  out += pad("provider", 8, true) + " " + pad("op", 5, true) + " " + pad("size", 5) + " " +
         pad("n", 4) + " | " + pad("ops/s", 8) + " " + pad("GB/s", 7) + " " + pad("p50us", 8) +
         " " + pad("p99us", 8) + " " + pad("allocs", 6) + " | " + pad("base ops/s", 10) + " " +
         pad("GB/s", 7) + " " + pad("p50us", 8) + " " + pad("p99us", 8) + " | " +
         pad("ratio [min-max]", 26) + " " + pad("err", 4) + " " + pad("bad", 4) + "\n";
  for (const auto& row : rows) {
    const auto& o = row.ours;
    const auto& b = row.baseline;
    const std::string ratio_text = ratio_with_range(row, 3) + " " + row.ratio_basis();
    out += pad(row.provider, 8, true) + " " + pad(row.op, 5, true) + " " +
           pad(format_size(row.size), 5) + " " + pad(count_column(row), 4) + " | " +
           pad(rate(o.ops_per_s()), 8) + " " + pad(fixed(o.gbps(), 3), 7) + " " +
           pad(fixed(o.p50_us, 1), 8) + " " + pad(fixed(o.p99_us, 1), 8) + " " +
           pad(allocations(o), 6) + " | " + pad(rate(b.ops_per_s()), 10) + " " +
           pad(fixed(b.gbps(), 3), 7) + " " + pad(fixed(b.p50_us, 1), 8) + " " +
           pad(fixed(b.p99_us, 1), 8) + " | " + pad(ratio_text, 26) + " " +
           pad(std::to_string(o.errors + b.errors), 4) + " " +
           pad(std::to_string(o.mismatches + b.mismatches), 4) + "\n";
  }
  return out;
}

std::string cpu_lines(const std::vector<Case>& rows, const std::string& who) {
  const auto per_op = [](const std::optional<double>& cpu, const Measurement& m) {
    return fixed(cpu && m.operations > 0 ? *cpu * 1e6 / static_cast<double>(m.operations) : 0.0,
                 2);
  };
  std::string out;
  const auto line = [&](const std::string& name, auto field) {
    std::string text;
    for (const Case& row : rows) {
      if (!(row.ours.*field) && !(row.baseline.*field)) continue;
      text += " " + row.op + " " + format_size(row.size) + "/" + count_column(row) + " " +
              per_op(row.ours.*field, row.ours) + "/" + per_op(row.baseline.*field, row.baseline);
    }
    if (!text.empty()) {
      out += name + " CPU per completed op, us (ours/baseline; user + system, every thread):" +
             text + "\n";
    }
  };
  line(who, &Measurement::cpu_seconds);
  line("client", &Measurement::client_cpu_seconds);
  return out;
}

std::string cpu_markdown(const std::vector<Case>& rows, const std::string& who) {
  const auto per_op = [](const std::optional<double>& cpu, const Measurement& m) -> std::string {
    if (!cpu || m.operations == 0) return "-";
    return fixed(*cpu * 1e6 / static_cast<double>(m.operations), 1);
  };
  bool clients = false;
  bool any = false;
  for (const Case& row : rows) {
    any = any || row.ours.cpu_seconds || row.baseline.cpu_seconds;
    clients = clients || row.ours.client_cpu_seconds || row.baseline.client_cpu_seconds;
  }
  if (!any) return "";
  std::string out = "| provider | op | size | depth/clients | " + who + " ours | " + who +
                    " baseline |" + (clients ? " clients ours | clients baseline |" : "") +
                    "\n|---|---|---:|---:|---:|---:|" + (clients ? "---:|---:|" : "") + "\n";
  for (const Case& row : rows) {
    out += "| " + row.provider + " | " + row.op + " | " + format_size(row.size) + " | " +
           count_column(row) + " | " + per_op(row.ours.cpu_seconds, row.ours) + " | " +
           per_op(row.baseline.cpu_seconds, row.baseline) + " |";
    if (clients) {
      out += " " + per_op(row.ours.client_cpu_seconds, row.ours) + " | " +
             per_op(row.baseline.client_cpu_seconds, row.baseline) + " |";
    }
    out += "\n";
  }
  return out;
}

std::string to_markdown(const std::vector<Case>& rows) {
  std::string out =
      "| mode | provider | op | size | depth/clients | ours ops/s | ours GB/s | ours p50 us | "
      "ours p99 us | allocs/op | baseline | base ops/s | base GB/s | base p50 us | base p99 us | "
      "ratio |\n"
      "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|\n";
  for (const auto& row : rows) {
    const auto& o = row.ours;
    const auto& b = row.baseline;
    out += "| " + row.mode + " | " + row.provider + " | " + row.op + " | " + format_size(row.size) +
           " | " + count_column(row) + " | " + rate(o.ops_per_s()) + " | " + fixed(o.gbps(), 3) +
           " | " + fixed(o.p50_us, 1) + " | " + fixed(o.p99_us, 1) + " | " + allocations(o) +
           " | " + row.baseline_label + " | " + rate(b.ops_per_s()) + " | " + fixed(b.gbps(), 3) +
           " | " + fixed(b.p50_us, 1) + " | " + fixed(b.p99_us, 1) + " | " +
           ratio_with_range(row, 2) + " " + row.ratio_basis() + " |\n";
  }
  return out;
}

Progress::Progress(std::size_t total_cases, bool force)
    : total_(total_cases), terminal_(::isatty(STDERR_FILENO) == 1), force_(force) {}

void Progress::note(std::string_view text) {
  if (terminal_) std::fprintf(stderr, "\r\033[K");
  std::fprintf(stderr, "%.*s\n", static_cast<int>(text.size()), text.data());
  std::fflush(stderr);
}

void Progress::start_case(std::string_view description) {
  if (terminal_) {
    std::fprintf(stderr, "\r\033[K[%zu/%zu] %.*s", done_ + 1, total_,
                 static_cast<int>(description.size()), description.data());
  } else if (force_) {
    std::fprintf(stderr, "[%zu/%zu] %.*s\n", done_ + 1, total_,
                 static_cast<int>(description.size()), description.data());
  }
  std::fflush(stderr);
}

void Progress::finish_case() { ++done_; }

Progress::~Progress() {
  if (terminal_ && done_ > 0) {
    std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
  }
}

std::string describe_machine(const std::string& proc) {
  std::string model = "unknown CPU";
  std::ifstream cpuinfo(proc + "/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      const auto start = colon == std::string::npos ? colon : line.find_first_not_of(' ', colon + 1);
      if (start != std::string::npos) model = line.substr(start);
      break;
    }
  }
  utsname name{};
  const std::string kernel = ::uname(&name) == 0 ? std::string(name.sysname) + " " + name.release
                                                 : std::string("unknown kernel");
  std::string congestion;
  std::ifstream(proc + "/sys/net/ipv4/tcp_congestion_control") >> congestion;
  return std::to_string(::sysconf(_SC_NPROCESSORS_ONLN)) + " cores, " + model + ", " + kernel +
         ", TCP congestion control " + (congestion.empty() ? "unknown" : congestion);
}

double process_cpu_seconds() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  const auto seconds = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) / 1e6;
  };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

}  // namespace dma::bench
