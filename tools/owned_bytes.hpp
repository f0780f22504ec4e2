// A transfer's local operand owning its bytes: the source of a write, the landing of a read.
// Shared by dma-cli and dma-demo.
#pragma once

#include <cstddef>
#include <span>
#include <utility>
#include <vector>

#include "dma/service.hpp"

namespace dma::tools {

class OwnedBytes : public Operands {
 public:
  explicit OwnedBytes(std::vector<std::byte> bytes = {}) : bytes_(std::move(bytes)) {}
  std::span<const std::byte> source() override { return bytes_; }
  std::span<std::byte> allocate(std::size_t length) override {
    bytes_.resize(length);
    return bytes_;
  }
  const std::vector<std::byte>& bytes() const noexcept { return bytes_; }

 private:
  std::vector<std::byte> bytes_;
};

}  // namespace dma::tools
