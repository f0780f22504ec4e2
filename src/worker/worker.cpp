#include "worker/worker.hpp"

#include <algorithm>
#include <cstring>

#include "dma/protocol.hpp"

namespace dma::internal {

using Clock = std::chrono::steady_clock;

// ---- Channel -----------------------------------------------------------------------------

bool Channel::take(std::vector<Message>& out, bool block, std::chrono::milliseconds timeout) {
  if (!block && !pending_.load(std::memory_order_acquire)) {
    return !closed_.load(std::memory_order_acquire);
  }
  std::unique_lock lock(mutex_);
  if (block) {
    const auto ready = [&] {
      return !queue_.empty() || woken_ || closed_.load(std::memory_order_relaxed);
    };
    if (timeout.count() > 0) {
      ready_.wait_for(lock, timeout, ready);
    } else {
      ready_.wait(lock, ready);
    }
  }
  woken_ = false;
  out.swap(queue_);
  pending_.store(false, std::memory_order_release);
  return !closed_.load(std::memory_order_relaxed) || !out.empty();
}

void Channel::close() {
  {
    std::lock_guard lock(mutex_);
    closed_.store(true, std::memory_order_release);
  }
  ready_.notify_all();
}

void Channel::wake() {
  {
    std::lock_guard lock(mutex_);
    woken_ = true;
  }
  ready_.notify_all();
}

bool Channel::closed() const { return closed_.load(std::memory_order_acquire); }

ServiceCounters AtomicCounters::snapshot() const {
  ServiceCounters out;
  out.submitted = submitted.load(std::memory_order_relaxed);
  out.completed = completed.load(std::memory_order_relaxed);
  out.failed = failed.load(std::memory_order_relaxed);
  out.bytes_to_peer = bytes_to_peer.load(std::memory_order_relaxed);
  out.bytes_from_peer = bytes_from_peer.load(std::memory_order_relaxed);
  out.eagain = eagain.load(std::memory_order_relaxed);
  out.expired = expired.load(std::memory_order_relaxed);
  out.unattributed_errors = unattributed_errors.load(std::memory_order_relaxed);
  return out;
}

bool checksum_flush_due(std::size_t batched, bool queue_dry, bool parking) noexcept {
  if (batched == 0) return false;
  return batched >= kChecksumBatch || queue_dry || parking;
}

// ---- Worker ------------------------------------------------------------------------------

Result<std::unique_ptr<Worker>> Worker::open(const Configuration& configuration,
                                             const std::string& domain,
                                             std::shared_ptr<ServiceShared> shared) {
  // Runs on the worker thread, which owns the domain: registrations whose last lease drops on
  // another thread are queued for it and wake it.
  std::weak_ptr<ServiceShared> weak = shared;
  Result<std::unique_ptr<Endpoint>> endpoint = Endpoint::open(
      configuration, Role::kInitiator, domain, DomainOwner::calling_thread([weak] {
        if (auto alive = weak.lock()) alive->channel.wake();
      }));
  if (!endpoint) return fail(std::move(endpoint).error());
  return std::unique_ptr<Worker>(
      new Worker(std::move(*endpoint), configuration, std::move(shared)));
}

Worker::Worker(std::unique_ptr<Endpoint> endpoint, const Configuration& configuration,
               std::shared_ptr<ServiceShared> shared)
    : endpoint_(std::move(endpoint)), shared_(std::move(shared)), configuration_(configuration) {
  const bool register_operands =
      endpoint_->local_registration_required() || configuration.always_register_operands;
  regions_ = std::make_unique<LocalRegions>(*endpoint_, register_operands);
  efa_addresses_ = address_format_from(endpoint_->info()->addr_format) == AddressFormat::kEfa;
  peers_ = std::make_unique<PeerAddresses>(
      endpoint_->address_vector(), address_format_from(endpoint_->info()->addr_format),
      endpoint_->info()->addr_format);
  cap_ = std::max<std::size_t>(1, endpoint_->describe().max_in_flight);
  max_piece_ = endpoint_->describe().max_msg_size == 0 ? (std::size_t{1} << 30)
                                                       : endpoint_->describe().max_msg_size;
  if (configuration.max_piece_bytes != 0) max_piece_ = std::min(max_piece_, configuration.max_piece_bytes);
  batch_.reserve(64);
  checksum_batch_.reserve(kChecksumBatch);
  inbox_.reserve(64);
}

Worker::~Worker() {
  // Everything has completed by now (run() returns only then); release the address vector's
  // entries before the endpoint closes the vector, and close queued registrations.
  peers_.reset();
  endpoint_->deferred_closes()->drain();
}

void Worker::run() {
  while (step(true)) {
  }
  std::unique_lock lock(shared_->jobs_mutex);
  shared_->jobs_done.wait(lock, [&] { return shared_->jobs == 0; });
}

bool Worker::step(bool may_block) {
  // Expired pieces are not work: a worker holding only those parks (waking to reap them).
  const bool idle = pending_.empty() && live_in_flight() == 0;
  if (closed_ && idle) {
    if (held_pieces_ > 0) release_held();
    flush(true, true);
    return false;
  }
  if (idle && may_block) flush(true, true);  // about to park: nothing may wait behind it
  const bool park = may_block && idle && !closed_;
  const bool open = shared_->channel.take(
      inbox_, park, held_pieces_ > 0 ? kHeldPollInterval : std::chrono::milliseconds(0));
  if (!open) closed_ = true;
  for (Message& message : inbox_) intake(message);
  inbox_.clear();
  if (endpoint_->deferred_closes()->pending()) endpoint_->deferred_closes()->drain();

  post();
  const std::size_t reaped = reap();
  if (live_in_flight() > 0 && configuration_.completion_deadline.count() > 0) {
    const auto now = Clock::now();
    if (now >= next_expiry_check_) {
      expire_overdue(now);
      // A tenth of the deadline (at most 100 ms) bounds how late a transfer expires.
      next_expiry_check_ = now + std::min<Clock::duration>(
                                     configuration_.completion_deadline / 10,
                                     std::chrono::milliseconds(100));
    }
  }
  const bool dry = reaped == 0 || in_flight_ == 0;
  flush(dry, false);
  return true;
}

void Worker::intake(Message& message) {
  if (auto* request = std::get_if<TransferRequest>(&message)) {
    accept(std::move(*request));
  } else if (auto* add = std::get_if<AddPeerMessage>(&message)) {
    removal_pending_.erase(add->client_id);
    Result<std::shared_ptr<RegisteredAddress>> entry =
        peers_->handle(add->client_id, add->address.bytes());
    add->reply.send(entry ? Status{} : Status(fail(std::move(entry).error())));
  } else if (auto* remove = std::get_if<RemovePeerMessage>(&message)) {
    auto counted = client_outstanding_.find(remove->client_id);
    if (counted == client_outstanding_.end() || counted->second == 0) {
      if (counted != client_outstanding_.end()) client_outstanding_.erase(counted);
      peers_->release(remove->client_id);
    } else {
      removal_pending_.insert(remove->client_id);
    }
  } else if (auto* registration = std::get_if<RegisterMessage>(&message)) {
    registration->reply.send(regions_->pin(registration->base, registration->length));
  }
}

void Worker::accept(TransferRequest&& request) {
  Op* op = acquire_op();
  op->request = std::move(request);
  ++client_outstanding_[op->request.client_id];
  if (closed_) {
    finish(op, fail(ErrorCode::kWorkerGone, "fabric worker is gone (service shutting down)"));
    return;
  }
  if (Status ready = prepare(*op); !ready) {
    finish(op, fail(std::move(ready).error()));
    return;
  }
  if (op->length == 0) {
    finish(op, TransferDone{0, std::nullopt});
    return;
  }
  op->queued = true;
  pending_.push_back(op);
}

Status Worker::prepare(Op& op) {
  TransferRequest& request = op.request;
  if (!request.context) return fail(ErrorCode::kInvalidArgument, "transfer has no context");
  const RemoteRegions& regions = request.regions;
  if (regions.empty()) return fail(ErrorCode::kInvalidArgument, "transfer names no remote region");
  if (regions.size() > kMaxRemoteRegions) {
    return fail(ErrorCode::kInvalidArgument,
                "transfer names " + std::to_string(regions.size()) + " remote regions; at most " +
                    std::to_string(kMaxRemoteRegions) + " are allowed");
  }
  std::uint64_t capacity = 0;
  for (std::size_t index = 0; index < regions.size(); ++index) {
    const RemoteRegion& region = regions[index];
    if (region.length == 0) {
      return fail(ErrorCode::kInvalidArgument,
                  "remote region " + std::to_string(index) + " has zero length");
    }
    if (region.address + region.length < region.address) {
      return fail(ErrorCode::kInvalidArgument,
                  "remote region " + std::to_string(index) + " overflows the address space");
    }
    if (capacity + region.length < capacity) {
      return fail(ErrorCode::kInvalidArgument, "remote regions' total length overflows");
    }
    capacity += region.length;
  }

  if (request.direction == Direction::kToPeer) {
    std::span<const std::byte> source = request.context->source();
    if (source.data() == nullptr) {
      return fail(ErrorCode::kInvalidArgument, "the transfer's context has no source");
    }
    op.local = const_cast<std::byte*>(source.data());  // only read from: fi_writemsg's iov
    op.length = source.size();
  } else {
    std::span<std::byte> landing = request.context->allocate(request.length);
    if (request.length > 0 && (landing.data() == nullptr || landing.size() < request.length)) {
      return fail(ErrorCode::kInvalidArgument,
                  "landing buffer is " + std::to_string(landing.size()) +
                      " bytes, shorter than the transfer's " + std::to_string(request.length));
    }
    op.local = landing.data();
    op.length = request.length;
  }
  if (capacity < op.length) {
    return fail(ErrorCode::kInvalidArgument,
                "remote regions hold " + std::to_string(capacity) + " bytes, fewer than the " +
                    std::to_string(op.length) + " to transfer");
  }
  if (op.length == 0) return {};

  std::shared_ptr<RegisteredAddress> peer;
  if (request.peer_address.empty()) {
    peer = peers_->find(request.client_id);
    if (!peer) {
      return fail(ErrorCode::kNotFound, "client " + std::to_string(request.client_id) +
                                            " has no peer address (call add_peer first)");
    }
  } else {
    Result<std::shared_ptr<RegisteredAddress>> handle =
        peers_->handle(request.client_id, request.peer_address.bytes());
    if (!handle) return fail(std::move(handle).error());
    peer = std::move(*handle);
  }
  op.peer = peer->handle();
  // The op holds the entry until it finishes: measured on tcp, net and shm, a client
  // re-advertising mid-stream otherwise had its old entry removed under its queued transfers,
  // whose slot the new address then took: old bytes landed in the new buffer, and shm crashed.
  // On efa a recycled slot must be removable at once (peer_addresses.hpp), and the transfers of
  // the dead incarnation fail anyway, so there the op keeps only the handle.
  if (!efa_addresses_) op.peer_entry = std::move(peer);

  Operands* context = request.context.get();
  Result<LocalOperand> operand = regions_->operand(
      op.local, op.length, [context] { return context->cacheable_span(); });
  if (!operand) return fail(std::move(operand).error());
  op.operand = std::move(*operand);
  return {};
}

void Worker::post() {
  std::size_t turns = pending_.size();
  while (turns-- > 0 && !pending_.empty() && live_in_flight() < cap_) {
    Op* op = pending_.front();
    pending_.pop_front();
    op->queued = false;
    if (closed_ && op->local_offset == 0 && op->in_flight == 0 && !op->error) {
      finish(op, fail(ErrorCode::kWorkerGone, "fabric worker is gone (service shutting down)"));
      continue;
    }
    if (!op->error && op->peer_entry) {
      // shm: a target that died holding its region lock would leave the post below spinning
      // forever (peer_process.hpp); a dead process gets nothing more posted to it. A transfer's
      // first turn always asks, so nothing submitted after a death could be seen is posted;
      // its retries after -FI_EAGAIN reuse an answer up to kOwnerRecheck old.
      const PeerProcess* owner = op->peer_entry->owner();
      const bool first_turn = !op->owner_asked;
      op->owner_asked = true;
      if (owner != nullptr &&
          (first_turn ? owner->exited() : owner->exited(Clock::now(), kOwnerRecheck))) {
        op->error = Error(ErrorCode::kUnreachable,
                          "peer unreachable: its process (pid " + std::to_string(owner->pid()) +
                              ") has exited");
      }
    }
    bool stalled = false;
    while (!op->error && !op->posting_done && live_in_flight() < cap_) {
      const RemoteRegion& region = op->request.regions[op->region];
      const std::size_t size =
          std::min({static_cast<std::size_t>(region.length - op->region_offset),
                    op->length - op->local_offset, max_piece_});
      Piece* piece = acquire_piece(op);
      const long code = post_piece(*op, *piece, size);
      if (code == 0) {
        if (op->local_offset == 0) op->posted_at = Clock::now();
        ++in_flight_;
        ++op->in_flight;
        op->eagain = false;
        if (op->peer_entry) {
          ++op->peer_entry->progress.live_pieces;
          op->peer_entry->progress.refusing_since.reset();
        }
        op->local_offset += size;
        op->region_offset += size;
        if (op->region_offset == region.length) {
          ++op->region;
          op->region_offset = 0;
        }
        op->posting_done = op->local_offset == op->length;
        continue;
      }
      release_piece(piece);
      if (code == -FI_EAGAIN) {
        shared_->counters.eagain.fetch_add(1, std::memory_order_relaxed);
        if (past_progress_deadline(*op, Clock::now())) {
          op->error = Error(ErrorCode::kUnreachable,
                            "peer unreachable: the provider answered -FI_EAGAIN for " +
                                std::to_string(configuration_.progress_deadline.count()) +
                                " ms (progress deadline)");
          break;
        }
        stalled = true;
        break;
      }
      op->error = fabric_error(
          op->request.direction == Direction::kToPeer ? "fi_writemsg" : "fi_read", code);
    }
    if (op->error) {
      if (op->in_flight == 0) finish(op, fail(*op->error));
      // else: the last reaped piece finishes it
      continue;
    }
    if (op->posting_done) continue;  // reaping finishes it
    op->queued = true;
    if (stalled) {
      // EAGAIN: to the back, so other peers get their turn, and no more posting this step. The
      // provider's queue is full (shm) or this peer is not ready (tcp connecting); either way
      // retrying the rest now only burns calls that fail (measured: thousands per completion
      // on shm). Reaping comes next and frees room.
      pending_.push_back(op);
      break;
    } else {
      pending_.push_front(op);  // the cap is full: keep its place
      break;
    }
  }
}

bool Worker::past_progress_deadline(Op& op, Clock::time_point now) {
  if (!op.peer_entry) {
    // efa: ops keep no entry (prepare()), so the clock is the op's own.
    if (!op.eagain) {
      op.eagain = true;
      op.first_eagain = now;
      return false;
    }
    return now - op.first_eagain >= configuration_.progress_deadline;
  }
  RegisteredAddress::Progress& peer = op.peer_entry->progress;
  if (peer.live_pieces > 0) {
    // It has taken posts that are still in flight: reachable, only full for now. A peer that
    // never completes them is the completion deadline's, which takes them out of this count.
    peer.refusing_since.reset();
    return false;
  }
  // Refusals must be continuous: after a gap longer than the deadline (no transfer for it, or
  // its turn long in coming) the earlier ones say nothing about now, and the clock restarts.
  const bool restart = !peer.refusing_since ||
                       now - peer.last_refusal >= configuration_.progress_deadline;
  peer.last_refusal = now;
  if (restart) {
    peer.refusing_since = now;
    return false;
  }
  return now - *peer.refusing_since >= configuration_.progress_deadline;
}

long Worker::post_piece(Op& op, Piece& piece, std::size_t size) {
  const RemoteRegion& region = op.request.regions[op.region];
  std::byte* local = op.local + op.local_offset;
  const std::uint64_t remote = region.address + op.region_offset;
  void* descriptor = op.operand.descriptor;
  if (op.request.direction == Direction::kToPeer) {
    iovec iov{local, size};
    fi_rma_iov rma{remote, size, region.key};
    fi_msg_rma message{};
    message.msg_iov = &iov;
    message.desc = &descriptor;
    message.iov_count = 1;
    message.addr = op.peer;
    message.rma_iov = &rma;
    message.rma_iov_count = 1;
    message.context = &piece.context;
    // Delivery complete: the completion means the bytes are in the peer's memory, so the RPC
    // reply sent after it cannot overtake them (fi_rma(3), fi_cq(3)).
    return fi_writemsg(endpoint_->endpoint(), &message, FI_DELIVERY_COMPLETE | FI_COMPLETION);
  }
  return fi_read(endpoint_->endpoint(), local, size, descriptor, op.peer, remote, region.key,
                 &piece.context);
}

std::size_t Worker::reap() {
  if (in_flight_ == 0) return 0;
  std::array<fi_cq_entry, 64> entries;
  std::size_t total = 0;
  while (in_flight_ > 0) {
    const ssize_t count = fi_cq_read(endpoint_->completion_queue(), entries.data(), entries.size());
    if (count == -FI_EAGAIN) break;
    if (count == -FI_EAVAIL) {
      fi_cq_err_entry failure{};
      if (fi_cq_readerr(endpoint_->completion_queue(), &failure, 0) != 1) break;
      auto* piece = static_cast<Piece*>(failure.op_context);
      if (piece == nullptr || piece->op == nullptr) {
        // Nothing to attribute it to: shm reports the failed writes to a peer that died as
        // error entries with no op_context (seen here: err -FI_EIO, flags FI_COMPLETION), so
        // the operation it meant never completes; the completion deadline fails it.
        shared_->counters.unattributed_errors.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      Op* op = piece->op;
      ++total;
      if (!op->error) {
        // fi_cq_strerror decodes prov_errno; several providers (tcp) put a bare errno there
        // that means nothing to a reader, so it is reported as a number.
        op->error = Error(ErrorCode::kFabric,
                          std::string(op->request.direction == Direction::kToPeer
                                          ? "write to peer failed: "
                                          : "read from peer failed: ") +
                              fi_strerror(failure.err) + " (provider error " +
                              std::to_string(failure.prov_errno) + ")");
      }
      piece_done(piece);
      continue;
    }
    if (count < 0) {
      // The queue itself failed; nothing to attribute it to. Surface it on the next error entry.
      break;
    }
    for (ssize_t index = 0; index < count; ++index) {
      auto* piece = static_cast<Piece*>(entries[index].op_context);
      if (piece == nullptr || piece->op == nullptr) continue;  // not one of ours (see above)
      piece_done(piece);
    }
    total += static_cast<std::size_t>(count);
    if (static_cast<std::size_t>(count) < entries.size()) break;
  }
  return total;
}

void Worker::piece_done(Piece* piece) {
  Op* op = piece->op;
  release_piece(piece);
  --in_flight_;
  --op->in_flight;
  if (op->expired) {
    --held_pieces_;
  } else if (op->peer_entry) {
    --op->peer_entry->progress.live_pieces;
  }
  if (op->in_flight != 0 || op->queued) return;
  if (op->error) {
    finish(op, fail(*op->error));
  } else if (op->posting_done) {
    finish(op, TransferDone{op->length, std::nullopt});
  }
}

void Worker::expire_overdue(Clock::time_point now) {
  for (auto& owned : pieces_) {
    Op* op = owned->op;
    if (op == nullptr || op->expired || now - op->posted_at < configuration_.completion_deadline) {
      continue;
    }
    op->expired = true;
    held_pieces_ += op->in_flight;
    if (op->peer_entry) op->peer_entry->progress.live_pieces -= op->in_flight;
    shared_->counters.expired.fetch_add(1, std::memory_order_relaxed);
    // Replaces an error a piece already reported: the caller learns the transfer is over now,
    // and that its operand stays held.
    op->error = Error(ErrorCode::kTimedOut,
                      "no completion within the " +
                          std::to_string(configuration_.completion_deadline.count()) +
                          " ms completion deadline (peer dead or provider stuck); the local "
                          "buffer stays held until the provider lets go of it");
    // Still queued (partly posted): post() drops it, as it has an error now.
    op->request.context->on_expired(*op->error);
  }
}

void Worker::finish(Op* op, Outcome outcome) {
  const std::uint64_t client_id = op->request.client_id;
  auto& counters = shared_->counters;
  if (outcome) {
    counters.completed.fetch_add(1, std::memory_order_relaxed);
    auto& bytes = op->request.direction == Direction::kToPeer ? counters.bytes_to_peer
                                                              : counters.bytes_from_peer;
    bytes.fetch_add(op->length, std::memory_order_relaxed);
  } else {
    counters.failed.fetch_add(1, std::memory_order_relaxed);
  }
  op->operand = LocalOperand{};  // the lease goes now that the provider is done with it
  op->peer_entry.reset();
  if (outcome && op->request.want_checksum) {
    checksum_batch_.push_back(ChecksumItem{
        Completion{std::move(op->request.context), std::move(outcome)}, op->local, op->length});
  } else {
    batch_.push_back(Completion{std::move(op->request.context), std::move(outcome)});
  }
  op->request.regions.clear();
  free_ops_.push_back(op);

  // A client's count stays in the map at zero until its remove_peer: erasing it here would
  // allocate a node per transfer for a client with one request at a time.
  auto counted = client_outstanding_.find(client_id);
  if (counted != client_outstanding_.end() && --counted->second == 0 &&
      removal_pending_.erase(client_id) != 0) {
    client_outstanding_.erase(counted);
    peers_->release(client_id);
  }
}

void Worker::flush(bool queue_dry, bool parking) {
  if (checksum_flush_due(checksum_batch_.size(), queue_dry, parking)) dispatch_checksums();
  if (!batch_.empty()) deliver_now();
}

namespace {
// Offers each completion to its own context first, then hands the rest to the batch completer
// in one call. Returns how many were delivered either way.
std::size_t deliver(std::vector<Completion>& batch, const BatchCompleter& complete_batch) {
  std::size_t kept = 0;
  for (std::size_t index = 0; index < batch.size(); ++index) {
    Completion& completion = batch[index];
    if (completion.context && completion.context->on_complete(completion.outcome)) {
      completion.context.reset();
      continue;
    }
    if (kept != index) batch[kept] = std::move(completion);
    ++kept;
  }
  const std::size_t total = batch.size();
  if (kept > 0 && complete_batch) complete_batch(std::span<Completion>(batch.data(), kept));
  batch.clear();
  return total;
}
}  // namespace

// outstanding() drops before the completer runs, so a caller woken by its completion never
// sees its own transfer still counted.
void Worker::deliver_now() {
  shared_->outstanding.fetch_sub(batch_.size(), std::memory_order_acq_rel);
  deliver(batch_, shared_->complete_batch);
}

void Worker::dispatch_checksums() {
  {
    std::lock_guard lock(shared_->jobs_mutex);
    ++shared_->jobs;
  }
  // std::function needs a copyable job, so the batch travels in a shared_ptr.
  auto items = std::make_shared<std::vector<ChecksumItem>>();
  items->swap(checksum_batch_);
  checksum_batch_.reserve(kChecksumBatch);
  // The job holds no owning reference to the service: the worker waits for `jobs` to reach
  // zero before the service can go, so the raw pointer is valid for the job's whole life. An
  // owning one could make this pool thread drop the service's last reference, and with it the
  // pool's, and the pool would then join its own thread (seen under tsan: std::system_error,
  // "Resource deadlock avoided").
  ServiceShared* shared = shared_.get();
  shared_->pool->post([items, shared] {
    std::vector<Completion> batch;
    batch.reserve(items->size());
    for (ChecksumItem& item : *items) {
      item.completion.outcome->checksum = crc32c(std::span<const std::byte>(item.data, item.size));
      batch.push_back(std::move(item.completion));
    }
    shared->outstanding.fetch_sub(batch.size(), std::memory_order_acq_rel);
    deliver(batch, shared->complete_batch);
    // Notified under the lock: once it is released the service may be destroyed, so nothing
    // after it may touch `shared`.
    std::lock_guard lock(shared->jobs_mutex);
    --shared->jobs;
    shared->jobs_done.notify_all();
  });
}

void Worker::release_held() {
  // fi_close(ep) returns only once the provider no longer uses the endpoint's operations and
  // their buffers (fi_endpoint(3)); their completions will never be reported.
  endpoint_->close_endpoint();
  for (auto& owned : pieces_) {
    if (owned->op != nullptr) piece_done(owned.get());
  }
}

Worker::Op* Worker::acquire_op() {
  if (free_ops_.empty()) {
    ops_.push_back(std::make_unique<Op>());
    return ops_.back().get();
  }
  Op* op = free_ops_.back();
  free_ops_.pop_back();
  // Reset everything but the request, which the caller overwrites.
  op->peer = FI_ADDR_UNSPEC;
  op->peer_entry.reset();
  op->local = nullptr;
  op->length = 0;
  op->operand = LocalOperand{};
  op->region = op->region_offset = op->local_offset = op->in_flight = 0;
  op->posting_done = op->queued = op->eagain = op->expired = op->owner_asked = false;
  op->error.reset();
  return op;
}

void Worker::release_piece(Piece* piece) {
  piece->op = nullptr;
  free_pieces_.push_back(piece);
}

Worker::Piece* Worker::acquire_piece(Op* op) {
  Piece* piece;
  if (free_pieces_.empty()) {
    pieces_.push_back(std::make_unique<Piece>());
    piece = pieces_.back().get();
  } else {
    piece = free_pieces_.back();
    free_pieces_.pop_back();
  }
  std::memset(&piece->context, 0, sizeof(piece->context));
  piece->op = op;
  return piece;
}

}  // namespace dma::internal
