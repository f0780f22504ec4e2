// What server and client sides share about a fabric: a peer's fabric address, the regions of
// its exposed memory a transfer names, what an opened endpoint is (EndpointDescription), and which
// domains a configuration can open. Plain values and one query; no libfabric types, so a client
// that only exposes memory (dma/target.hpp) does not pull in the server API (dma/service.hpp).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

#include "dma/export.hpp"
#include "dma/configuration.hpp"
#include "dma/result.hpp"

namespace dma {

// One piece of the peer's exposed memory: its key, its address as the provider addresses it
// (virtual address or offset, as advertised), and how many bytes of it this transfer may use.
struct RemoteRegion {
  std::uint64_t key = 0;
  std::uint64_t address = 0;
  std::uint64_t length = 0;
};

// Up to kMaxRemoteRegions regions forming one destination (GET) or source (SET), in order.
// The first few live inline so a single-region transfer allocates nothing.
class RemoteRegions {
 public:
  static constexpr std::size_t kInline = 2;
  RemoteRegions() = default;
  RemoteRegions(std::initializer_list<RemoteRegion> regions) {
    for (const auto& region : regions) push_back(region);
  }
  void push_back(const RemoteRegion& region) {
    if (size_ < kInline) {
      inline_[size_] = region;
    } else {
      if (size_ == kInline) spill_.assign(inline_.begin(), inline_.end());
      spill_.push_back(region);
    }
    ++size_;
  }
  std::size_t size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }
  const RemoteRegion& operator[](std::size_t index) const noexcept {
    return size_ <= kInline ? inline_[index] : spill_[index];
  }
  void clear() noexcept {
    size_ = 0;
    spill_.clear();
  }

 private:
  std::array<RemoteRegion, kInline> inline_{};
  std::vector<RemoteRegion> spill_;
  std::size_t size_ = 0;
};

inline constexpr std::size_t kMaxRemoteRegions = 256;

// A fabric address held inline (no allocation per transfer).
class DMA_EXPORT FabricAddress {
 public:
  static constexpr std::size_t kCapacity = 64;
  FabricAddress() = default;
  // Fails if `bytes` is longer than kCapacity.
  static Result<FabricAddress> from(std::span<const std::uint8_t> bytes);
  std::span<const std::uint8_t> bytes() const noexcept { return {bytes_.data(), size_}; }
  bool empty() const noexcept { return size_ == 0; }

 private:
  std::array<std::uint8_t, kCapacity> bytes_{};
  std::size_t size_ = 0;
};

// What libfabric gave us, decoded for humans (dma-info, DMA.INFO).
struct DMA_EXPORT EndpointDescription {
  std::string provider;      // e.g. "tcp;ofi_rxm"
  std::string fabric;        // e.g. "127.0.0.1/32"
  std::string domain;        // e.g. "lo"
  std::string address_format;  // e.g. "FI_SOCKADDR_IN"
  std::uint32_t address_format_value = 0;
  std::uint64_t mr_mode = 0;
  std::string mr_mode_flags;  // e.g. "FI_MR_VIRT_ADDR|FI_MR_PROV_KEY"
  std::uint64_t caps = 0;
  std::string caps_flags;     // e.g. "FI_RMA|FI_READ|FI_WRITE"
  std::size_t tx_size = 0;
  std::size_t max_msg_size = 0;
  std::size_t max_in_flight = 0;  // the cap actually used, after clamping
  bool virtual_addresses = false;  // FI_MR_VIRT_ADDR: remote addresses are virtual addresses
  bool provider_keys = false;      // FI_MR_PROV_KEY: the provider picks keys
  std::string to_string() const;
};

// The distinct domain names `configuration` can open, in libfabric's order, for each provider
// in preference order (provider name, domain name).
struct DomainChoice {
  std::string provider;
  std::string domain;
};
DMA_EXPORT Result<std::vector<DomainChoice>> discover_domains(const Configuration& configuration);

}  // namespace dma
