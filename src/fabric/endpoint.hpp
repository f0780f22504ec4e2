// Private: one opened libfabric RDM endpoint and everything under it, and the provider choice
// that leads to it (hints, matching, and the per-provider quirks applied while opening), which
// bench/raw_fabric reuses so that a quirk is fixed in one place.
//
// Providers are tried in the configured order, and a provider that fails at any stage (from
// fi_getinfo to fi_enable and fi_getname) is closed again and the next one tried: one that
// matches at fi_getinfo can still refuse later (docs/PROVIDERS.md, "Opening an endpoint").
//
// Ownership: Endpoint owns fi_info, fabric, event queue, domain, address vector, completion
// queue and endpoint, each in a FidPtr; member order is teardown order. Its DeferredCloses is
// shared with the registrations it hands out. Thread-safety: none; FI_THREAD_DOMAIN is
// requested, so one thread (a service worker, a target's progress thread under its lock) uses it
// at a time, the thread named by the DomainOwner it was opened with.
#pragma once

#include <rdma/fi_eq.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dma/configuration.hpp"
#include "dma/fabric.hpp"
#include "fabric/fid.hpp"
#include "fabric/registration_cache.hpp"

namespace dma::internal {

enum class Role : std::uint8_t {
  kInitiator,  // posts RMA (the server): caps FI_RMA|FI_READ|FI_WRITE
  kTarget,     // is RMA'd into (the client): caps FI_RMA|FI_REMOTE_READ|FI_REMOTE_WRITE
};

class Endpoint {
 public:
  // Tries each configured provider in order; the first that offers a matching domain and opens
  // through every stage wins. `domain` (if non-empty) must be that domain's name. `owner` is the
  // thread that will use the endpoint: registrations whose last lease drops elsewhere are
  // closed there (DeferredCloses). The error lists, provider by provider, the stage that failed
  // and why.
  static Result<std::unique_ptr<Endpoint>> open(const Configuration& configuration, Role role,
                                                const std::string& domain = {},
                                                DomainOwner owner = DomainOwner::calling_thread());
  ~Endpoint();
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  fid_ep* endpoint() const noexcept { return endpoint_.get(); }
  fid_cq* completion_queue() const noexcept { return completion_queue_.get(); }
  fid_av* address_vector() const noexcept { return address_vector_.get(); }
  fid_domain* domain() const noexcept { return domain_.get(); }
  std::uintptr_t domain_key() const noexcept { return reinterpret_cast<std::uintptr_t>(domain_.get()); }
  const fi_info* info() const noexcept { return info_.get(); }
  const EndpointDescription& describe() const noexcept { return description_; }
  const std::vector<std::uint8_t>& local_address() const noexcept { return address_; }
  const std::shared_ptr<DeferredCloses>& deferred_closes() const noexcept { return closes_; }

  // Registers [base, base+length) with `access` (FI_READ|FI_WRITE for local operands,
  // FI_REMOTE_READ|FI_REMOTE_WRITE for exposed buffers), with a provider key or the next
  // application key as the provider requires. Zero length and overflow are rejected.
  Result<Lease> register_memory(std::uintptr_t base, std::size_t length, std::uint64_t access);

  // Closes the endpoint alone, ahead of the rest. After fi_close(ep) returns the provider no
  // longer touches the buffers of operations posted on it (fi_endpoint(3)), which is how a
  // shutdown stops waiting for completions that will never come.
  void close_endpoint() noexcept { endpoint_.reset(); }

  bool virtual_addresses() const noexcept { return description_.virtual_addresses; }
  bool local_registration_required() const noexcept { return (info_->domain_attr->mr_mode & FI_MR_LOCAL) != 0; }

 private:
  Endpoint() = default;
  // Opens everything under `chosen` (one fi_getinfo entry for `provider`); the first failing
  // stage is the error.
  static Result<std::unique_ptr<Endpoint>> open_on(const fi_info& chosen,
                                                   const Configuration& configuration,
                                                   DomainOwner owner);

  InfoPtr info_;
  FidPtr<fid_fabric> fabric_;
  // net (xnet) only: an event queue with FI_WAIT_POLLFD on the fabric makes xnet start its own
  // progress thread. A passive target needs it for connection setup, and measured here the
  // initiator's connection never left -FI_EAGAIN without it on its side too (docs/PROVIDERS.md,
  // "net").
  FidPtr<fid_eq> event_queue_;
  FidPtr<fid_domain> domain_;
  FidPtr<fid_av> address_vector_;
  FidPtr<fid_cq> completion_queue_;
  FidPtr<fid_ep> endpoint_;
  std::shared_ptr<DeferredCloses> closes_;
  std::vector<std::uint8_t> address_;
  EndpointDescription description_;
  std::atomic<std::uint64_t> next_key_{1};
};

// The fi_info list for one configured provider name under our hints: RDM, RMA caps for `role`,
// FI_CONTEXT|FI_CONTEXT2, every mr_mode bit we honour, FI_THREAD_DOMAIN, FI_AV_TABLE, and the
// per-provider progress settings (docs/PROVIDERS.md, "Hints"). discover_domains (and so
// dma-info) and bench/raw_fabric use it too.
Result<InfoPtr> query_provider(const Configuration& configuration, const std::string& provider,
                               Role role);
// Whether `info` is an entry for exactly the configured `provider`: fi_getinfo also offers
// layered variants (such as "net;ofi_rxm" for "net"), and "efa-direct" is the efa provider's
// efa-direct fabric.
bool offers(const std::string& provider, const fi_info& info);
// The first entry of `list` for `provider` on an allowed domain: `domain` if non-empty, else one
// of configuration.interfaces if any are named, else any. The error says what was offered.
Result<const fi_info*> choose(const fi_info* list, const std::string& provider,
                              const Configuration& configuration, const std::string& domain);

// Quirks applied between fi_fabric and fi_enable, in this order (docs/PROVIDERS.md, "Opening an
// endpoint"):
// net (xnet) starts its progress thread only once the fabric has an event queue waiting on
// FI_WAIT_POLLFD; for other providers this opens nothing and returns an empty FidPtr.
Result<FidPtr<fid_eq>> open_progress_event_queue(fid_fabric* fabric, const fi_info& info);
// The address vector (FI_AV_TABLE) and completion queue (context format, no wait object, room
// for a full transmit queue plus the receive queue) every endpoint binds.
Result<FidPtr<fid_av>> open_address_vector(fid_domain* domain);
Result<FidPtr<fid_cq>> open_completion_queue(fid_domain* domain, const fi_info& info);
// shm names its region in /dev/shm after the source address: set it to ours (unique to this
// incarnation of the pid) and sweep dead processes' regions first (shm_regions.hpp). Call
// before fi_endpoint; other providers are left alone.
void name_shm_region(fi_info& info);

}  // namespace dma::internal
