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
std::string hex_encode(std::span<const std::uint8_t> bytes);
// Bytes of hex text, either case. Errors name the offending position.
Result<std::vector<std::uint8_t>> hex_decode(std::string_view text);

// A strict unsigned decimal: digits only, at least one, no sign or whitespace, fits in 64 bits.
// `what` names the field in the error ("rkey", "length").
Result<std::uint64_t> parse_decimal(std::string_view text, std::string_view what);

// "<hex> <key> <remote-address>" (single spaces).
std::string to_wire(const Advertisement& advertisement);
// Parses the wire form; also accepts the three fields already split (from RPC arguments).
Result<Advertisement> parse_advertisement(std::string_view wire);
Result<Advertisement> parse_advertisement(std::string_view address_hex, std::string_view key,
                                          std::string_view remote_address);

// CRC32C (Castagnoli), as iSCSI and ext4 use it: crc32c("123456789") == 0xE3069283.
// `crc32c_extend(crc32c(a), b) == crc32c(a ++ b)`.
std::uint32_t crc32c(std::span<const std::byte> bytes) noexcept;
std::uint32_t crc32c_extend(std::uint32_t crc, std::span<const std::byte> bytes) noexcept;
inline std::uint32_t crc32c(std::string_view text) noexcept {
  return crc32c(std::as_bytes(std::span<const char>(text.data(), text.size())));
}

}  // namespace dma
