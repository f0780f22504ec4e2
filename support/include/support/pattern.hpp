// The deterministic byte pattern every test, tool and benchmark uses, so that a seed named on
// one side of a transfer checks the bytes on the other (dma-cli's `fill`/`verify`, the fabric
// benchmark's targets, tests' expected values). A xorshift32 stream: a different sequence per
// seed, so misplaced or stale bytes are caught. Plain functions; no state, thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace dma::support {

class PatternStream {
 public:
  explicit PatternStream(std::uint32_t seed) : state_(seed * 2654435761u + 1) {}
  std::byte next() noexcept {
    state_ ^= state_ << 13;
    state_ ^= state_ >> 17;
    state_ ^= state_ << 5;
    return static_cast<std::byte>(state_);
  }

 private:
  std::uint32_t state_;
};

// Overwrites `bytes` with the pattern of `seed` (its first bytes.size() bytes).
inline void fill_pattern(std::span<std::byte> bytes, std::uint32_t seed) noexcept {
  PatternStream stream(seed);
  for (std::byte& byte : bytes) byte = stream.next();
}

inline std::vector<std::byte> make_pattern(std::size_t length, std::uint32_t seed) {
  std::vector<std::byte> bytes(length);
  fill_pattern(bytes, seed);
  return bytes;
}

// The offset of the first byte of `bytes` that differs from the pattern of `seed`, if any.
inline std::optional<std::size_t> find_mismatch(std::span<const std::byte> bytes,
                                                std::uint32_t seed) noexcept {
  PatternStream stream(seed);
  for (std::size_t offset = 0; offset < bytes.size(); ++offset) {
    if (bytes[offset] != stream.next()) return offset;
  }
  return std::nullopt;
}

}  // namespace dma::support
