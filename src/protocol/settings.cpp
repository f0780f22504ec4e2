#include "protocol/settings.hpp"

#include <array>
#include <chrono>
#include <utility>

namespace dma::settings {
namespace {

using std::chrono::milliseconds;

std::string toml_string(const std::string& text) { return '"' + text + '"'; }

std::string toml_array(const std::vector<std::string>& strings) {
  std::string out = "[";
  for (std::size_t i = 0; i < strings.size(); ++i) {
    if (i > 0) out += ", ";
    out += toml_string(strings[i]);
  }
  return out + ']';
}

std::vector<std::string> strings_of(Value&& value) {
  return std::get<std::vector<std::string>>(std::move(value));
}
std::uint64_t number_of(const Value& value) { return std::get<std::uint64_t>(value); }

const std::array<Setting<Configuration>, 13> kConfigurationSettings{{
    {"providers", "providers", Kind::kStringList, 0, 0,
     [](Configuration& c, Value&& v) { c.providers = strings_of(std::move(v)); },
     [](const Configuration& c) { return toml_array(c.providers); },
     "libfabric providers in preference order, each tried until one opens; at least one. "
     "`tcp` means `tcp;ofi_rxm`, `verbs` means `verbs;ofi_rxm`"},
    {"interfaces", "interfaces", Kind::kStringList, 0, 0,
     [](Configuration& c, Value&& v) { c.interfaces = strings_of(std::move(v)); },
     [](const Configuration& c) { return toml_array(c.interfaces); },
     "domain (interface) names to open, e.g. `lo`, `eth0`, `rdmap0s6-rdm`; empty: any"},
    {"bind", "bind", Kind::kString, 0, 0,
     [](Configuration& c, Value&& v) { c.bind = std::get<std::string>(std::move(v)); },
     [](const Configuration& c) { return c.bind ? toml_string(*c.bind) : std::string(); },
     "local address to bind to (fi_getinfo node with FI_SOURCE); ignored by shm"},
    {"max_in_flight", "max-in-flight", Kind::kInteger, 0, kUnbounded,
     [](Configuration& c, Value&& v) { c.max_in_flight = number_of(v); },
     [](const Configuration& c) { return std::to_string(c.max_in_flight); },
     "most RMA operations posted at once per endpoint; 0: the provider's tx queue size, "
     "and clamped to it"},
    {"progress_deadline_ms", "progress-deadline-ms", Kind::kMilliseconds, 1, kMaxDeadlineMs,
     [](Configuration& c, Value&& v) {
       c.progress_deadline = milliseconds(static_cast<milliseconds::rep>(number_of(v)));
     },
     [](const Configuration& c) { return std::to_string(c.progress_deadline.count()); },
     "a peer refusing every post (-FI_EAGAIN) this long, with nothing of it in flight, is "
     "unreachable and its queued transfers fail"},
    {"completion_deadline_ms", "completion-deadline-ms", Kind::kMilliseconds, 0, kMaxDeadlineMs,
     [](Configuration& c, Value&& v) {
       c.completion_deadline = milliseconds(static_cast<milliseconds::rep>(number_of(v)));
     },
     [](const Configuration& c) { return std::to_string(c.completion_deadline.count()); },
     "a posted transfer without a completion this long fails as timed out; its buffer is held "
     "until the provider lets go (docs/RELIABILITY.md); 0: wait forever"},
    {"stuck_deadline_ms", "stuck-deadline-ms", Kind::kMilliseconds, 1, kMaxDeadlineMs,
     [](Configuration& c, Value&& v) {
       c.stuck_deadline = milliseconds(static_cast<milliseconds::rep>(number_of(v)));
     },
     [](const Configuration& c) { return std::to_string(c.stuck_deadline.count()); },
     "a fabric worker inside one libfabric call this long is abandoned: its transfers fail and "
     "its endpoint is replaced (docs/RELIABILITY.md)"},
    {"shutdown_deadline_ms", "shutdown-deadline-ms", Kind::kMilliseconds, 0, kMaxDeadlineMs,
     [](Configuration& c, Value&& v) {
       c.shutdown_deadline = milliseconds(static_cast<milliseconds::rep>(number_of(v)));
     },
     [](const Configuration& c) { return std::to_string(c.shutdown_deadline.count()); },
     "most a service's shutdown takes; what has not drained by then is abandoned "
     "(docs/RELIABILITY.md)"},
    {"crc_threads", "crc-threads", Kind::kInteger, 1, kMaxCrcThreads,
     [](Configuration& c, Value&& v) { c.crc_threads = number_of(v); },
     [](const Configuration& c) { return std::to_string(c.crc_threads); },
     "threads computing CRC32C of completed transfers off the fabric worker"},
    {"always_register_operands", "always-register-operands", Kind::kBoolean, 0, 0,
     [](Configuration& c, Value&& v) { c.always_register_operands = std::get<bool>(v); },
     [](const Configuration& c) {
       return std::string(c.always_register_operands ? "true" : "false");
     },
     "register local operands even where the provider does not need it (tcp, net, shm), as "
     "FI_MR_LOCAL providers (efa, verbs) must"},
    {"max_piece_bytes", "max-piece-bytes", Kind::kInteger, 0, kUnbounded,
     [](Configuration& c, Value&& v) { c.max_piece_bytes = number_of(v); },
     [](const Configuration& c) { return std::to_string(c.max_piece_bytes); },
     "largest single RMA posted, in both directions; larger pieces are split; 0: the service's "
     "default (a write over tcp in 512 KiB pieces, which is faster there; otherwise the "
     "provider's max_msg_size)"},
    {"worker_idle_poll_us", "worker-idle-poll-us", Kind::kInteger, 0, kMaxWorkerIdlePollUs,
     [](Configuration& c, Value&& v) {
       c.worker_idle_poll = std::chrono::microseconds(
           static_cast<std::chrono::microseconds::rep>(number_of(v)));
     },
     [](const Configuration& c) { return std::to_string(c.worker_idle_poll.count()); },
     "microseconds a fabric worker out of work keeps polling (yielding its core) before it "
     "sleeps: a transfer submitted meanwhile is posted without a wake-up; 0: sleep at once"},
    {"worker_checksum_max", "worker-checksum-max", Kind::kInteger, 0, kUnbounded,
     [](Configuration& c, Value&& v) { c.worker_checksum_max = number_of(v); },
     [](const Configuration& c) { return std::to_string(c.worker_checksum_max); },
     "largest transfer a fabric worker with nothing else to do checksums itself rather than "
     "hand to the CRC pool (a hand-off wakes a thread); except on shm it reads such a transfer "
     "in 256 KiB pieces and checksums each as it lands; 0: always the pool"},
}};

const std::array<Setting<ModuleOptions>, 6> kModuleSettings{{
    {"", "services-per-domain", Kind::kInteger, 1, kMaxServicesPerDomain,
     [](ModuleOptions& o, Value&& v) { o.services_per_domain = number_of(v); },
     [](const ModuleOptions& o) { return std::to_string(o.services_per_domain); },
     "fabric services (endpoints) per domain; each transfer goes to the least loaded"},
    {"", "max-value-size", Kind::kInteger, 1, kUnbounded,
     [](ModuleOptions& o, Value&& v) { o.max_value_size = number_of(v); },
     [](const ModuleOptions& o) { return std::to_string(o.max_value_size); },
     "largest value DMA.SET accepts, in bytes"},
    {"", "arena-bytes", Kind::kInteger, kMinArenaBytes, kUnbounded,
     [](ModuleOptions& o, Value&& v) { o.arena_bytes = number_of(v); },
     [](const ModuleOptions& o) { return std::to_string(o.arena_bytes); },
     "memory reserved at load for the values DMA.SET stores, registered once on every "
     "endpoint (pinned on verbs and efa); a SET that does not fit is refused naming it"},
    {"", "arena-huge-pages", Kind::kBoolean, 0, 0,
     [](ModuleOptions& o, Value&& v) { o.arena_huge_pages = std::get<bool>(v); },
     [](const ModuleOptions& o) { return std::string(o.arena_huge_pages ? "true" : "false"); },
     "back arena-bytes with transparent huge pages (MADV_HUGEPAGE; faster large DMA.GETs, "
     "while a fork's child lives a write copies a 2 MiB page)"},
    {"", "inline-max", Kind::kInteger, 0, kMaxInlineMax,
     [](ModuleOptions& o, Value&& v) { o.inline_max = number_of(v); },
     [](const ModuleOptions& o) { return std::to_string(o.inline_max); },
     "largest value a DMA.GET ... INLINE answers in its reply (dma::Client also sets values "
     "up to it with DMA.SETPLAIN); 0: every value goes over the fabric"},
    {"", "enable-debug", Kind::kBoolean, 0, 0,
     [](ModuleOptions& o, Value&& v) { o.enable_debug = std::get<bool>(v); },
     [](const ModuleOptions& o) { return std::string(o.enable_debug ? "true" : "false"); },
     "accept DMA.DEBUG (REPLACE-ENDPOINT [index]: replace a service's endpoint now), for "
     "tests; refused unless true"},
}};

std::string_view kind_name(Kind kind) {
  switch (kind) {
    case Kind::kStringList:
      return "strings (argument: comma list)";
    case Kind::kString:
      return "string";
    case Kind::kBoolean:
      return "`true` or `false`";
    case Kind::kInteger:
      return "integer";
    case Kind::kMilliseconds:
      return "milliseconds";
  }
  return "?";
}

std::string default_text(const std::string& shown) {
  return shown.empty() ? std::string("unset") : '`' + shown + '`';
}

template <typename Target>
void append_rows(std::string& out, std::span<const Setting<Target>> table) {
  const Target defaults{};
  for (const Setting<Target>& setting : table) {
    const bool numeric = setting.kind == Kind::kInteger || setting.kind == Kind::kMilliseconds;
    out += "| ";
    out += setting.toml_name.empty() ? std::string("(module only)")
                                     : '`' + std::string(setting.toml_name) + '`';
    out += " | `" + std::string(setting.argument_name) + "` | " +
           std::string(kind_name(setting.kind)) + " | " +
           (numeric ? describe_range(setting.minimum, setting.maximum) : std::string()) +
           " | " + default_text(setting.show(defaults)) + " | " + std::string(setting.help) +
           " |\n";
  }
}

}  // namespace

std::span<const Setting<Configuration>> configuration_settings() { return kConfigurationSettings; }
std::span<const Setting<ModuleOptions>> module_settings() { return kModuleSettings; }

std::string known_toml_keys() {
  std::string out;
  for (const auto& setting : kConfigurationSettings) {
    if (!out.empty()) out += ", ";
    out += setting.toml_name;
  }
  return out;
}

std::string known_argument_names() {
  std::string out;
  auto add = [&](std::string_view name) {
    if (!out.empty()) out += ", ";
    out += name;
  };
  for (const auto& setting : kConfigurationSettings) add(setting.argument_name);
  for (const auto& setting : kModuleSettings) add(setting.argument_name);
  return out;
}

std::string describe_range(std::uint64_t minimum, std::uint64_t maximum) {
  if (maximum == kUnbounded) return std::to_string(minimum) + "..2^63-1";
  return std::to_string(minimum) + ".." + std::to_string(maximum);
}

std::string render_markdown() {
  std::string out =
      "| TOML key | module argument | type | range | default | meaning |\n"
      "|---|---|---|---|---|---|\n";
  append_rows(out, configuration_settings());
  append_rows(out, module_settings());
  return out;
}

}  // namespace dma::settings
