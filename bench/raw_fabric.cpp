#include "raw_fabric.hpp"

#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>

#include "dma/configuration.hpp"
#include "fabric/shm_regions.hpp"

namespace dma::bench {
namespace {

using Clock = std::chrono::steady_clock;

Unexpected fabric_failure(const std::string& call, long code) {
  return fail(ErrorCode::kFabric, call + " failed: " + fi_strerror(static_cast<int>(-code)) + " (" +
                                      std::to_string(code) + ")");
}

bool is_ip_provider(const std::string& provider) {
  return provider != "shm" && provider.rfind("efa", 0) != 0;
}

}  // namespace

Result<std::unique_ptr<RawEndpoint>> RawEndpoint::open(const std::string& configured,
                                                       RawRole role, const std::string& bind) {
  const std::string provider = canonical_provider(configured);
  std::unique_ptr<fi_info, RawInfoDeleter> hints(fi_allocinfo());
  if (!hints) return fail(ErrorCode::kResourceExhausted, "fi_allocinfo failed");
  // The hints src/endpoint.cpp gives (query_provider), so both sides get the same provider path.
  hints->ep_attr->type = FI_EP_RDM;
  hints->caps = role == RawRole::kInitiator ? (FI_RMA | FI_READ | FI_WRITE)
                                            : (FI_RMA | FI_REMOTE_READ | FI_REMOTE_WRITE);
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_VIRT_ADDR;
  hints->domain_attr->threading = FI_THREAD_DOMAIN;
  hints->domain_attr->av_type = FI_AV_TABLE;
  if (role == RawRole::kTarget && provider == "tcp;ofi_rxm") {
    // rxm runs its own progress thread for a passive target with auto data progress and
    // FI_ATOMIC in caps (PROVIDERS.md), as our Target asks.
    hints->caps |= FI_ATOMIC;
    hints->domain_attr->data_progress = FI_PROGRESS_AUTO;
  }
  hints->fabric_attr->prov_name = ::strdup(provider.c_str());
  const char* node = nullptr;
  std::uint64_t flags = 0;
  if (!bind.empty() && is_ip_provider(provider)) {
    node = bind.c_str();
    flags = FI_SOURCE;
  }
  fi_info* list = nullptr;
  if (int code = fi_getinfo(FI_VERSION(1, 17), node, nullptr, flags, hints.get(), &list); code != 0) {
    return fail(ErrorCode::kNotFound, "provider " + configured + " does not open here: fi_getinfo: " +
                                          fi_strerror(-code));
  }
  std::unique_ptr<fi_info, RawInfoDeleter> all(list);
  fi_info* chosen = nullptr;
  for (fi_info* info = list; info != nullptr; info = info->next) {
    if (provider == info->fabric_attr->prov_name) {
      chosen = info;
      break;
    }
  }
  if (chosen == nullptr) {
    return fail(ErrorCode::kNotFound, "provider " + configured + " offers no RMA endpoint here");
  }

  std::unique_ptr<RawEndpoint> self(new RawEndpoint());
  self->info_.reset(fi_dupinfo(chosen));
  fi_info* info = self->info_.get();
  fid_fabric* fabric = nullptr;
  if (int code = fi_fabric(info->fabric_attr, &fabric, nullptr); code != 0) {
    return fabric_failure("fi_fabric", code);
  }
  self->fabric_.reset(fabric);
  if (provider == "net") {
    // xnet starts its progress thread once the fabric has an event queue with a pollable fd.
    fi_eq_attr eq_attr{};
    eq_attr.wait_obj = FI_WAIT_POLLFD;
    fid_eq* eq = nullptr;
    if (int code = fi_eq_open(fabric, &eq_attr, &eq, nullptr); code != 0) {
      return fabric_failure("fi_eq_open", code);
    }
    self->event_queue_.reset(eq);
  }
  fid_domain* domain = nullptr;
  if (int code = fi_domain(fabric, info, &domain, nullptr); code != 0) {
    return fabric_failure("fi_domain", code);
  }
  self->domain_.reset(domain);
  fi_av_attr av_attr{};
  av_attr.type = FI_AV_TABLE;
  fid_av* av = nullptr;
  if (int code = fi_av_open(domain, &av_attr, &av, nullptr); code != 0) {
    return fabric_failure("fi_av_open", code);
  }
  self->address_vector_.reset(av);
  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_CONTEXT;
  cq_attr.wait_obj = FI_WAIT_NONE;
  cq_attr.size = std::max<std::size_t>(info->tx_attr->size, 64) + info->rx_attr->size;
  fid_cq* cq = nullptr;
  if (int code = fi_cq_open(domain, &cq_attr, &cq, nullptr); code != 0) {
    return fabric_failure("fi_cq_open", code);
  }
  self->completion_queue_.reset(cq);
  if (provider == "shm") {
    // Only the region's name (not a performance matter): a unique name per process incarnation,
    // so a pid recycled after a killed run cannot collide with a stale /dev/shm file.
    internal::sweep_stale_shm_regions();
    const std::string source = internal::shm_source_address();
    std::free(info->src_addr);
    info->src_addr = ::strdup(source.c_str());
    info->src_addrlen = source.size() + 1;
  }
  fid_ep* ep = nullptr;
  if (int code = fi_endpoint(domain, info, &ep, nullptr); code != 0) {
    return fabric_failure("fi_endpoint", code);
  }
  self->endpoint_.reset(ep);
  if (int code = fi_ep_bind(ep, &av->fid, 0); code != 0) return fabric_failure("fi_ep_bind(av)", code);
  if (int code = fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV); code != 0) {
    return fabric_failure("fi_ep_bind(cq)", code);
  }
  if (int code = fi_enable(ep); code != 0) return fabric_failure("fi_enable", code);
  std::size_t length = 0;
  fi_getname(&ep->fid, nullptr, &length);
  self->address_.resize(length);
  if (int code = fi_getname(&ep->fid, self->address_.data(), &length); code != 0) {
    return fabric_failure("fi_getname", code);
  }
  self->address_.resize(length);
  return self;
}

bool RawEndpoint::virtual_addresses() const noexcept {
  return (info_->domain_attr->mr_mode & FI_MR_VIRT_ADDR) != 0;
}
bool RawEndpoint::provider_keys() const noexcept {
  return (info_->domain_attr->mr_mode & FI_MR_PROV_KEY) != 0;
}
std::string RawEndpoint::provider_name() const { return info_->fabric_attr->prov_name; }

Result<fi_addr_t> RawEndpoint::insert(std::span<const std::uint8_t> address) {
  fi_addr_t handle = FI_ADDR_NOTAVAIL;
  const int inserted = fi_av_insert(address_vector_.get(), address.data(), 1, &handle, 0, nullptr);
  if (inserted != 1) return fabric_failure("fi_av_insert", inserted < 0 ? inserted : -FI_EINVAL);
  return handle;
}

Result<std::unique_ptr<RawRegion>> RawEndpoint::expose(void* data, std::size_t length) {
  fid_mr* region = nullptr;
  const std::uint64_t requested_key = provider_keys() ? 0 : 1;
  if (int code = fi_mr_reg(domain_.get(), data, length, FI_REMOTE_READ | FI_REMOTE_WRITE, 0,
                           requested_key, 0, &region, nullptr);
      code != 0) {
    return fabric_failure("fi_mr_reg", code);
  }
  return std::make_unique<RawRegion>(region);
}

std::uint64_t RawRegion::key() const noexcept { return fi_mr_key(region_.get()); }

namespace {

// One posted operation: the fi_context2 is the CQ entry's op_context.
struct RawOp {
  fi_context2 context;
  Clock::time_point posted;
  std::size_t slot = 0;
};

long post(RawEndpoint& endpoint, const RawJob& job, RawOp& op) {
  std::byte* local = job.local + op.slot * job.size;
  const std::uint64_t remote = job.remote + op.slot * job.size;
  std::memset(&op.context, 0, sizeof op.context);
  if (job.write) {
    // Exactly what the worker posts (src/worker.cpp post_piece): delivery complete, a null
    // descriptor (no FI_MR_LOCAL on tcp, net, shm).
    void* descriptor = nullptr;
    iovec iov{local, job.size};
    fi_rma_iov rma{remote, job.size, job.key};
    fi_msg_rma message{};
    message.msg_iov = &iov;
    message.desc = &descriptor;
    message.iov_count = 1;
    message.addr = job.peer;
    message.rma_iov = &rma;
    message.rma_iov_count = 1;
    message.context = &op.context;
    return fi_writemsg(endpoint.endpoint(), &message, FI_DELIVERY_COMPLETE | FI_COMPLETION);
  }
  return fi_read(endpoint.endpoint(), local, job.size, nullptr, job.peer, remote, job.key,
                 &op.context);
}

}  // namespace

Result<RawRun> run_raw_window(RawEndpoint& endpoint, const RawJob& job, LatencySamples& samples) {
  std::vector<RawOp> ops(job.depth);
  std::vector<RawOp*> idle;
  idle.reserve(job.depth);
  for (RawOp& op : ops) idle.push_back(&op);
  std::array<fi_cq_entry, 64> entries;

  RawRun run;
  std::size_t next_slot = job.first_slot % job.slots;
  std::size_t in_flight = 0;
  bool stopping = false;
  std::optional<Clock::time_point> stalled_since;
  const auto start = Clock::now();
  const auto deadline = start + job.duration;
  Clock::time_point stopped = start;
  while (true) {
    // Post while there is room.
    while (!stopping && !idle.empty()) {
      RawOp* op = idle.back();
      op->slot = next_slot;
      // Timed from the first attempt, as ours is timed from submit(): a post refused with
      // -FI_EAGAIN keeps waiting on the clock.
      const auto attempt = Clock::now();
      if (!stalled_since) op->posted = attempt;
      const long code = post(endpoint, job, *op);
      if (code == -FI_EAGAIN) {
        if (!stopping) ++run.eagain;
        if (!stalled_since) stalled_since = attempt;
        if (attempt - *stalled_since >= job.progress_deadline) {
          return fail(ErrorCode::kUnreachable, "raw initiator: -FI_EAGAIN for " +
                                                   std::to_string(job.progress_deadline.count()) +
                                                   " ms");
        }
        break;  // reap (drives progress), then retry
      }
      if (code != 0) return fabric_failure(job.write ? "fi_writemsg" : "fi_read", code);
      stalled_since.reset();
      idle.pop_back();
      ++in_flight;
      run.last_slot = next_slot;
      next_slot = next_slot + 1 == job.slots ? 0 : next_slot + 1;
    }
    const ssize_t count = fi_cq_read(endpoint.completion_queue(), entries.data(), entries.size());
    const auto now = Clock::now();
    if (count > 0) {
      for (ssize_t index = 0; index < count; ++index) {
        auto* op = static_cast<RawOp*>(entries[index].op_context);
        if (!stopping) {
          samples.record(now - op->posted);
          ++run.operations;
          run.bytes += job.size;
        }
        idle.push_back(op);
      }
      in_flight -= static_cast<std::size_t>(count);
    } else if (count == -FI_EAVAIL) {
      fi_cq_err_entry failure{};
      if (fi_cq_readerr(endpoint.completion_queue(), &failure, 0) == 1) {
        ++run.errors;
        --in_flight;
        idle.push_back(static_cast<RawOp*>(failure.op_context));
      }
    } else if (count != -FI_EAGAIN) {
      return fabric_failure("fi_cq_read", count);
    }
    if (!stopping && now >= deadline) {
      stopping = true;
      stopped = now;
      run.seconds = std::chrono::duration<double>(now - start).count();
    }
    if (stopping) {
      if (in_flight == 0) break;
      if (now - stopped > job.drain_deadline) {
        return fail(ErrorCode::kTimedOut, "raw initiator: " + std::to_string(in_flight) +
                                              " operations did not complete within " +
                                              std::to_string(job.drain_deadline.count()) + " ms");
      }
    }
  }
  run.next_slot = next_slot;
  return run;
}

}  // namespace dma::bench
