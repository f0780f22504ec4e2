// The advertisement a client sends inside an RPC, its wire form, and CRC32C.
//
// Wire form: three fields, "<address-hex> <rkey> <remote-address>", where the address is the
// client's fabric address in lowercase hex (either case accepted when parsing), and the key and
// remote address are strict unsigned decimal (no sign, no whitespace, no leading '+', no
// overflow). Nothing here touches libfabric, so it is safe to use from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dma/export.hpp"
#include "dma/result.hpp"

namespace dma {

// The most bytes a fabric address may have here. efa's is 32, an IPv6 sockaddr 28; the bound
// keeps a hostile advertisement from making us allocate or hand libfabric anything large.
inline constexpr std::size_t kMaxAddressBytes = 64;

// Where a client's exposed buffer is, as the server's initiator addresses it.
struct Advertisement {
  std::vector<std::uint8_t> address;  // the client's fabric address (fi_getname bytes)
  std::uint64_t key = 0;              // the buffer's remote key
  // The buffer as the provider addresses it: its virtual address under FI_MR_VIRT_ADDR, else
  // an offset into the registration (usually 0).
  std::uint64_t remote_address = 0;

  bool operator==(const Advertisement&) const = default;
};

// Lowercase hex of bytes.
DMA_EXPORT std::string hex_encode(std::span<const std::uint8_t> bytes);
// Bytes of hex text, either case. Errors name the offending position.
DMA_EXPORT Result<std::vector<std::uint8_t>> hex_decode(std::string_view text);

// A strict unsigned decimal: digits only, at least one, no sign or whitespace, fits in 64 bits
// (std::from_chars, which takes no sign, skips no whitespace and reports overflow). `what` names
// the field in the error: "<what> is empty", "<what> \"<text>\" is not a decimal number" or
// "... does not fit in 64 bits", the text quoted with quote_for_log(text, kMaxQuotedBytes).
DMA_EXPORT Result<std::uint64_t> parse_decimal(std::string_view text, std::string_view what);

// ---- text from outside in error messages ----------------------------------------------------
//
// Error messages end up in RESP error replies and log lines. A CR/LF from a hostile
// advertisement, module argument or configuration key would split the reply or forge a log line,
// and a megabyte of it would flood the log. So every message quoting outside text goes through
// these two, and nowhere else writes their escaping again.

// How much of a field parse errors quote before clipping it.
inline constexpr std::size_t kMaxQuotedBytes = 40;

// `text` with every byte outside printable ASCII (0x20..0x7e), and '"' and '\', shown as \xNN
// (lowercase hex), so that the result is one line of printable ASCII from which the input can be
// read back unambiguously.
DMA_EXPORT std::string escape_for_log(std::string_view text);
// escape_for_log(text) inside double quotes. Past `max_bytes` of input the rest is left out and
// "... (<size> bytes)" follows the closing quote.
DMA_EXPORT std::string quote_for_log(std::string_view text,
                          std::size_t max_bytes = std::string_view::npos);

// "<hex> <key> <remote-address>" (single spaces).
DMA_EXPORT std::string to_wire(const Advertisement& advertisement);
// Parses the wire form; also accepts the three fields already split (from RPC arguments).
DMA_EXPORT Result<Advertisement> parse_advertisement(std::string_view wire);
DMA_EXPORT Result<Advertisement> parse_advertisement(std::string_view address_hex, std::string_view key,
                                          std::string_view remote_address);

// CRC32C (Castagnoli), as iSCSI and ext4 use it: crc32c("123456789") == 0xE3069283.
// `crc32c_extend(crc32c(a), b) == crc32c(a ++ b)`.
DMA_EXPORT std::uint32_t crc32c(std::span<const std::byte> bytes) noexcept;
DMA_EXPORT std::uint32_t crc32c_extend(std::uint32_t crc, std::span<const std::byte> bytes) noexcept;
// The checksum of `a ++ b` from `crc32c(a)`, `crc32c(b)` and b's length, without the bytes: so
// pieces of one buffer can be checksummed apart (on several threads, as they arrive) and joined.
DMA_EXPORT std::uint32_t crc32c_combine(std::uint32_t crc_a, std::uint32_t crc_b,
                                        std::uint64_t length_b) noexcept;
inline std::uint32_t crc32c(std::string_view text) noexcept {
  return crc32c(std::as_bytes(std::span<const char>(text.data(), text.size())));
}

}  // namespace dma
