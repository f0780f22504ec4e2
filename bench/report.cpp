#include "report.hpp"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>

namespace dma::bench {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

std::string_view trim(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t')) text.remove_suffix(1);
  return text;
}

// Splits on ',' keeping empty entries, so "64,,4k" is an error rather than silently "64,4k".
std::vector<std::string_view> split_commas(std::string_view text) {
  std::vector<std::string_view> parts;
  while (true) {
    const auto comma = text.find(',');
    parts.push_back(trim(text.substr(0, comma)));
    if (comma == std::string_view::npos) return parts;
    text.remove_prefix(comma + 1);
  }
}

Result<std::uint64_t> parse_unsigned(std::string_view digits, std::string_view entry,
                                     std::string_view what) {
  std::uint64_t value = 0;
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (digits.empty() || error != std::errc{} || end != digits.data() + digits.size()) {
    return fail(ErrorCode::kInvalidArgument,
                std::string(what) + ": '" + std::string(entry) + "' is not an unsigned number");
  }
  return value;
}

// A number printed for people: fixed decimals, no exponent.
std::string fixed(double value, int decimals) {
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", decimals, value);
  return text;
}

// JSON has no NaN/Inf; a ratio against a zero baseline is written as null.
std::string json_number(double value, int decimals) {
  if (!std::isfinite(value)) return "null";
  return fixed(value, decimals);
}

std::string json_string(std::string_view text) {
  std::string out = "\"";
  for (const char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char escaped[8];
          std::snprintf(escaped, sizeof escaped, "\\u%04x", static_cast<unsigned>(c));
          out += escaped;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

// The measurement's fields, without braces, shared by ours and the baseline.
std::string measurement_fields(const Measurement& m) {
  std::string out;
  out += "\"ops_per_s\":" + json_number(m.ops_per_s(), 1);
  out += ",\"gbps\":" + json_number(m.gbps(), 4);
  out += ",\"p50_us\":" + json_number(m.p50_us, 2);
  out += ",\"p99_us\":" + json_number(m.p99_us, 2);
  out += ",\"operations\":" + std::to_string(m.operations);
  out += ",\"seconds\":" + json_number(m.seconds, 3);
  out += ",\"errors\":" + std::to_string(m.errors);
  out += ",\"mismatches\":" + std::to_string(m.mismatches);
  if (m.allocations_per_op) out += ",\"allocations_per_op\":" + json_number(*m.allocations_per_op, 3);
  if (m.eagain) out += ",\"eagain\":" + std::to_string(*m.eagain);
  return out;
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

double Case::ratio() const {
  if (size >= kMiB) {
    const double base = baseline.gbps();
    return base > 0 ? ours.gbps() / base : std::numeric_limits<double>::quiet_NaN();
  }
  const double base = baseline.ops_per_s();
  return base > 0 ? ours.ops_per_s() / base : std::numeric_limits<double>::quiet_NaN();
}

std::string Case::ratio_basis() const { return size >= kMiB ? "GB/s" : "ops/s"; }

Result<std::vector<std::size_t>> parse_sizes(std::string_view text) {
  std::vector<std::size_t> sizes;
  for (const auto entry : split_commas(text)) {
    if (entry.empty()) return fail(ErrorCode::kInvalidArgument, "sizes: empty entry in '" + std::string(text) + "'");
    std::string_view digits = entry;
    unsigned shift = 0;
    switch (digits.back()) {
      case 'k': case 'K': shift = 10; break;
      case 'm': case 'M': shift = 20; break;
      case 'g': case 'G': shift = 30; break;
      default: break;
    }
    if (shift != 0) digits.remove_suffix(1);
    auto value = parse_unsigned(digits, entry, "sizes");
    if (!value) return fail(std::move(value).error());
    if (*value == 0) return fail(ErrorCode::kInvalidArgument, "sizes: '" + std::string(entry) + "' is zero");
    if (*value > (std::numeric_limits<std::size_t>::max() >> shift)) {
      return fail(ErrorCode::kInvalidArgument, "sizes: '" + std::string(entry) + "' is too large");
    }
    sizes.push_back(static_cast<std::size_t>(*value) << shift);
  }
  return sizes;
}

Result<std::vector<std::size_t>> parse_counts(std::string_view text, std::string_view what) {
  std::vector<std::size_t> counts;
  for (const auto entry : split_commas(text)) {
    if (entry.empty()) {
      return fail(ErrorCode::kInvalidArgument, std::string(what) + ": empty entry in '" + std::string(text) + "'");
    }
    auto value = parse_unsigned(entry, entry, what);
    if (!value) return fail(std::move(value).error());
    if (*value == 0) return fail(ErrorCode::kInvalidArgument, std::string(what) + ": '" + std::string(entry) + "' must be at least 1");
    counts.push_back(static_cast<std::size_t>(*value));
  }
  return counts;
}

std::string format_size(std::size_t bytes) {
  if (bytes >= (std::size_t{1} << 30) && bytes % (std::size_t{1} << 30) == 0) return std::to_string(bytes >> 30) + "g";
  if (bytes >= kMiB && bytes % kMiB == 0) return std::to_string(bytes >> 20) + "m";
  if (bytes >= 1024 && bytes % 1024 == 0) return std::to_string(bytes >> 10) + "k";
  return std::to_string(bytes);
}

std::string to_json(const Case& row) {
  std::string out = "{";
  out += "\"mode\":" + json_string(row.mode);
  out += ",\"provider\":" + json_string(row.provider);
  out += ",\"op\":" + json_string(row.op);
  out += ",\"size\":" + std::to_string(row.size);
  if (row.depth) out += ",\"depth\":" + std::to_string(*row.depth);
  if (row.clients) out += ",\"clients\":" + std::to_string(*row.clients);
  out += ",\"label\":" + json_string(row.label);
  out += "," + measurement_fields(row.ours);
  out += ",\"baseline\":{\"label\":" + json_string(row.baseline_label) + "," +
         measurement_fields(row.baseline) + "}";
  out += ",\"ratio\":" + json_number(row.ratio(), 3);
  out += ",\"ratio_basis\":" + json_string(row.ratio_basis());
  return out + "}";
}

std::string to_table(const std::vector<Case>& rows) {
  // Ours and the baseline side by side, one row per case.
  std::string out;
  out += pad("provider", 8, true) + " " + pad("op", 5, true) + " " + pad("size", 5) + " " +
         pad("n", 4) + " | " + pad("ops/s", 8) + " " + pad("GB/s", 7) + " " + pad("p50us", 8) +
         " " + pad("p99us", 8) + " " + pad("allocs", 6) + " | " + pad("base ops/s", 10) + " " +
         pad("GB/s", 7) + " " + pad("p50us", 8) + " " + pad("p99us", 8) + " | " +
         pad("ratio", 11) + " " + pad("err", 4) + " " + pad("bad", 4) + "\n";
  for (const auto& row : rows) {
    const auto& o = row.ours;
    const auto& b = row.baseline;
    const double r = row.ratio();
    const std::string ratio_text =
        (std::isfinite(r) ? fixed(r, 3) : std::string("-")) + " " + row.ratio_basis();
    out += pad(row.provider, 8, true) + " " + pad(row.op, 5, true) + " " +
           pad(format_size(row.size), 5) + " " + pad(count_column(row), 4) + " | " +
           pad(rate(o.ops_per_s()), 8) + " " + pad(fixed(o.gbps(), 3), 7) + " " +
           pad(fixed(o.p50_us, 1), 8) + " " + pad(fixed(o.p99_us, 1), 8) + " " +
           pad(allocations(o), 6) + " | " + pad(rate(b.ops_per_s()), 10) + " " +
           pad(fixed(b.gbps(), 3), 7) + " " + pad(fixed(b.p50_us, 1), 8) + " " +
           pad(fixed(b.p99_us, 1), 8) + " | " + pad(ratio_text, 11) + " " +
           pad(std::to_string(o.errors + b.errors), 4) + " " +
           pad(std::to_string(o.mismatches + b.mismatches), 4) + "\n";
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
    const double r = row.ratio();
    out += "| " + row.mode + " | " + row.provider + " | " + row.op + " | " + format_size(row.size) +
           " | " + count_column(row) + " | " + rate(o.ops_per_s()) + " | " + fixed(o.gbps(), 3) +
           " | " + fixed(o.p50_us, 1) + " | " + fixed(o.p99_us, 1) + " | " + allocations(o) +
           " | " + row.baseline_label + " | " + rate(b.ops_per_s()) + " | " + fixed(b.gbps(), 3) +
           " | " + fixed(b.p50_us, 1) + " | " + fixed(b.p99_us, 1) + " | " +
           (std::isfinite(r) ? fixed(r, 2) : std::string("-")) + "x " + row.ratio_basis() + " |\n";
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

}  // namespace dma::bench
