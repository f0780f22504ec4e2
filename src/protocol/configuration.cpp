#include "dma/configuration.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <system_error>
#include <utility>

#include <toml++/toml.h>

#include "dma/protocol.hpp"
#include "protocol/settings.hpp"

namespace dma {

namespace {

// Keys from the file, and toml++'s descriptions that may quote the file, end up in error replies
// and logs: they are shown only through quote_for_log and escape_for_log (dma/protocol.hpp).

std::string_view type_name(toml::node_type type) {
  switch (type) {
    case toml::node_type::none:
      return "nothing";
    case toml::node_type::table:
      return "a table";
    case toml::node_type::array:
      return "an array";
    case toml::node_type::string:
      return "a string";
    case toml::node_type::integer:
      return "an integer";
    case toml::node_type::floating_point:
      return "a floating-point number";
    case toml::node_type::boolean:
      return "a boolean";
    case toml::node_type::date:
      return "a date";
    case toml::node_type::time:
      return "a time";
    case toml::node_type::date_time:
      return "a date-time";
  }
  return "an unknown type";
}

// Where in the input something is: "path:line:column: " for a file, "line L, column C: " for
// text handed to parse_toml.
class Locator {
 public:
  explicit Locator(std::string_view path) : path_(path) {}

  std::string at(const toml::source_region& region) const {
    const auto line = std::to_string(region.begin.line);
    const auto column = std::to_string(region.begin.column);
    if (path_.empty()) return "line " + line + ", column " + column + ": ";
    return std::string(path_) + ":" + line + ":" + column + ": ";
  }
  // For errors about the document as a whole (from validate()).
  std::string whole() const { return path_.empty() ? std::string() : std::string(path_) + ": "; }

 private:
  std::string_view path_;
};

Result<std::vector<std::string>> string_array(const toml::node& node, std::string_view key,
                                              const Locator& locator) {
  const toml::array* array = node.as_array();
  if (array == nullptr) {
    return fail(ErrorCode::kConfiguration, locator.at(node.source()) + quote_for_log(key) +
                                               " must be an array of strings, not " +
                                               std::string(type_name(node.type())));
  }
  std::vector<std::string> strings;
  strings.reserve(array->size());
  for (std::size_t i = 0; i < array->size(); ++i) {
    const toml::node& element = *array->get(i);
    const toml::value<std::string>* text = element.as_string();
    if (text == nullptr) {
      return fail(ErrorCode::kConfiguration,
                  locator.at(element.source()) + quote_for_log(key) + "[" + std::to_string(i) +
                      "] must be a string, not " + std::string(type_name(element.type())));
    }
    strings.push_back(text->get());
  }
  return strings;
}

// An integer within [minimum, maximum].
Result<std::uint64_t> integer_in(const toml::node& node, std::string_view key,
                                 std::uint64_t minimum, std::uint64_t maximum,
                                 const Locator& locator) {
  const toml::value<std::int64_t>* number = node.as_integer();
  if (number == nullptr) {
    return fail(ErrorCode::kConfiguration, locator.at(node.source()) + quote_for_log(key) +
                                               " must be an integer, not " +
                                               std::string(type_name(node.type())));
  }
  const std::int64_t value = number->get();
  if (value < 0 || static_cast<std::uint64_t>(value) < minimum) {
    return fail(ErrorCode::kConfiguration,
                locator.at(node.source()) + quote_for_log(key) + " must be an integer >= " +
                    std::to_string(minimum) + ", not " + std::to_string(value));
  }
  if (static_cast<std::uint64_t>(value) > maximum) {
    return fail(ErrorCode::kConfiguration,
                locator.at(node.source()) + quote_for_log(key) + " must be an integer <= " +
                    std::to_string(maximum) + ", not " + std::to_string(value));
  }
  return static_cast<std::uint64_t>(value);
}

// The value of `node` for `setting`, of the type the setting's kind names.
Result<settings::Value> value_of(const settings::Setting<Configuration>& setting,
                                 const toml::node& node, const Locator& locator) {
  const std::string_view key = setting.toml_name;
  auto wrong_type = [&](std::string_view wanted) {
    return fail(ErrorCode::kConfiguration,
                locator.at(node.source()) + quote_for_log(key) + " must be " +
                    std::string(wanted) + ", not " + std::string(type_name(node.type())));
  };
  switch (setting.kind) {
    case settings::Kind::kStringList: {
      DMA_TRY_ASSIGN(std::vector<std::string> strings, string_array(node, key, locator));
      return settings::Value(std::move(strings));
    }
    case settings::Kind::kString: {
      const toml::value<std::string>* text = node.as_string();
      if (text == nullptr) return wrong_type("a string");
      return settings::Value(text->get());
    }
    case settings::Kind::kBoolean: {
      const toml::value<bool>* flag = node.as_boolean();
      if (flag == nullptr) return wrong_type("a boolean");
      return settings::Value(flag->get());
    }
    case settings::Kind::kInteger:
    case settings::Kind::kMilliseconds: {
      DMA_TRY_ASSIGN(const std::uint64_t number,
                     integer_in(node, key, setting.minimum, setting.maximum, locator));
      return settings::Value(number);
    }
  }
  return wrong_type("of a known kind");
}

// Fills a Configuration from a parsed document, starting from the defaults. Every key must be
// a setting of the schema: anything else is an error, so that a misspelt key ("max_inflight")
// fails loudly instead of silently leaving the default in force.
Result<Configuration> from_table(const toml::table& table, const Locator& locator) {
  Configuration configuration;
  const auto known = settings::configuration_settings();
  for (const auto& [key, node] : table) {
    const std::string_view name = key.str();
    const auto setting = std::find_if(known.begin(), known.end(), [&](const auto& candidate) {
      return candidate.toml_name == name;
    });
    if (setting == known.end()) {
      return fail(ErrorCode::kConfiguration, locator.at(key.source()) + "unknown key " +
                                                 quote_for_log(name) + " (known keys: " +
                                                 settings::known_toml_keys() + ")");
    }
    DMA_TRY_ASSIGN(settings::Value value, value_of(*setting, node, locator));
    setting->apply(configuration, std::move(value));
  }
  if (auto valid = configuration.validate(); !valid) {
    return fail(ErrorCode::kConfiguration, locator.whole() + valid.error().message());
  }
  return configuration;
}

// toml++ throws on a syntax error when built with exceptions and returns a parse_result
// otherwise; either way the failure leaves here as a Result.
Result<Configuration> parse(std::string_view text, std::string_view path) {
  const Locator locator(path);
  // Configuration files are ASCII (every value is a name, an address or a number; a string may
  // still spell other characters as \u escapes). toml++ 3.3's Unicode whitespace tables reach
  // __builtin_unreachable() for many code points in U+00A1..U+FEFF (found by fuzz/; upstream
  // marzer/tomlplusplus#190 and #295, fixed after 3.3), so non-ASCII never reaches it.
  std::size_t line = 1;
  std::size_t column = 1;
  for (const char byte : text) {
    if (static_cast<unsigned char>(byte) >= 0x80) {
      toml::source_region region;
      region.begin = {static_cast<toml::source_index>(line), static_cast<toml::source_index>(column)};
      return fail(ErrorCode::kConfiguration,
                  locator.at(region) + "non-ASCII byte; configuration files are ASCII");
    }
    if (byte == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
#if TOML_EXCEPTIONS
  toml::table table;
  try {
    table = toml::parse(text, path);
  } catch (const toml::parse_error& error) {
    return fail(ErrorCode::kConfiguration,
                locator.at(error.source()) + escape_for_log(error.description()));
  }
  return from_table(table, locator);
#else
  toml::parse_result parsed = toml::parse(text, path);
  if (!parsed) {
    return fail(ErrorCode::kConfiguration,
                locator.at(parsed.error().source()) +
                    escape_for_log(parsed.error().description()));
  }
  return from_table(parsed.table(), locator);
#endif
}

struct FileCloser {
  void operator()(std::FILE* file) const noexcept { std::fclose(file); }
};

Result<std::string> read_file(const std::string& path) {
  std::unique_ptr<std::FILE, FileCloser> file(std::fopen(path.c_str(), "rb"));
  if (!file) {
    return fail(ErrorCode::kConfiguration, "cannot open configuration file " + path + ": " +
                                               std::error_code(errno, std::generic_category())
                                                   .message());
  }
  std::string contents;
  char buffer[8192];
  while (true) {
    const std::size_t got = std::fread(buffer, 1, sizeof buffer, file.get());
    contents.append(buffer, got);
    if (got < sizeof buffer) break;
  }
  // A directory opens fine and only fails here, with EISDIR.
  if (std::ferror(file.get())) {
    return fail(ErrorCode::kConfiguration, "cannot read configuration file " + path + ": " +
                                               std::error_code(errno, std::generic_category())
                                                   .message());
  }
  return contents;
}

}  // namespace

Result<Configuration> Configuration::load(const std::filesystem::path& path) {
  const std::string name = path.string();
  DMA_TRY_ASSIGN(const std::string text, read_file(name));
  return parse(text, name);
}

Result<Configuration> Configuration::parse_toml(std::string_view text) { return parse(text, {}); }

Status Configuration::validate() const {
  if (providers.empty()) {
    return fail(ErrorCode::kConfiguration, "providers must name at least one provider");
  }
  for (std::size_t i = 0; i < providers.size(); ++i) {
    if (providers[i].empty()) {
      return fail(ErrorCode::kConfiguration, "providers[" + std::to_string(i) + "] is empty");
    }
  }
  if (crc_threads < 1) return fail(ErrorCode::kConfiguration, "crc_threads must be at least 1");
  if (crc_threads > settings::kMaxCrcThreads) {
    return fail(ErrorCode::kConfiguration,
                "crc_threads must be at most " + std::to_string(settings::kMaxCrcThreads) +
                    ", not " + std::to_string(crc_threads));
  }
  constexpr auto kMaxDeadline =
      static_cast<std::chrono::milliseconds::rep>(settings::kMaxDeadlineMs);
  if (progress_deadline.count() <= 0) {
    return fail(ErrorCode::kConfiguration, "progress_deadline_ms must be positive, not " +
                                               std::to_string(progress_deadline.count()));
  }
  if (completion_deadline.count() < 0) {
    return fail(ErrorCode::kConfiguration, "completion_deadline_ms must not be negative, not " +
                                               std::to_string(completion_deadline.count()));
  }
  if (stuck_deadline.count() <= 0) {
    return fail(ErrorCode::kConfiguration, "stuck_deadline_ms must be positive, not " +
                                               std::to_string(stuck_deadline.count()));
  }
  if (shutdown_deadline.count() < 0) {
    return fail(ErrorCode::kConfiguration, "shutdown_deadline_ms must not be negative, not " +
                                               std::to_string(shutdown_deadline.count()));
  }
  if (worker_idle_poll.count() < 0 ||
      static_cast<std::uint64_t>(worker_idle_poll.count()) > settings::kMaxWorkerIdlePollUs) {
    return fail(ErrorCode::kConfiguration,
                "worker_idle_poll_us must be within 0.." +
                    std::to_string(settings::kMaxWorkerIdlePollUs) + ", not " +
                    std::to_string(worker_idle_poll.count()));
  }
  for (const auto& [name, deadline] : {std::pair{"progress_deadline_ms", progress_deadline},
                                       std::pair{"completion_deadline_ms", completion_deadline},
                                       std::pair{"stuck_deadline_ms", stuck_deadline},
                                       std::pair{"shutdown_deadline_ms", shutdown_deadline}}) {
    if (deadline.count() > kMaxDeadline) {
      return fail(ErrorCode::kConfiguration, std::string(name) + " must be at most " +
                                                 std::to_string(kMaxDeadline) + ", not " +
                                                 std::to_string(deadline.count()));
    }
  }
  return {};
}

std::string canonical_provider(std::string_view name) {
  // The RDM endpoints used here come from the ofi_rxm utility provider layered over the tcp or
  // verbs message provider; fi_info names that pair "tcp;ofi_rxm" (fi_provider(7)), and the
  // short names exist so configuration files need not spell the layering out.
  if (name == "tcp") return "tcp;ofi_rxm";
  if (name == "verbs") return "verbs;ofi_rxm";
  return std::string(name);
}

}  // namespace dma
