// OwnedBytes: a transfer's local operand that owns its bytes, the source of a write and the
// landing of a read (Operands, dma/service.hpp). dma-cli's initiator and the tests' transfers
// (tests/fixtures.hpp names it Buffer) use it.
//
// Ownership: owns `bytes`; the service holds it for the transfer's life and hands it back in
// the completion. Thread-safety: none; the service touches it only while the transfer runs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "dma/service.hpp"

namespace dma::support {

class OwnedBytes : public Operands {
 public:
  explicit OwnedBytes(std::vector<std::byte> initial = {}, std::uint64_t label = 0)
      : bytes(std::move(initial)), tag(label) {}
  // An empty value still needs a valid pointer: a zero-length span of a static byte.
  std::span<const std::byte> source() override {
    static const std::byte empty{};
    return bytes.empty() ? std::span<const std::byte>(&empty, 0)
                         : std::span<const std::byte>(bytes);
  }
  std::span<std::byte> allocate(std::size_t length) override {
    bytes.resize(length);
    return bytes;
  }

  std::vector<std::byte> bytes;
  // The caller's label, to tell completions apart (tests); unused by the service.
  std::uint64_t tag;
};

}  // namespace dma::support
