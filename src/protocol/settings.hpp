// The one configuration schema: every setting a TOML file (Configuration::parse_toml) or the Redis
// module's load arguments (parse_module_arguments) may hold, with its name in each, its type, its
// range, how it is stored and a line of help.
//
// It prevents the two parsers of one struct drifting apart, as they had: the module capped
// crc-threads and the deadlines while TOML did not, and the module knew neither
// always_register_operands nor max_piece_bytes. Both parsers, both "known keys" messages and
// README.md's "Configuration" table (render_markdown, compared by tests/test_configuration.cpp)
// now come from these tables; a new field is one row here and nowhere else.
//
// Two tables: configuration_settings() are the Configuration fields (in files and arguments);
// module_settings() are the module's own (arguments only). Rows are in the order the messages
// and the README list them.
//
// Thread-safety: immutable tables of function pointers, safe from any thread.
#pragma once

#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "dma/configuration.hpp"

namespace dma::settings {

// The ranges. Where the two parsers disagreed, the bounded one is kept:
//
// - crc_threads at most 256: the CRC pool starts that many threads at once, and a typo (10000)
//   should fail the load rather than exhaust the process; 256 is above any core count we serve.
// - both deadlines at most 2^31 - 1 ms (24.8 days): the worker compares them with steady_clock
//   durations in nanoseconds, so past ~9.2e12 ms the comparison overflows (undefined, and in
//   practice every transfer times out at once), and libfabric's waits (fi_cq_sread, fi_wait)
//   take an int of milliseconds. No deadline longer than weeks means anything; the completion
//   deadline's "never" is 0.
inline constexpr std::uint64_t kMaxCrcThreads = 256;
inline constexpr std::uint64_t kMaxDeadlineMs = std::numeric_limits<std::int32_t>::max();
inline constexpr std::uint64_t kMaxServicesPerDomain = 64;
// worker_idle_poll_us at most one second: it is spent polling a core after every burst of work.
inline constexpr std::uint64_t kMaxWorkerIdlePollUs = 1000000;
inline constexpr std::uint64_t kUnbounded = std::numeric_limits<std::int64_t>::max();

enum class Kind : std::uint8_t {
  kStringList,    // TOML: an array of strings; argument: a comma list (empty items dropped)
  kString,        // TOML: a string; argument: the value as given
  kBoolean,       // TOML: a boolean; argument: "true" or "false"
  kInteger,       // TOML: an integer; argument: a strict decimal; in [minimum, maximum]
  kMilliseconds,  // as kInteger, a duration in milliseconds
};

// A parsed value handed to a setting's `apply`: the alternative its Kind names (both integer
// kinds carry std::uint64_t, already range-checked).
using Value = std::variant<std::vector<std::string>, std::string, bool, std::uint64_t>;

template <typename Target>
struct Setting {
  std::string_view toml_name;      // the key in a TOML file; empty for module-only settings
  std::string_view argument_name;  // the module load argument
  Kind kind;
  std::uint64_t minimum;  // integers only; kUnbounded as maximum: as far as TOML integers go
  std::uint64_t maximum;
  void (*apply)(Target&, Value&&);
  // The setting's current value in TOML spelling ("" when unset), for the README's defaults and
  // the tests.
  std::string (*show)(const Target&);
  std::string_view help;
};

std::span<const Setting<Configuration>> configuration_settings();
std::span<const Setting<ModuleOptions>> module_settings();

// "providers, interfaces, ..." (TOML keys) and "providers, interfaces, ..., max-value-size"
// (every argument name), for the unknown-key errors.
std::string known_toml_keys();
std::string known_argument_names();

// A range in words: "1..256"; "0..2^63-1" for kUnbounded (TOML integers stop there).
std::string describe_range(std::uint64_t minimum, std::uint64_t maximum);

// The README's table of every setting (a Markdown table, one row per setting, with its default).
std::string render_markdown();

}  // namespace dma::settings
