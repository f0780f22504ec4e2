// Private: one opened libfabric RDM endpoint and everything under it.
//
// Ownership: Endpoint owns fi_info, fabric, domain, address vector, completion queue and
// endpoint; member order is teardown order. Thread-safety: none; FI_THREAD_DOMAIN is requested,
// so one thread (a service worker, a target's progress thread) uses it at a time.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dma/configuration.hpp"
#include "dma/fabric.hpp"
#include "fabric/fid.hpp"
#include <rdma/fi_eq.h>
#include "fabric/registration_cache.hpp"

namespace dma::internal {

enum class Role : std::uint8_t {
  kInitiator,  // posts RMA (the server): caps FI_RMA|FI_READ|FI_WRITE
  kTarget,     // is RMA'd into (the client): caps FI_RMA|FI_REMOTE_READ|FI_REMOTE_WRITE
};

class Endpoint {
 public:
  // Tries each configured provider in order; the first that offers a matching domain and opens
  // wins. `domain` (if non-empty) must be that domain's name. The error lists why each provider
  // was rejected.
  static Result<std::unique_ptr<Endpoint>> open(const Configuration& configuration, Role role,
                                                const std::string& domain = {});
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
  InfoPtr info_;
  FidPtr<fid_fabric> fabric_;
  // net (xnet) only: an event queue with FI_WAIT_POLLFD on the fabric makes xnet start its own
  // progress thread. A passive target needs it for connection setup (PROVIDERS.md), and measured
  // here the initiator's connection never left -FI_EAGAIN without it on its side too.
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

// The fi_info list for one provider under our hints (tests and dma-info use it too).
Result<InfoPtr> query_provider(const Configuration& configuration, const std::string& provider,
                               Role role, std::string* rejection);

}  // namespace dma::internal
