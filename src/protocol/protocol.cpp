#include "dma/protocol.hpp"

#include <isa-l/crc.h>

#include <array>
#include <charconv>
#include <climits>
#include <system_error>

namespace dma {

namespace {

// A byte of an address, for "non-hex character '<c>'" errors.
std::string quote_char(char c) { return '\'' + escape_for_log(std::string_view(&c, 1)) + '\''; }

// The value of one hex digit, or -1.
int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool is_whitespace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

}  // namespace

std::string hex_encode(std::span<const std::uint8_t> bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string text;
  text.reserve(bytes.size() * 2);
  for (std::uint8_t byte : bytes) {
    text += kDigits[byte >> 4];
    text += kDigits[byte & 0xf];
  }
  return text;
}

Result<std::vector<std::uint8_t>> hex_decode(std::string_view text) {
  if (text.empty()) return fail(ErrorCode::kInvalidArgument, "address is empty");
  if (text.size() % 2 != 0) {
    return fail(ErrorCode::kInvalidArgument,
                "address has an odd number of hex digits (" + std::to_string(text.size()) + ")");
  }
  std::vector<std::uint8_t> bytes;
  bytes.reserve(text.size() / 2);
  for (std::size_t i = 0; i < text.size(); i += 2) {
    const int high = hex_value(text[i]);
    const int low = hex_value(text[i + 1]);
    if (high < 0 || low < 0) {
      const std::size_t position = high < 0 ? i : i + 1;
      return fail(ErrorCode::kInvalidArgument, "address has a non-hex character " +
                                                   quote_char(text[position]) + " at offset " +
                                                   std::to_string(position));
    }
    bytes.push_back(static_cast<std::uint8_t>((high << 4) | low));
  }
  return bytes;
}

std::string escape_for_log(std::string_view text) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte >= 0x7f || c == '"' || c == '\\') {
      out += "\\x";
      out += kDigits[byte >> 4];
      out += kDigits[byte & 0xf];
    } else {
      out += c;
    }
  }
  return out;
}

std::string quote_for_log(std::string_view text, std::size_t max_bytes) {
  std::string out = '"' + escape_for_log(text.substr(0, max_bytes)) + '"';
  if (text.size() > max_bytes) out += "... (" + std::to_string(text.size()) + " bytes)";
  return out;
}

Result<std::uint64_t> parse_decimal(std::string_view text, std::string_view what) {
  if (text.empty()) return fail(ErrorCode::kInvalidArgument, std::string(what) + " is empty");
  std::uint64_t value = 0;
  const char* const end = text.data() + text.size();
  const auto [stopped, error] = std::from_chars(text.data(), end, value, 10);
  // from_chars consumes the whole run of leading digits even when it overflows, so an overflow
  // is reported as such even with junk after the digits ("99999999999999999999x"), as the
  // digit-by-digit parser this replaces did.
  if (error == std::errc::result_out_of_range) {
    return fail(ErrorCode::kInvalidArgument, std::string(what) + " " +
                                                 quote_for_log(text, kMaxQuotedBytes) +
                                                 " does not fit in 64 bits");
  }
  if (error != std::errc() || stopped != end) {
    return fail(ErrorCode::kInvalidArgument, std::string(what) + " " +
                                                 quote_for_log(text, kMaxQuotedBytes) +
                                                 " is not a decimal number");
  }
  return value;
}

std::string to_wire(const Advertisement& advertisement) {
  std::string wire = hex_encode(advertisement.address);
  wire += ' ';
  wire += std::to_string(advertisement.key);
  wire += ' ';
  wire += std::to_string(advertisement.remote_address);
  return wire;
}

Result<Advertisement> parse_advertisement(std::string_view wire) {
  // Anything but exactly one space between fields is refused rather than tolerated, so that one
  // advertisement has exactly one spelling and a truncated or padded one is caught here.
  if (wire.empty()) return fail(ErrorCode::kInvalidArgument, "advertisement is empty");
  for (std::size_t i = 0; i < wire.size(); ++i) {
    const char c = wire[i];
    if (!is_whitespace(c)) continue;
    std::string problem;
    if (c != ' ') {
      problem = "whitespace " + quote_char(c);
    } else if (i == 0) {
      problem = "a leading space";
    } else if (i + 1 == wire.size()) {
      problem = "a trailing space";
    } else if (wire[i + 1] == ' ') {
      problem = "a double space";
    } else {
      continue;
    }
    return fail(ErrorCode::kInvalidArgument,
                "advertisement has " + problem + " at offset " + std::to_string(i) +
                    "; fields must be separated by single spaces");
  }

  std::string_view fields[3];
  std::size_t count = 0;
  std::size_t start = 0;
  while (true) {
    const std::size_t end = wire.find(' ', start);
    const std::string_view field =
        wire.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start);
    if (count < 3) fields[count] = field;
    ++count;
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  if (count != 3) {
    return fail(ErrorCode::kInvalidArgument,
                "advertisement must have 3 fields \"<address-hex> <rkey> <remote-address>\", got " +
                    std::to_string(count));
  }
  return parse_advertisement(fields[0], fields[1], fields[2]);
}

Result<Advertisement> parse_advertisement(std::string_view address_hex, std::string_view key,
                                          std::string_view remote_address) {
  // Checked before decoding so that a hostile length costs nothing.
  if (address_hex.size() > 2 * kMaxAddressBytes) {
    return fail(ErrorCode::kInvalidArgument,
                "address has " + std::to_string(address_hex.size()) + " hex digits; at most " +
                    std::to_string(2 * kMaxAddressBytes) + " (" +
                    std::to_string(kMaxAddressBytes) + " bytes) are allowed");
  }
  Advertisement advertisement;
  DMA_TRY_ASSIGN(advertisement.address, hex_decode(address_hex));
  DMA_TRY_ASSIGN(advertisement.key, parse_decimal(key, "rkey"));
  DMA_TRY_ASSIGN(advertisement.remote_address, parse_decimal(remote_address, "remote address"));
  return advertisement;
}

std::uint32_t crc32c_extend(std::uint32_t crc, std::span<const std::byte> bytes) noexcept {
  // isa-l's crc32_iscsi neither pre- nor post-inverts, and takes an int length: invert around it
  // and feed it at most INT_MAX bytes at a time. An empty span may carry a null pointer, which is
  // never handed over.
  std::uint32_t state = crc ^ 0xFFFFFFFFu;
  const auto* data = reinterpret_cast<const unsigned char*>(bytes.data());
  std::size_t left = bytes.size();
  while (left > 0) {
    const std::size_t chunk = left < static_cast<std::size_t>(INT_MAX) ? left : INT_MAX;
    // crc32_iscsi's buffer parameter is not const-qualified but it only reads.
    state = crc32_iscsi(const_cast<unsigned char*>(data), static_cast<int>(chunk), state);
    data += chunk;
    left -= chunk;
  }
  return state ^ 0xFFFFFFFFu;
}

std::uint32_t crc32c(std::span<const std::byte> bytes) noexcept { return crc32c_extend(0, bytes); }

namespace {
// Polynomials modulo the Castagnoli polynomial, in the CRC's own reflected order: bit 31 is the
// coefficient of x^0, bit 0 that of x^31.
constexpr std::uint32_t kCastagnoliReflected = 0x82F63B78u;
constexpr std::uint32_t kOne = 0x80000000u;  // x^0

constexpr std::uint32_t multiply_mod(std::uint32_t a, std::uint32_t b) noexcept {
  std::uint32_t product = 0;
  for (std::uint32_t term = kOne; term != 0; term >>= 1) {  // a's x^0, x^1, ... x^31
    if ((a & term) != 0) product ^= b;
    b = (b & 1u) != 0 ? (b >> 1) ^ kCastagnoliReflected : b >> 1;  // b * x
  }
  return product;
}

// x^(2^k) mod P for k = 0..66: enough for x^(8n) with any 64-bit n.
constexpr std::array<std::uint32_t, 67> kPowersOfX = [] {
  std::array<std::uint32_t, 67> powers{};
  powers[0] = kOne >> 1;  // x^1
  for (std::size_t k = 1; k < powers.size(); ++k) {
    powers[k] = multiply_mod(powers[k - 1], powers[k - 1]);
  }
  return powers;
}();
}  // namespace

std::uint32_t crc32c_combine(std::uint32_t crc_a, std::uint32_t crc_b,
                             std::uint64_t length_b) noexcept {
  // Appending n bytes to a multiplies a's remainder by x^(8n); the pre- and post-inversion
  // cancel out the same way they do for zlib's crc32_combine.
  std::uint32_t shift = kOne;
  for (std::size_t k = 3; length_b != 0; length_b >>= 1, ++k) {
    if ((length_b & 1u) != 0) shift = multiply_mod(shift, kPowersOfX[k]);
  }
  return multiply_mod(shift, crc_a) ^ crc_b;
}

}  // namespace dma
