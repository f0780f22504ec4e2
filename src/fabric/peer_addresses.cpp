#include "fabric/peer_addresses.hpp"

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdio>
#include <cstring>

namespace dma::internal {
namespace {
std::string_view as_view(std::span<const std::uint8_t> bytes) {
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}
}  // namespace

AddressFormat address_format_from(std::uint32_t fi_addr_format) noexcept {
  return fi_addr_format == FI_ADDR_EFA ? AddressFormat::kEfa : AddressFormat::kOpaque;
}

Result<std::size_t> identity_length(AddressFormat format, std::span<const std::uint8_t> address) {
  if (address.empty()) return fail(ErrorCode::kInvalidArgument, "peer address is empty");
  if (format == AddressFormat::kEfa) {
    if (address.size() != kEfaAddressBytes) {
      return fail(ErrorCode::kInvalidArgument,
                  "efa address is " + std::to_string(address.size()) + " bytes, not " +
                      std::to_string(kEfaAddressBytes));
    }
    return kEfaIdentityBytes;
  }
  return address.size();
}

Status check_address(std::uint32_t fi_addr_format, std::span<const std::uint8_t> address) {
  if (address.empty()) return fail(ErrorCode::kInvalidArgument, "peer address is empty");
  auto family = [&]() -> int {
    sa_family_t value = 0;
    if (address.size() < sizeof(value)) return -1;
    std::memcpy(&value, address.data(), sizeof(value));
    return value;
  };
  auto refuse = [&](const std::string& expected) -> Status {
    return fail(ErrorCode::kInvalidArgument,
                "peer address is " + std::to_string(address.size()) +
                    " bytes of address family " + std::to_string(family()) +
                    "; this provider takes " + expected);
  };
  switch (fi_addr_format) {
    case FI_SOCKADDR_IN:
      if (address.size() != sizeof(sockaddr_in) || family() != AF_INET) {
        return refuse("a 16-byte AF_INET sockaddr");
      }
      return {};
    case FI_SOCKADDR_IN6:
      if (address.size() != sizeof(sockaddr_in6) || family() != AF_INET6) {
        return refuse("a 28-byte AF_INET6 sockaddr");
      }
      return {};
    case FI_SOCKADDR:
      if ((address.size() == sizeof(sockaddr_in) && family() == AF_INET) ||
          (address.size() == sizeof(sockaddr_in6) && family() == AF_INET6)) {
        return {};
      }
      return refuse("an AF_INET or AF_INET6 sockaddr");
    case FI_ADDR_EFA:
      if (address.size() != kEfaAddressBytes) return refuse("a 32-byte efa address");
      return {};
    default:
      return {};
  }
}

RegisteredAddress::~RegisteredAddress() {
  // shm: the slot of a peer whose process has died is never removed (so never reused). Removing
  // it (smr_av_remove) while shm still holds state for that peer wedged the endpoint and then
  // crashed live clients inside shm's progress: in the 120 s soak with a client killed every
  // 2 s, keeping these slots took the endpoint from 2-5 wedges (and 28 s stalls) per run to
  // none (docs/RELIABILITY.md, "Soak"). It costs one slot of the address vector per client
  // that died connected; a live client's departure still frees its slot.
  if (owner_ && owner_->exited()) return;
  fi_addr_t handle = handle_;
  if (int code = fi_av_remove(address_vector_, &handle, 1, 0); code != 0) {
    std::fprintf(stderr, "dma: fi_av_remove failed releasing a peer address: %s (%d)\n",
                 fi_strerror(-code), code);
  }
}

Result<std::shared_ptr<RegisteredAddress>> PeerAddresses::handle(
    std::uint64_t client_id, std::span<const std::uint8_t> address) {
  DMA_TRY_ASSIGN(const std::size_t length, identity_length(format_, address));
  DMA_TRY(check_address(fi_addr_format_, address));
  const std::string_view identity = as_view(address.first(length));
  const std::string_view whole = as_view(address);

  // The hot path: this client already holds exactly this address.
  if (auto held = by_client_.find(client_id); held != by_client_.end()) {
    auto indexed = by_identity_.find(identity);
    if (indexed != by_identity_.end() && indexed->second.bytes == whole &&
        indexed->second.entry.lock() == held->second) {
      return held->second;
    }
  }

  if (auto indexed = by_identity_.find(identity); indexed != by_identity_.end()) {
    std::shared_ptr<RegisteredAddress> entry = indexed->second.entry.lock();
    if (entry && indexed->second.bytes == whole) {
      // Shared with other clients. Replacing this client's previous entry drops it (and
      // removes it from the vector if this client was its last holder).
      by_client_[client_id] = entry;
      return entry;
    }
    if (entry) {
      // Same slot, different bytes: the old incarnation is dead. Evict it and everyone on it,
      // so the provider never holds two entries for one slot.
      std::size_t evicted = 0;
      for (auto cursor = by_client_.begin(); cursor != by_client_.end();) {
        if (cursor->second == entry) {
          cursor = by_client_.erase(cursor);
          ++evicted;
        } else {
          ++cursor;
        }
      }
      std::fprintf(stderr,
                   "dma: client %llu advertised a recycled endpoint slot; released the stale "
                   "entry and %zu client(s) on it\n",
                   static_cast<unsigned long long>(client_id), evicted);
      entry.reset();  // the last holder: this is the removal
    }
    by_identity_.erase(indexed);
  }
  // This client's previous entry goes before its new one comes in.
  by_client_.erase(client_id);

  DMA_TRY_ASSIGN(const fi_addr_t inserted, insert(address));
  auto entry = std::make_shared<RegisteredAddress>(address_vector_, inserted,
                                                   shm_address_owner(address), address);
  sweep();
  by_identity_.emplace(std::string(identity), Indexed{std::string(whole), entry});
  by_client_[client_id] = entry;
  return entry;
}

std::shared_ptr<RegisteredAddress> PeerAddresses::find(std::uint64_t client_id) const {
  auto held = by_client_.find(client_id);
  return held == by_client_.end() ? nullptr : held->second;
}

void PeerAddresses::release(std::uint64_t client_id) { by_client_.erase(client_id); }

void PeerAddresses::clear() {
  by_client_.clear();
  by_identity_.clear();
}

void PeerAddresses::sweep() {
  if (by_identity_.size() < sweep_at_) return;
  std::erase_if(by_identity_, [](const auto& item) { return item.second.entry.expired(); });
  sweep_at_ = std::max(kMinimumSweep, by_identity_.size() * 2);
}

long PeerAddresses::holders(std::span<const std::uint8_t> address) const {
  Result<std::size_t> length = identity_length(format_, address);
  if (!length) return 0;
  auto indexed = by_identity_.find(as_view(address.first(*length)));
  return indexed == by_identity_.end() ? 0 : indexed->second.entry.use_count();
}

void PeerAddresses::insert_dead_key(std::span<const std::uint8_t> address) {
  by_identity_.emplace(std::string(as_view(address)), Indexed{std::string(as_view(address)), {}});
}

Result<fi_addr_t> PeerAddresses::insert(std::span<const std::uint8_t> address) {
  fi_addr_t handle = FI_ADDR_NOTAVAIL;
  const int inserted = fi_av_insert(address_vector_, address.data(), 1, &handle, 0, nullptr);
  if (inserted != 1) {
    if (inserted < 0) return fail(fabric_error("fi_av_insert", inserted));
    return fail(ErrorCode::kFabric,
                "fi_av_insert inserted " + std::to_string(inserted) + " of 1 addresses");
  }
  return handle;
}

}  // namespace dma::internal
