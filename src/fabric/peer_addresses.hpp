// Private: the address-vector entries of one endpoint, refcounted by client id.
//
// fi_av_insert is keyed by address, but a client may hold several connections, and several
// clients may share one address: an entry is removed (fi_av_remove) when the last client id
// holding it lets go.
//
// On efa an address is not an identifier. Its 32 bytes are GID (16), QPN (2), pad (2), QKEY (4)
// and more; the device hands a closed endpoint's QPN to the next endpoint opened on the card, so
// GID+QPN names the endpoint *slot* and the QKEY only tells its incarnations apart. The
// provider's reverse table cannot hold two entries for one slot (a debug libfabric aborts in
// efa_av_reverse_av_add; a release one carries on with the table wrong), and the incarnation
// advertised earlier is dead or the device would not have reissued its QPN. So on efa entries
// are keyed by the first 18 bytes, and a new incarnation evicts the old entry and every client
// still on it before it is inserted.
//
// Ownership: owned by the thread that owns the endpoint; not thread-safe. Must be cleared (or
// destroyed) before the address vector closes.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>

#include "fabric/fid.hpp"
#include "fabric/peer_process.hpp"

namespace dma::internal {

enum class AddressFormat : std::uint8_t {
  kEfa,     // identity is GID + QPN, the first 18 of 32 bytes
  kOpaque,  // every byte is the identity
};

inline constexpr std::size_t kEfaAddressBytes = 32;   // sizeof(struct efa_ep_addr)
inline constexpr std::size_t kEfaIdentityBytes = 18;  // GID[16] + QPN(u16)
inline constexpr std::size_t kMinimumSweep = 64;

AddressFormat address_format_from(std::uint32_t fi_addr_format) noexcept;
// How many leading bytes name the endpoint slot. efa rejects any length but 32, because
// fi_av_insert reads 32 bytes whatever was advertised.
Result<std::size_t> identity_length(AddressFormat format, std::span<const std::uint8_t> address);
// Checks an address's size and family against the provider's fi_info.addr_format
// (FI_SOCKADDR_IN: 16 bytes of AF_INET, FI_SOCKADDR_IN6: 28 bytes of AF_INET6, FI_SOCKADDR:
// either, FI_ADDR_EFA: 32 bytes); other formats only need to be non-empty.
Status check_address(std::uint32_t fi_addr_format, std::span<const std::uint8_t> address);

// One address-vector entry; removed from the vector when the last holder drops it. For an shm
// address it also watches the process that owns it (peer_process.hpp).
class RegisteredAddress {
 public:
  RegisteredAddress(fid_av* address_vector, fi_addr_t handle,
                    const std::optional<ShmOwner>& owner = std::nullopt,
                    std::span<const std::uint8_t> address = {})
      : address_vector_(address_vector), handle_(handle) {
    if (owner) owner_.emplace(*owner, address);
  }
  ~RegisteredAddress();
  RegisteredAddress(const RegisteredAddress&) = delete;
  RegisteredAddress& operator=(const RegisteredAddress&) = delete;
  fi_addr_t handle() const noexcept { return handle_; }
  // The process behind a same-host address, or nullptr when the address does not name one.
  const PeerProcess* owner() const noexcept { return owner_ ? &*owner_ : nullptr; }

  // The worker's view of whether this peer takes posts, kept by the worker thread: its pieces
  // in flight (not expired), and since when every post to it has answered -FI_EAGAIN while none
  // were. The progress deadline runs on this clock, not an operation's: measured on shm, an
  // operation sent to the back of a deep queue by one -FI_EAGAIN otherwise failed as
  // "unreachable" at its next turn though the peer had taken posts all along (3,800 of 4,000
  // with a 20 ms deadline).
  struct Progress {
    std::size_t live_pieces = 0;
    std::optional<std::chrono::steady_clock::time_point> refusing_since;
    std::chrono::steady_clock::time_point last_refusal;  // a gap longer than the deadline
                                                          // restarts the clock
    // shm: a post refused before any was taken has put our name (a connection request) in the
    // peer's command queue. When the peer's progress reads it, it maps our region through that
    // name and reads it, so our endpoint must not close until a post to this peer has been
    // taken (shm takes none before the request is read): closed earlier, it crashed the
    // peer's progress thread (docs/PROVIDERS.md, "shm").
    bool contact_requested = false;
    bool contact_answered = false;
    // shm: reads posted since the peer's doorbell last rang (poster.hpp).
    std::uint32_t unrung_reads = 0;
    // Transfers to this peer in the worker's queue (PendingQueue keeps it).
    std::size_t queued = 0;
    bool awaits_contact() const noexcept { return contact_requested && !contact_answered; }
  };
  Progress progress;

 private:
  fid_av* address_vector_;
  fi_addr_t handle_;
  std::optional<PeerProcess> owner_;
};

class PeerAddresses {
 public:
  // `fi_addr_format` (fi_info.addr_format), when given, lets handle() refuse an address of the
  // wrong size or family before fi_av_insert sees it: measured on libfabric 1.17, tcp's and
  // net's address vectors answer every later insert with -FI_EINVAL once one address with an
  // unknown sa_family was refused, so one hostile client would lock every new peer out.
  PeerAddresses(fid_av* address_vector, AddressFormat format, std::uint32_t fi_addr_format = 0)
      : address_vector_(address_vector), format_(format), fi_addr_format_(fi_addr_format) {}
  ~PeerAddresses() { clear(); }
  PeerAddresses(const PeerAddresses&) = delete;
  PeerAddresses& operator=(const PeerAddresses&) = delete;

  // The entry `client_id` posts against, inserting `address` if nobody holds it yet. Asking
  // again for the same address holds one reference, not two. A client advertising a different
  // address lets go of its old entry (removed if it was the last holder). On efa, an address for
  // a slot already held under other bytes evicts that entry and every client on it.
  Result<std::shared_ptr<RegisteredAddress>> handle(std::uint64_t client_id,
                                                    std::span<const std::uint8_t> address);
  // The entry `client_id` holds, or nullptr.
  std::shared_ptr<RegisteredAddress> find(std::uint64_t client_id) const;
  // Lets go of `client_id`'s entry; the entry leaves the vector only if it was the last holder.
  // Releasing twice is harmless.
  void release(std::uint64_t client_id);
  // Releases every entry (before the address vector closes).
  void clear();
  // Drops index keys whose last client has gone, once the index reaches the threshold, so a
  // server meeting many hosts does not grow the index without bound.
  void sweep();

  // Introspection for tests and DMA.INFO.
  std::size_t clients() const noexcept { return by_client_.size(); }
  std::size_t index_size() const noexcept { return by_identity_.size(); }
  std::size_t sweep_threshold() const noexcept { return sweep_at_; }
  void set_sweep_threshold(std::size_t threshold) noexcept { sweep_at_ = threshold; }
  bool holds(std::uint64_t client_id) const { return by_client_.count(client_id) != 0; }
  // Live holders of the index entry for `address` (0 if none or dead).
  long holders(std::span<const std::uint8_t> address) const;
  // Tests only: an index key whose entry is already dead, as a departed client leaves it.
  void insert_dead_key(std::span<const std::uint8_t> address);

 private:
  struct StringHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view text) const noexcept {
      return std::hash<std::string_view>{}(text);
    }
  };
  struct Indexed {
    std::string bytes;  // the whole address, as inserted
    std::weak_ptr<RegisteredAddress> entry;
  };
  Result<fi_addr_t> insert(std::span<const std::uint8_t> address);

  fid_av* address_vector_;
  AddressFormat format_;
  std::uint32_t fi_addr_format_;
  // The dedup index, keyed by endpoint-slot identity, deliberately non-owning.
  std::unordered_map<std::string, Indexed, StringHash, std::equal_to<>> by_identity_;
  // The ownership (and so the refcount): a client's entry lives exactly as long as it is here.
  std::unordered_map<std::uint64_t, std::shared_ptr<RegisteredAddress>> by_client_;
  std::size_t sweep_at_ = kMinimumSweep;
};

}  // namespace dma::internal
