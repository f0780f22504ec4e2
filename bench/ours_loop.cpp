#include "ours_loop.hpp"

#include "allocation_counter.hpp"

#include <thread>

namespace dma::bench {
namespace {
using Clock = std::chrono::steady_clock;
constexpr std::uint64_t kClient = 1;
}  // namespace

// A transfer's operand: one slot of the local buffer, and when it was submitted.
class OursLoop::Slot final : public Operands {
 public:
  std::span<const std::byte> source() override { return {local, size}; }
  std::span<std::byte> allocate(std::size_t length) override { return {local, length}; }
  std::byte* local = nullptr;
  std::size_t size = 0;
  std::size_t slot = 0;
  Clock::time_point submitted;
};

Result<std::unique_ptr<OursLoop>> OursLoop::start(const Configuration& configuration,
                                                  std::span<const std::uint8_t> peer,
                                                  std::size_t max_depth) {
  std::unique_ptr<OursLoop> loop(new OursLoop());
  OursLoop* self = loop.get();
  DMA_TRY_ASSIGN(loop->service_,
                 FabricService::start(
                     configuration, [self](std::span<Completion> batch) { self->on_batch(batch); },
                     nullptr));
  DMA_TRY(loop->service_->add_peer(kClient, peer));
  loop->max_depth_ = max_depth;
  loop->spare_.reserve(max_depth);
  for (std::size_t index = 0; index < max_depth; ++index) {
    loop->spare_.push_back(std::make_unique<Slot>());
  }
  return loop;
}

OursLoop::~OursLoop() { service_.reset(); }

void OursLoop::submit(std::unique_ptr<Operands> operand, std::size_t slot, bool from_worker) {
  auto* target = static_cast<Slot*>(operand.get());
  target->local = job_.local + slot * job_.size;
  target->size = job_.size;
  target->slot = slot;
  if (from_worker) last_slot_ = slot;
  TransferRequest request = TransferRequest::single(
      kClient, {}, job_.key, job_.remote + slot * job_.size, job_.direction, job_.size,
      std::move(operand));
  target->submitted = Clock::now();
  if (Status submitted = service_->submit(std::move(request)); !submitted) {
    // The worker is gone; hand the operand back so the drain does not wait for it.
    errors_.fetch_add(1, std::memory_order_relaxed);
    std::lock_guard lock(mutex_);
    if (!first_error_) first_error_ = submitted.error();
    spare_.push_back(std::move(request.context));
    drained_.notify_all();
  }
}

void OursLoop::on_batch(std::span<Completion> batch) {
  const auto now = Clock::now();
  const bool running = running_.load(std::memory_order_acquire);
  // This batch is the window's last: counted, and nothing more submitted.
  const bool closing = running && now >= deadline_;
  if (closing) running_.store(false, std::memory_order_release);
  std::uint64_t done = 0;
  for (Completion& completion : batch) {
    auto* slot = static_cast<Slot*>(completion.context.get());
    if (!completion.outcome) {
      errors_.fetch_add(1, std::memory_order_relaxed);
      std::lock_guard lock(mutex_);
      if (!first_error_) first_error_ = completion.outcome.error();
    } else if (running) {
      samples_->record(now - slot->submitted);
      ++done;
    }
    if (running && !closing) {
      const std::size_t next = next_slot_;
      next_slot_ = next + 1 == job_.slots ? 0 : next + 1;
      submit(std::move(completion.context), next, true);
    } else {
      std::lock_guard lock(mutex_);
      spare_.push_back(std::move(completion.context));
      drained_.notify_all();
    }
  }
  if (done != 0) {
    operations_.fetch_add(done, std::memory_order_relaxed);
    bytes_.fetch_add(done * job_.size, std::memory_order_relaxed);
  }
  if (closing) {
    std::lock_guard lock(mutex_);
    closed_ = true;
    ended_ = now;
    drained_.notify_all();
  }
}

Result<OursRun> OursLoop::run_window(const OursJob& job, LatencySamples& samples) {
  std::vector<std::unique_ptr<Operands>> initial;
  {
    std::lock_guard lock(mutex_);
    if (spare_.size() < job.depth) {
      return fail(ErrorCode::kInvalidArgument, "depth " + std::to_string(job.depth) +
                                                   " is more than the loop was started for");
    }
    initial.reserve(job.depth);
    for (std::size_t index = 0; index < job.depth; ++index) {
      initial.push_back(std::move(spare_.back()));
      spare_.pop_back();
    }
    first_error_.reset();
    closed_ = false;
  }
  job_ = job;
  samples_ = &samples;
  next_slot_ = (job.first_slot + job.depth) % job.slots;
  last_slot_ = (job.first_slot + job.depth - 1) % job.slots;
  operations_.store(0, std::memory_order_relaxed);
  bytes_.store(0, std::memory_order_relaxed);
  errors_.store(0, std::memory_order_relaxed);

  const auto start = Clock::now();
  deadline_ = start + job.duration;
  const std::uint64_t allocations_before = allocation_count();
  const std::uint64_t eagain_before = service_->counters().eagain;
  // running_ before the first submit: a completion may come back before the loop below ends.
  running_.store(true, std::memory_order_release);
  // The completer may run as soon as the first submit lands; it touches only the worker-owned
  // fields, and the initial slots are computed here, not from next_slot_.
  for (std::size_t index = 0; index < job.depth; ++index) {
    submit(std::move(initial[index]), (job.first_slot + index) % job.slots, false);
  }
  std::this_thread::sleep_until(deadline_);
  const std::uint64_t allocations_after = allocation_count();
  const std::uint64_t eagain_after = service_->counters().eagain;

  OursRun run;
  run.allocations = allocations_after - allocations_before;
  run.eagain = eagain_after - eagain_before;
  {
    std::unique_lock lock(mutex_);
    // The completer ends the window with its next batch. If none comes (every transfer failed
    // and was handed back, or the peer stalls), it ends here, and the drain below reports why.
    if (!drained_.wait_for(lock, job.drain_deadline, [&] { return closed_; })) {
      running_.store(false, std::memory_order_release);
      closed_ = true;
      ended_ = Clock::now();
    }
    run.seconds = std::chrono::duration<double>(ended_ - start).count();
    const bool drained = drained_.wait_for(lock, job.drain_deadline, [&] {
      return spare_.size() == max_depth_;  // every transfer of this window handed back
    });
    if (!drained) {
      return fail(ErrorCode::kTimedOut,
                  "ours: " + std::to_string(max_depth_ - spare_.size()) +
                      " transfers did not complete within " +
                      std::to_string(job.drain_deadline.count()) + " ms of the window's end");
    }
    run.first_error = first_error_;
  }
  // The drain handshake (mutex) orders the worker's last writes before these reads.
  run.operations = operations_.load(std::memory_order_relaxed);
  run.bytes = bytes_.load(std::memory_order_relaxed);
  run.errors = errors_.load(std::memory_order_relaxed);
  run.next_slot = next_slot_;
  run.last_slot = last_slot_;
  samples_ = nullptr;
  return run;
}

}  // namespace dma::bench
