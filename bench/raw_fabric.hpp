// The raw-libfabric baseline of `dma-bench fabric`: an endpoint opened the way src/fabric/endpoint.cpp
// opens ours, with the library's own hints, provider matching and provider quirks
// (internal::query_provider, choose, open_progress_event_queue, name_shm_region), so the
// comparison is fair and a quirk is fixed in one place; but the objects are opened, and every
// operation posted and reaped, with libfabric directly: a plain initiator loop (keep `depth`
// posted, reap with fi_cq_read in batches, repost), and the target side's buffer registration.
//
// Ownership: RawEndpoint owns every fid it opens, each in the library's FidPtr; member order is
// teardown order. RawRegion owns one fid_mr and must go before its endpoint. Thread-safety: none
// (FI_THREAD_DOMAIN); one thread uses an endpoint and its regions.
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "dma/result.hpp"
#include "fabric/endpoint.hpp"
#include "fabric/fid.hpp"
#include "report.hpp"

namespace dma::bench {

// The library's roles: an initiator posts RMA, a target is RMA'd into.
using RawRole = internal::Role;

class RawRegion;

class RawEndpoint {
 public:
  // `provider` as configured ("tcp" means "tcp;ofi_rxm"); `bind` a local IP for IP providers.
  static Result<std::unique_ptr<RawEndpoint>> open(const std::string& provider, RawRole role,
                                                   const std::string& bind);
  RawEndpoint(const RawEndpoint&) = delete;
  RawEndpoint& operator=(const RawEndpoint&) = delete;

  fid_ep* endpoint() const noexcept { return endpoint_.get(); }
  fid_cq* completion_queue() const noexcept { return completion_queue_.get(); }
  const std::vector<std::uint8_t>& address() const noexcept { return address_; }
  bool virtual_addresses() const noexcept;
  bool provider_keys() const noexcept;
  std::string provider_name() const;

  // fi_av_insert of one peer address.
  Result<fi_addr_t> insert(std::span<const std::uint8_t> address);
  // Registers [data, data + length) for remote read and write.
  Result<std::unique_ptr<RawRegion>> expose(void* data, std::size_t length);

 private:
  RawEndpoint() = default;
  internal::InfoPtr info_;
  internal::FidPtr<fid_fabric> fabric_;
  internal::FidPtr<fid_eq> event_queue_;  // net only: makes xnet start its progress thread
  internal::FidPtr<fid_domain> domain_;
  internal::FidPtr<fid_av> address_vector_;
  internal::FidPtr<fid_cq> completion_queue_;
  internal::FidPtr<fid_ep> endpoint_;
  std::vector<std::uint8_t> address_;
};

class RawRegion {
 public:
  explicit RawRegion(internal::FidPtr<fid_mr> region) : region_(std::move(region)) {}
  std::uint64_t key() const noexcept;

 private:
  internal::FidPtr<fid_mr> region_;
};

// One timed window of the raw initiator loop.
struct RawJob {
  bool write = true;           // fi_writemsg(FI_DELIVERY_COMPLETE) to the peer, else fi_read
  std::byte* local = nullptr;  // slot i is local + i * size
  std::size_t size = 0;
  std::size_t slots = 1;
  std::size_t depth = 1;
  std::uint64_t remote = 0;    // remote slot i is remote + i * size
  std::uint64_t key = 0;
  fi_addr_t peer = FI_ADDR_UNSPEC;
  std::size_t first_slot = 0;  // where the cycle starts (carried across rounds)
  std::chrono::nanoseconds duration{0};
  std::chrono::milliseconds drain_deadline{10000};
  std::chrono::milliseconds progress_deadline{1000};  // -FI_EAGAIN this long: unreachable
};

struct RawRun {
  std::uint64_t operations = 0;  // completed inside the window
  std::uint64_t bytes = 0;
  std::uint64_t errors = 0;
  std::uint64_t eagain = 0;  // posts refused with -FI_EAGAIN inside the window
  double seconds = 0;
  std::size_t next_slot = 0;               // where the next round should start
  std::optional<std::size_t> last_slot;    // the slot of the last op posted (to verify)
};

// Keeps job.depth operations posted on `endpoint` for job.duration, then drains them. Latencies
// (post to completion, per op, inside the window) go to `samples`. Fails if an op cannot be
// posted for progress_deadline or the drain passes its deadline.
Result<RawRun> run_raw_window(RawEndpoint& endpoint, const RawJob& job, LatencySamples& samples);

}  // namespace dma::bench
