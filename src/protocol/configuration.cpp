#include "dma/configuration.hpp"

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <system_error>
#include <utility>

#include <toml++/toml.h>

namespace dma {

namespace {

// Every key a configuration file may hold. Anything else is an error, so that a misspelt key
// ("max_inflight") fails loudly instead of silently leaving the default in force.
constexpr std::string_view kKnownKeys =
    "providers, interfaces, bind, max_in_flight, progress_deadline_ms, completion_deadline_ms, "
    "crc_threads, always_register_operands, max_piece_bytes";

// Keys from the file, and toml++'s descriptions that may quote the file, end up in error replies
// and logs: control characters (and, inside quotes, quotes) are shown as \xNN so a file cannot
// inject line breaks.
std::string escape(std::string_view text, bool quoted = false) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte == 0x7f || (quoted && (c == '"' || c == '\\'))) {
      out += "\\x";
      out += kDigits[byte >> 4];
      out += kDigits[byte & 0xf];
    } else {
      out += c;
    }
  }
  return out;
}

std::string quote(std::string_view text) { return '"' + escape(text, true) + '"'; }

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
    return fail(ErrorCode::kConfiguration, locator.at(node.source()) + quote(key) +
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
                  locator.at(element.source()) + quote(key) + "[" + std::to_string(i) +
                      "] must be a string, not " + std::string(type_name(element.type())));
    }
    strings.push_back(text->get());
  }
  return strings;
}

Result<std::int64_t> integer_at_least(const toml::node& node, std::string_view key,
                                      std::int64_t minimum, const Locator& locator) {
  const toml::value<std::int64_t>* number = node.as_integer();
  if (number == nullptr) {
    return fail(ErrorCode::kConfiguration, locator.at(node.source()) + quote(key) +
                                               " must be an integer, not " +
                                               std::string(type_name(node.type())));
  }
  if (number->get() < minimum) {
    return fail(ErrorCode::kConfiguration,
                locator.at(node.source()) + quote(key) + " must be an integer >= " +
                    std::to_string(minimum) + ", not " + std::to_string(number->get()));
  }
  return number->get();
}

// Fills a Configuration from a parsed document, starting from the defaults.
Result<Configuration> from_table(const toml::table& table, const Locator& locator) {
  Configuration configuration;
  for (const auto& [key, node] : table) {
    const std::string_view name = key.str();
    if (name == "providers" || name == "interfaces") {
      auto strings = string_array(node, name, locator);
      if (!strings) return fail(std::move(strings).error());
      (name == "providers" ? configuration.providers : configuration.interfaces) =
          std::move(*strings);
    } else if (name == "bind") {
      const toml::value<std::string>* text = node.as_string();
      if (text == nullptr) {
        return fail(ErrorCode::kConfiguration, locator.at(node.source()) + quote(name) +
                                                   " must be a string, not " +
                                                   std::string(type_name(node.type())));
      }
      configuration.bind = text->get();
    } else if (name == "max_in_flight") {
      auto number = integer_at_least(node, name, 0, locator);
      if (!number) return fail(std::move(number).error());
      configuration.max_in_flight = static_cast<std::size_t>(*number);
    } else if (name == "progress_deadline_ms") {
      auto number = integer_at_least(node, name, 1, locator);
      if (!number) return fail(std::move(number).error());
      configuration.progress_deadline = std::chrono::milliseconds(*number);
    } else if (name == "completion_deadline_ms") {
      auto number = integer_at_least(node, name, 0, locator);
      if (!number) return fail(std::move(number).error());
      configuration.completion_deadline = std::chrono::milliseconds(*number);
    } else if (name == "crc_threads") {
      auto number = integer_at_least(node, name, 1, locator);
      if (!number) return fail(std::move(number).error());
      configuration.crc_threads = static_cast<std::size_t>(*number);
    } else if (name == "max_piece_bytes") {
      auto number = integer_at_least(node, name, 0, locator);
      if (!number) return fail(std::move(number).error());
      configuration.max_piece_bytes = static_cast<std::size_t>(*number);
    } else if (name == "always_register_operands") {
      const toml::value<bool>* flag = node.as_boolean();
      if (flag == nullptr) {
        return fail(ErrorCode::kConfiguration, locator.at(node.source()) + quote(name) +
                                                   " must be a boolean, not " +
                                                   std::string(type_name(node.type())));
      }
      configuration.always_register_operands = flag->get();
    } else {
      return fail(ErrorCode::kConfiguration, locator.at(key.source()) + "unknown key " +
                                                 quote(name) + " (known keys: " +
                                                 std::string(kKnownKeys) + ")");
    }
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
                locator.at(error.source()) + escape(error.description()));
  }
  return from_table(table, locator);
#else
  toml::parse_result parsed = toml::parse(text, path);
  if (!parsed) {
    return fail(ErrorCode::kConfiguration,
                locator.at(parsed.error().source()) + escape(parsed.error().description()));
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
  auto text = read_file(name);
  if (!text) return fail(std::move(text).error());
  return parse(*text, name);
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
  if (progress_deadline.count() <= 0) {
    return fail(ErrorCode::kConfiguration, "progress_deadline_ms must be positive, not " +
                                               std::to_string(progress_deadline.count()));
  }
  if (completion_deadline.count() < 0) {
    return fail(ErrorCode::kConfiguration, "completion_deadline_ms must not be negative, not " +
                                               std::to_string(completion_deadline.count()));
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
