#include "raw_fabric.hpp"

#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <deque>

#include "dma/configuration.hpp"

namespace dma::bench {

using Clock = std::chrono::steady_clock;
using internal::fabric_error;
using internal::fabric_status;

Result<std::unique_ptr<RawEndpoint>> RawEndpoint::open(const std::string& configured,
                                                       RawRole role, const std::string& bind) {
  Configuration configuration;
  configuration.providers = {configured};
  if (!bind.empty()) configuration.bind = bind;
  DMA_TRY_ASSIGN(internal::InfoPtr all, internal::query_provider(configuration, configured, role));
  DMA_TRY_ASSIGN(const fi_info* chosen, internal::choose(all.get(), configured, configuration, {}));

  std::unique_ptr<RawEndpoint> self(new RawEndpoint());
  self->info_.reset(fi_dupinfo(chosen));
  if (!self->info_) return fail(ErrorCode::kResourceExhausted, "fi_dupinfo failed");
  fi_info* info = self->info_.get();
  fid_fabric* fabric = nullptr;
  DMA_TRY(fabric_status(fi_fabric(info->fabric_attr, &fabric, nullptr), "fi_fabric"));
  self->fabric_.reset(fabric);
  DMA_TRY_ASSIGN(self->event_queue_, internal::open_progress_event_queue(fabric, *info));
  fid_domain* domain = nullptr;
  DMA_TRY(fabric_status(fi_domain(fabric, info, &domain, nullptr), "fi_domain"));
  self->domain_.reset(domain);
  DMA_TRY_ASSIGN(self->address_vector_, internal::open_address_vector(domain));
  DMA_TRY_ASSIGN(self->completion_queue_, internal::open_completion_queue(domain, *info));
  // Only the region's name (not a performance matter), as ours names it.
  internal::name_shm_region(*info);
  fid_ep* ep = nullptr;
  DMA_TRY(fabric_status(fi_endpoint(domain, info, &ep, nullptr), "fi_endpoint"));
  self->endpoint_.reset(ep);
  DMA_TRY(fabric_status(fi_ep_bind(ep, &self->address_vector_->fid, 0), "fi_ep_bind(av)"));
  DMA_TRY(fabric_status(fi_ep_bind(ep, &self->completion_queue_->fid, FI_TRANSMIT | FI_RECV),
                        "fi_ep_bind(cq)"));
  DMA_TRY(fabric_status(fi_enable(ep), "fi_enable"));
  std::size_t length = 0;
  fi_getname(&ep->fid, nullptr, &length);
  self->address_.resize(length);
  DMA_TRY(fabric_status(fi_getname(&ep->fid, self->address_.data(), &length), "fi_getname"));
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
  if (inserted != 1) return fail(fabric_error("fi_av_insert", inserted < 0 ? inserted : -FI_EINVAL));
  return handle;
}

Result<std::unique_ptr<RawRegion>> RawEndpoint::expose(void* data, std::size_t length) {
  fid_mr* region = nullptr;
  const std::uint64_t requested_key = provider_keys() ? 0 : 1;
  DMA_TRY(fabric_status(fi_mr_reg(domain_.get(), data, length, FI_REMOTE_READ | FI_REMOTE_WRITE, 0,
                                  requested_key, 0, &region, nullptr),
                        "fi_mr_reg"));
  return std::make_unique<RawRegion>(internal::FidPtr<fid_mr>(region));
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
    // Exactly what the worker posts (src/worker/worker.cpp post_piece): delivery complete, a null
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
  // First in, first out, as ours posts: with a stack, the op just reaped went straight back
  // and, under shm's -FI_EAGAIN, the rest waited unsampled, so "depth 64" ran a depth of a few.
  std::deque<RawOp*> idle;
  for (RawOp& op : ops) idle.push_back(&op);
  std::array<fi_cq_entry, 64> entries;

  RawRun run;
  std::size_t next_slot = job.first_slot % job.slots;
  std::size_t in_flight = 0;
  bool stopping = false;
  std::optional<Clock::time_point> stalled_since;
  const auto start = Clock::now();
  const auto deadline = start + job.duration;
  // Timed as ours is (from submit(), which the closed loop calls at the previous completion):
  // from the moment an op is ready to go, so time spent refused with -FI_EAGAIN, or waiting
  // behind a refused op, counts.
  for (RawOp& op : ops) op.posted = start;
  Clock::time_point stopped = start;
  std::uint64_t empty_polls = 0;
  while (true) {
    // Post while there is room.
    while (!stopping && !idle.empty()) {
      RawOp* op = idle.front();
      op->slot = next_slot;
      const auto attempt = Clock::now();
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
      if (code != 0) return fail(fabric_error(job.write ? "fi_writemsg" : "fi_read", code));
      stalled_since.reset();
      idle.pop_front();
      ++in_flight;
      run.last_slot = next_slot;
      next_slot = next_slot + 1 == job.slots ? 0 : next_slot + 1;
    }
    const ssize_t count = fi_cq_read(endpoint.completion_queue(), entries.data(), entries.size());
    // The clock only when something completed, or every 64th empty poll (for the window's end
    // and the drain deadline): a good raw loop does not pay a clock read per empty poll.
    if (count == -FI_EAGAIN && ++empty_polls % 64 != 0) continue;
    const auto now = Clock::now();
    if (count > 0) {
      for (ssize_t index = 0; index < count; ++index) {
        auto* op = static_cast<RawOp*>(entries[index].op_context);
        if (!stopping) {
          samples.record(now - op->posted);
          ++run.operations;
          run.bytes += job.size;
        }
        op->posted = now;  // ready again: its next transfer's clock starts
        idle.push_back(op);
      }
      in_flight -= static_cast<std::size_t>(count);
    } else if (count == -FI_EAVAIL) {
      fi_cq_err_entry failure{};
      if (fi_cq_readerr(endpoint.completion_queue(), &failure, 0) == 1) {
        ++run.errors;
        --in_flight;
        auto* failed = static_cast<RawOp*>(failure.op_context);
        failed->posted = Clock::now();
        idle.push_back(failed);
      }
    } else if (count != -FI_EAGAIN) {
      return fail(fabric_error("fi_cq_read", count));
    }
    // The window ends with the first batch at or after the deadline, counted above (as ours
    // ends, ours_loop.hpp): ended at an empty poll instead, it could stop mid-wave. If nothing
    // completes for drain_deadline past it, it ends anyway and the drain below says why.
    if (!stopping && now >= deadline &&
        (count != -FI_EAGAIN || now - deadline >= job.drain_deadline)) {
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
