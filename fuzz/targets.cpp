#include "targets.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <vector>

#include "core.hpp"
#include "dma/configuration.hpp"
#include "dma/protocol.hpp"
#include "dma/result.hpp"
#include "dma/service.hpp"

namespace dma::fuzz {
namespace {

std::string_view as_text(std::span<const std::uint8_t> input) {
  return {reinterpret_cast<const char*>(input.data()), input.size()};
}

// Shows arbitrary bytes in a violation message without spilling control bytes on the terminal.
std::string shown(std::string_view text) { return quote_for_log(text); }

bool is_hex_digit(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

char lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

std::string lowercase(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = lower(c);
  return out;
}

bool equals_ignoring_case(std::string_view left, std::string_view right) {
  if (left.size() != right.size()) return false;
  for (std::size_t i = 0; i < left.size(); ++i) {
    if (lower(left[i]) != lower(right[i])) return false;
  }
  return true;
}

// The reference for parse_decimal: digits only, at least one, and a magnitude no larger than
// 2^64 - 1, decided by comparing spellings so that it cannot wrap the way strtoull-style
// accumulation does.
std::optional<std::uint64_t> reference_decimal(std::string_view text) {
  if (text.empty()) return std::nullopt;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
  }
  const std::size_t first = text.find_first_not_of('0');
  if (first == std::string_view::npos) return 0;
  const std::string_view digits = text.substr(first);
  constexpr std::string_view kMax = "18446744073709551615";
  if (digits.size() > kMax.size() || (digits.size() == kMax.size() && digits > kMax)) {
    return std::nullopt;
  }
  std::uint64_t value = 0;
  for (char c : digits) value = value * 10 + static_cast<std::uint64_t>(c - '0');
  return value;
}

// The one spelling to_wire gives a decimal the parser accepted: no leading zeros.
std::string canonical_decimal(std::string_view text) {
  const std::size_t first = text.find_first_not_of('0');
  return first == std::string_view::npos ? std::string("0") : std::string(text.substr(first));
}

// Error texts reach RESP error replies and log lines (protocol.cpp quotes input for that), so a
// message that parses hostile input must be non-empty, short and printable ASCII.
Violation check_client_error(const Error& error, std::string_view what) {
  const std::string& message = error.message();
  if (message.empty()) return std::string(what) + ": an error with an empty message";
  if (message.size() > 512) {
    return std::string(what) + ": an error message of " + std::to_string(message.size()) +
           " bytes: " + shown(message.substr(0, 200));
  }
  for (char c : message) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte >= 0x7f) {
      return std::string(what) + ": an error message with a non-printable byte: " + shown(message);
    }
  }
  return std::nullopt;
}

std::vector<std::string_view> split(std::string_view text, char separator) {
  std::vector<std::string_view> fields;
  if (text.empty()) return fields;
  while (true) {
    const std::size_t end = text.find(separator);
    fields.push_back(text.substr(0, end));
    if (end == std::string_view::npos) break;
    text.remove_prefix(end + 1);
  }
  return fields;
}

// --- advertisement ----------------------------------------------------------------------------

// The three-field overload on fields that need not come from a valid wire string.
Violation check_fields(std::string_view address_hex, std::string_view key,
                       std::string_view remote_address) {
  auto parsed = parse_advertisement(address_hex, key, remote_address);
  bool hex_ok = !address_hex.empty() && address_hex.size() % 2 == 0 &&
                address_hex.size() <= 2 * kMaxAddressBytes;
  for (char c : address_hex) hex_ok = hex_ok && is_hex_digit(c);
  const auto expected_key = reference_decimal(key);
  const auto expected_remote = reference_decimal(remote_address);
  const bool expected = hex_ok && expected_key && expected_remote;
  if (parsed.has_value() != expected) {
    return "parse_advertisement(" + shown(address_hex) + ", " + shown(key) + ", " +
           shown(remote_address) + ") " + (expected ? "refused" : "accepted") +
           " fields the reference " + (expected ? "accepts" : "refuses") +
           (parsed ? std::string() : ": " + parsed.error().message());
  }
  if (!parsed) return check_client_error(parsed.error(), "parse_advertisement(fields)");
  if (parsed->address.empty() || parsed->address.size() > kMaxAddressBytes ||
      hex_encode(parsed->address) != lowercase(address_hex) || parsed->key != *expected_key ||
      parsed->remote_address != *expected_remote) {
    return "parse_advertisement(fields) of " + shown(address_hex) + " " + shown(key) + " " +
           shown(remote_address) + " gave " + shown(to_wire(*parsed));
  }
  const std::string wire = to_wire(*parsed);
  auto again = parse_advertisement(wire);
  if (!again || !(*again == *parsed)) {
    return "to_wire of an accepted advertisement, " + shown(wire) + ", " +
           (again ? "re-parsed to " + shown(to_wire(*again)) : "failed: " + again.error().message());
  }
  return std::nullopt;
}

Violation check_hex(std::span<const std::uint8_t> input, std::string_view text) {
  const std::string encoded = hex_encode(input);
  if (encoded.size() != 2 * input.size()) return "hex_encode gave " + shown(encoded);
  for (char c : encoded) {
    if (!is_hex_digit(c) || c != lower(c)) return "hex_encode gave " + shown(encoded);
  }
  if (!input.empty()) {
    auto decoded = hex_decode(encoded);
    if (!decoded || !std::equal(decoded->begin(), decoded->end(), input.begin(), input.end())) {
      return "hex_decode(hex_encode(bytes)) did not give the bytes back for " + shown(encoded);
    }
  }
  auto decoded = hex_decode(text);
  bool expected = !text.empty() && text.size() % 2 == 0;
  for (char c : text) expected = expected && is_hex_digit(c);
  if (decoded.has_value() != expected) {
    return "hex_decode(" + shown(text) + ") " + (expected ? "refused" : "accepted") +
           " what the reference " + (expected ? "accepts" : "refuses");
  }
  if (!decoded) return check_client_error(decoded.error(), "hex_decode");
  if (hex_encode(*decoded) != lowercase(text)) {
    return "hex_encode(hex_decode(" + shown(text) + ")) gave " + shown(hex_encode(*decoded));
  }
  return std::nullopt;
}

Violation check_decimal(std::string_view text) {
  auto parsed = parse_decimal(text, "field");
  const auto expected = reference_decimal(text);
  if (parsed.has_value() != expected.has_value()) {
    return "parse_decimal(" + shown(text) + ") " + (parsed ? "accepted" : "refused") +
           " what the reference " + (parsed ? "refuses" : "accepts") +
           (parsed ? " (as " + std::to_string(*parsed) + ")" : ": " + parsed.error().message());
  }
  if (!parsed) return check_client_error(parsed.error(), "parse_decimal");
  // The value spelled back must be the input without its leading zeros: anything else wrapped.
  if (std::to_string(*parsed) != canonical_decimal(text)) {
    return "parse_decimal(" + shown(text) + ") gave " + std::to_string(*parsed);
  }
  return std::nullopt;
}

Violation check_wire(std::string_view text) {
  auto parsed = parse_advertisement(text);
  // The reference: three non-empty fields separated by single spaces, no other whitespace.
  bool shape_ok = true;
  for (char c : text) {
    shape_ok = shape_ok && !(c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f');
  }
  const auto fields = split(text, ' ');
  shape_ok = shape_ok && fields.size() == 3;
  for (std::string_view field : fields) shape_ok = shape_ok && !field.empty();
  if (!shape_ok) {
    if (parsed) return "parse_advertisement accepted " + shown(text) + ", not 3 single-spaced fields";
    return check_client_error(parsed.error(), "parse_advertisement");
  }
  auto by_fields = parse_advertisement(fields[0], fields[1], fields[2]);
  if (parsed.has_value() != by_fields.has_value() ||
      (parsed && !(*parsed == *by_fields))) {
    return "parse_advertisement(" + shown(text) + ") and its three-field form disagree";
  }
  if (!parsed) return check_client_error(parsed.error(), "parse_advertisement");
  // One advertisement, one spelling: to_wire gives back the input in canonical form.
  const std::string expected_wire = lowercase(fields[0]) + ' ' + canonical_decimal(fields[1]) +
                                    ' ' + canonical_decimal(fields[2]);
  if (to_wire(*parsed) != expected_wire) {
    return "to_wire(parse_advertisement(" + shown(text) + ")) gave " + shown(to_wire(*parsed)) +
           ", not " + shown(expected_wire);
  }
  return check_fields(fields[0], fields[1], fields[2]);
}

// --- configuration ----------------------------------------------------------------------------

// A TOML basic string holding `text` exactly, in ASCII (TOML 1.0, "String": control characters,
// '"' and '\\' escaped; other non-ASCII code points as \UXXXXXXXX). `text` comes from toml++,
// which only hands out valid UTF-8.
std::string toml_string(std::string_view text) {
  static constexpr char kDigits[] = "0123456789ABCDEF";
  auto escape = [&](std::string& out, std::uint32_t code_point) {
    out += "\\U";
    for (int shift = 28; shift >= 0; shift -= 4) out += kDigits[(code_point >> shift) & 0xf];
  };
  std::string out = "\"";
  for (std::size_t i = 0; i < text.size(); ++i) {
    const auto byte = static_cast<unsigned char>(text[i]);
    if (byte == '"' || byte == '\\') {
      out += '\\';
      out += static_cast<char>(byte);
    } else if (byte < 0x20 || byte == 0x7f) {
      escape(out, byte);
    } else if (byte < 0x80) {
      out += static_cast<char>(byte);
    } else {
      const std::size_t length = byte >= 0xf0 ? 4 : byte >= 0xe0 ? 3 : 2;
      std::uint32_t code_point = byte & (0x7f >> length);
      for (std::size_t k = 1; k < length && i + k < text.size(); ++k) {
        code_point = (code_point << 6) | (static_cast<unsigned char>(text[i + k]) & 0x3f);
      }
      escape(out, code_point);
      i += length - 1;
    }
  }
  return out + '"';
}

std::string toml_array(const std::vector<std::string>& strings) {
  std::string out = "[";
  for (std::size_t i = 0; i < strings.size(); ++i) {
    if (i > 0) out += ", ";
    out += toml_string(strings[i]);
  }
  return out + ']';
}

// Every field of `configuration` as the TOML file Configuration::load documents.
std::string to_toml(const Configuration& configuration) {
  std::string out;
  out += "providers = " + toml_array(configuration.providers) + "\n";
  out += "interfaces = " + toml_array(configuration.interfaces) + "\n";
  if (configuration.bind) out += "bind = " + toml_string(*configuration.bind) + "\n";
  out += "max_in_flight = " + std::to_string(configuration.max_in_flight) + "\n";
  out += "progress_deadline_ms = " + std::to_string(configuration.progress_deadline.count()) + "\n";
  out += "completion_deadline_ms = " + std::to_string(configuration.completion_deadline.count()) +
         "\n";
  out += "crc_threads = " + std::to_string(configuration.crc_threads) + "\n";
  out += std::string("always_register_operands = ") +
         (configuration.always_register_operands ? "true" : "false") + "\n";
  out += "max_piece_bytes = " + std::to_string(configuration.max_piece_bytes) + "\n";
  out += "worker_idle_poll_us = " + std::to_string(configuration.worker_idle_poll.count()) + "\n";
  out += "worker_checksum_max = " + std::to_string(configuration.worker_checksum_max) + "\n";
  return out;
}

bool same(const Configuration& left, const Configuration& right) {
  return left.providers == right.providers && left.interfaces == right.interfaces &&
         left.bind == right.bind && left.max_in_flight == right.max_in_flight &&
         left.progress_deadline == right.progress_deadline &&
         left.completion_deadline == right.completion_deadline &&
         left.crc_threads == right.crc_threads &&
         left.always_register_operands == right.always_register_operands &&
         left.max_piece_bytes == right.max_piece_bytes &&
         left.worker_idle_poll == right.worker_idle_poll &&
         left.worker_checksum_max == right.worker_checksum_max;
}

// --- module arguments -------------------------------------------------------------------------

Violation check_module_options(const std::vector<std::string>& arguments) {
  auto options = module::parse_module_arguments(arguments);
  if (!options) {
    if (options.error().message().empty()) return "parse_module_arguments: an empty error message";
    if (options.error().code() != ErrorCode::kConfiguration) {
      return "parse_module_arguments failed with a code other than kConfiguration";
    }
    // The message is logged at load time: nothing in it may start a line of its own.
    return check_client_error(options.error(), "parse_module_arguments");
  }
  if (arguments.size() % 2 != 0) return "parse_module_arguments accepted an unpaired argument";
  if (auto valid = options->configuration.validate(); !valid) {
    return "parse_module_arguments accepted options validate() refuses: " +
           valid.error().message();
  }
  // The ranges README.md documents (src/protocol/settings.hpp), spelled out again here so that
  // a table change that widens one is caught.
  const Configuration& configuration = options->configuration;
  constexpr std::int64_t kMaxDeadline = std::numeric_limits<std::int32_t>::max();
  if (options->services_per_domain < 1 || options->services_per_domain > 64 ||
      options->max_value_size < 1 || configuration.crc_threads < 1 ||
      configuration.crc_threads > 256 || configuration.progress_deadline.count() < 1 ||
      configuration.progress_deadline.count() > kMaxDeadline ||
      configuration.completion_deadline.count() < 0 ||
      configuration.completion_deadline.count() > kMaxDeadline) {
    return std::string("parse_module_arguments accepted an option out of its range");
  }
  for (const auto* list : {&configuration.providers, &configuration.interfaces}) {
    for (const std::string& item : *list) {
      if (item.empty() || item.find(',') != std::string::npos) {
        return "parse_module_arguments split a list into the item " + shown(item);
      }
    }
  }
  // The last occurrence of a numeric argument wins and is read exactly.
  for (std::size_t index = 0; index + 1 < arguments.size(); index += 2) {
    const std::string& name = arguments[index];
    bool last = true;
    for (std::size_t later = index + 2; later + 1 < arguments.size(); later += 2) {
      last = last && arguments[later] != name;
    }
    if (!last) continue;
    const auto value = reference_decimal(arguments[index + 1]);
    std::optional<std::uint64_t> got;
    if (name == "services-per-domain") got = options->services_per_domain;
    if (name == "max-in-flight") got = configuration.max_in_flight;
    if (name == "max-piece-bytes") got = configuration.max_piece_bytes;
    if (name == "worker-checksum-max") got = configuration.worker_checksum_max;
    if (name == "worker-idle-poll-us") {
      got = static_cast<std::uint64_t>(configuration.worker_idle_poll.count());
    }
    if (name == "progress-deadline-ms") {
      got = static_cast<std::uint64_t>(configuration.progress_deadline.count());
    }
    if (name == "completion-deadline-ms") {
      got = static_cast<std::uint64_t>(configuration.completion_deadline.count());
    }
    if (name == "max-value-size") got = options->max_value_size;
    if (name == "crc-threads") got = configuration.crc_threads;
    if (got && got != value) {
      return "parse_module_arguments read " + name + " " + shown(arguments[index + 1]) + " as " +
             std::to_string(*got);
    }
    if (name == "bind" && configuration.bind != arguments[index + 1]) {
      return "parse_module_arguments did not keep bind " + shown(arguments[index + 1]);
    }
    if (name == "always-register-operands" &&
        configuration.always_register_operands != (arguments[index + 1] == "true")) {
      return "parse_module_arguments read always-register-operands " +
             shown(arguments[index + 1]) + " wrongly";
    }
  }
  return std::nullopt;
}

// The reference for parse_regions: what it must accept and the total it must report.
struct ExpectedRegions {
  std::vector<RemoteRegion> regions;
  std::uint64_t capacity = 0;
};
std::optional<ExpectedRegions> reference_regions(std::span<const std::string_view> fields) {
  if (fields.empty() || fields.size() % 3 != 0 || fields.size() / 3 > kMaxRemoteRegions) {
    return std::nullopt;
  }
  ExpectedRegions out;
  for (std::size_t index = 0; index < fields.size(); index += 3) {
    const auto key = reference_decimal(fields[index]);
    const auto address = reference_decimal(fields[index + 1]);
    const auto length = reference_decimal(fields[index + 2]);
    if (!key || !address || !length || *length == 0) return std::nullopt;
    std::uint64_t end = 0;
    if (__builtin_add_overflow(*address, *length, &end)) return std::nullopt;
    if (__builtin_add_overflow(out.capacity, *length, &out.capacity)) return std::nullopt;
    out.regions.push_back(RemoteRegion{*key, *address, *length});
  }
  return out;
}

Violation compare_regions(const module::ParsedRegions& parsed, const ExpectedRegions& expected,
                          std::string_view what) {
  if (parsed.regions.size() != expected.regions.size() || parsed.capacity != expected.capacity ||
      parsed.regions.size() < 1 || parsed.regions.size() > kMaxRemoteRegions) {
    return std::string(what) + ": " + std::to_string(parsed.regions.size()) +
           " regions holding " + std::to_string(parsed.capacity) + " bytes, expected " +
           std::to_string(expected.regions.size()) + " holding " +
           std::to_string(expected.capacity);
  }
  for (std::size_t i = 0; i < expected.regions.size(); ++i) {
    const RemoteRegion& got = parsed.regions[i];
    const RemoteRegion& want = expected.regions[i];
    if (got.key != want.key || got.address != want.address || got.length != want.length) {
      return std::string(what) + ": region " + std::to_string(i) + " misread";
    }
  }
  return std::nullopt;
}

Violation check_regions(std::span<const std::string_view> fields) {
  auto parsed = module::parse_regions(fields);
  const auto expected = reference_regions(fields);
  if (parsed.has_value() != expected.has_value()) {
    return std::string("parse_regions ") + (parsed ? "accepted" : "refused") +
           " fields the reference " + (parsed ? "refuses" : "accepts") +
           (parsed ? std::string() : ": " + parsed.error().message());
  }
  if (!parsed) return check_client_error(parsed.error(), "parse_regions");
  return compare_regions(*parsed, *expected, "parse_regions");
}

// The reference for a write's options (module/core.hpp, "a write's options"): keywords in any
// order, each once, EX/PX/EXAT/PXAT/KEEPTTL exclusive, NX/XX exclusive, TTL values 1..2^63-1
// milliseconds; stops at the first non-keyword. nullopt: refused.
struct ExpectedOptions {
  module::WriteOptions options;
  std::size_t consumed = 0;
};
std::optional<ExpectedOptions> reference_options(std::span<const std::string_view> fields,
                                                 bool allow_get) {
  ExpectedOptions out;
  bool ttl_seen = false;
  bool condition_seen = false;
  constexpr std::uint64_t kMax = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
  std::size_t index = 0;
  for (; index < fields.size(); ++index) {
    const std::string_view field = fields[index];
    const bool has_value = index + 1 < fields.size();
    if (equals_ignoring_case(field, "CRC")) {
      if (out.options.crc || !has_value) return std::nullopt;
      const auto value = reference_decimal(fields[index + 1]);
      if (!value || *value > std::numeric_limits<std::uint32_t>::max()) return std::nullopt;
      out.options.crc = static_cast<std::uint32_t>(*value);
      ++index;
    } else if (equals_ignoring_case(field, "EX") || equals_ignoring_case(field, "PX") ||
               equals_ignoring_case(field, "EXAT") || equals_ignoring_case(field, "PXAT")) {
      if (ttl_seen || !has_value) return std::nullopt;
      ttl_seen = true;
      const bool seconds = lower(field[0]) == 'e';
      const auto value = reference_decimal(fields[index + 1]);
      if (!value || *value == 0 || *value > (seconds ? kMax / 1000 : kMax)) return std::nullopt;
      out.options.expiry.kind =
          field.size() == 4 ? module::Expiry::Kind::kAbsolute : module::Expiry::Kind::kRelative;
      out.options.expiry.milliseconds = static_cast<std::int64_t>(*value * (seconds ? 1000 : 1));
      ++index;
    } else if (equals_ignoring_case(field, "KEEPTTL")) {
      if (ttl_seen) return std::nullopt;
      ttl_seen = true;
      out.options.expiry.kind = module::Expiry::Kind::kKeep;
    } else if (equals_ignoring_case(field, "NX") || equals_ignoring_case(field, "XX")) {
      if (condition_seen) return std::nullopt;
      condition_seen = true;
      out.options.condition = lower(field[0]) == 'n' ? module::Condition::kIfAbsent
                                                      : module::Condition::kIfPresent;
    } else if (equals_ignoring_case(field, "GET")) {
      if (!allow_get || out.options.get) return std::nullopt;
      out.options.get = true;
    } else {
      break;
    }
  }
  out.consumed = index;
  return out;
}

Violation check_set(std::span<const std::string_view> fields, std::size_t max_value_size,
                    std::optional<module::SetArguments>& accepted) {
  auto parsed = module::parse_set_arguments(fields, max_value_size);
  // The reference: <length> [options] <regions...>, length <= max and <= the regions' total.
  std::optional<module::SetArguments> expected;
  const auto length = fields.empty() ? std::nullopt : reference_decimal(fields[0]);
  if (length && *length <= max_value_size) {
    std::span<const std::string_view> rest = fields.subspan(1);
    const auto options = reference_options(rest, /*allow_get=*/false);
    const auto regions =
        options ? reference_regions(rest.subspan(options->consumed)) : std::nullopt;
    if (regions && regions->capacity >= *length) {
      module::SetArguments set;
      set.length = *length;
      set.options = options->options;
      for (const RemoteRegion& region : regions->regions) set.regions.regions.push_back(region);
      set.regions.capacity = regions->capacity;
      expected = std::move(set);
    }
  }
  if (parsed.has_value() != expected.has_value()) {
    return std::string("parse_set_arguments(max ") + std::to_string(max_value_size) + ") " +
           (parsed ? "accepted" : "refused") + " fields the reference " +
           (parsed ? "refuses" : "accepts") +
           (parsed ? std::string() : ": " + parsed.error().message());
  }
  if (!parsed) return check_client_error(parsed.error(), "parse_set_arguments");
  if (parsed->length != expected->length || parsed->length > max_value_size ||
      !(parsed->options == expected->options) || parsed->regions.capacity < parsed->length) {
    return "parse_set_arguments(max " + std::to_string(max_value_size) + ") read length " +
           std::to_string(parsed->length) + " (expected " + std::to_string(expected->length) +
           ") or its options wrongly";
  }
  ExpectedRegions regions;
  for (std::size_t i = 0; i < expected->regions.regions.size(); ++i) {
    regions.regions.push_back(expected->regions.regions[i]);
  }
  regions.capacity = expected->regions.capacity;
  if (auto violation = compare_regions(parsed->regions, regions, "parse_set_arguments")) {
    return violation;
  }
  accepted = std::move(*parsed);
  return std::nullopt;
}

// DMA.SETPLAIN's options: the same grammar with GET, and nothing may follow them.
Violation check_setplain(std::span<const std::string_view> fields) {
  auto parsed = module::parse_setplain_options(fields);
  const auto expected = reference_options(fields, /*allow_get=*/true);
  const bool accepted = expected && expected->consumed == fields.size();
  if (parsed.has_value() != accepted) {
    return std::string("parse_setplain_options ") + (parsed ? "accepted" : "refused") +
           " fields the reference " + (parsed ? "refuses" : "accepts") +
           (parsed ? std::string() : ": " + parsed.error().message());
  }
  if (!parsed) return check_client_error(parsed.error(), "parse_setplain_options");
  if (!(*parsed == expected->options)) return std::string("parse_setplain_options misread options");
  return std::nullopt;
}

}  // namespace

Violation advertisement(std::span<const std::uint8_t> input) {
  const std::string_view text = as_text(input);
  if (auto violation = check_hex(input, text)) return violation;
  if (auto violation = check_decimal(text)) return violation;
  if (auto violation = check_wire(text)) return violation;
  // The three-field overload on fields cut at newlines, which may hold anything else.
  const auto lines = split(text, '\n');
  if (lines.size() == 3) return check_fields(lines[0], lines[1], lines[2]);
  return std::nullopt;
}

Violation configuration(std::span<const std::uint8_t> input) {
  const std::string_view text = as_text(input);
  auto parsed = Configuration::parse_toml(text);
  if (!parsed) {
    const std::string& message = parsed.error().message();
    if (parsed.error().code() != ErrorCode::kConfiguration) {
      return "parse_toml failed with a code other than kConfiguration: " + shown(message);
    }
    if (message.empty()) return std::string("parse_toml: an empty error message");
    for (char c : message) {
      const auto byte = static_cast<unsigned char>(c);
      if (byte < 0x20 || byte >= 0x7f) {
        return "parse_toml: an error message with a non-printable byte: " + shown(message);
      }
    }
    return std::nullopt;
  }
  if (auto valid = parsed->validate(); !valid) {
    return "parse_toml accepted a configuration validate() refuses: " + valid.error().message();
  }
  const std::string written = to_toml(*parsed);
  auto again = Configuration::parse_toml(written);
  if (!again) {
    return "an accepted configuration written back as TOML does not parse: " +
           again.error().message() + "\n" + written;
  }
  if (!same(*parsed, *again)) {
    return "an accepted configuration written back as TOML parses differently:\n" + written +
           "---\n" + to_toml(*again);
  }
  return std::nullopt;
}

Violation module_arguments(std::span<const std::uint8_t> input) {
  const std::vector<std::string_view> fields = split(as_text(input), ' ');
  const std::vector<std::string> arguments(fields.begin(), fields.end());
  if (auto violation = check_module_options(arguments)) return violation;
  if (auto violation = check_regions(fields)) return violation;

  std::optional<module::SetArguments> small;
  std::optional<module::SetArguments> large;
  if (auto violation = check_set(fields, 64, small)) return violation;
  if (auto violation = check_set(fields, module::kDefaultMaxValueSize, large)) return violation;
  // A larger max-value-size never refuses what a smaller one accepts.
  if (auto violation = check_setplain(fields)) return violation;
  if (small && (!large || large->length != small->length || !(large->options == small->options))) {
    return std::string("parse_set_arguments accepted under max-value-size 64 but not under the default");
  }
  return std::nullopt;
}

void run_or_abort(Violation (*target)(std::span<const std::uint8_t>), const std::uint8_t* data,
                  std::size_t size) {
  // libFuzzer may pass a null pointer with size 0; a span of it is still valid.
  const Violation violation = target(std::span<const std::uint8_t>(data, size));
  if (violation) {
    std::fprintf(stderr, "invariant violated: %s\n", violation->c_str());
    std::abort();
  }
}

}  // namespace dma::fuzz
