#include "worker/worker.hpp"

#include <algorithm>
#include <span>
#include <thread>

#include "dma/configuration.hpp"
#include "dma/protocol.hpp"

#include "worker/prepare.hpp"

namespace dma::internal {

namespace {
std::size_t cap_of(const Endpoint& endpoint) {
  return std::max<std::size_t>(1, endpoint.describe().max_in_flight);
}
std::size_t max_piece_of(const Endpoint& endpoint, const Configuration& configuration) {
  std::size_t max_piece = endpoint.describe().max_msg_size == 0 ? (std::size_t{1} << 30)
                                                                : endpoint.describe().max_msg_size;
  if (configuration.max_piece_bytes != 0) {
    max_piece = std::min(max_piece, configuration.max_piece_bytes);
  }
  return max_piece;
}
// tcp (rxm over the tcp provider) moves a large write faster in 512 KiB pieces in flight
// together than whole: DMA.GETs over loopback at one client, 1 MiB 2.7 -> 3.0 GB/s and 16 MiB
// 3.0 -> 3.6 GB/s on average (docs/PERFORMANCE.md, "Speed, thirteenth pass"). 256 KiB pieces
// were slower than whole ones; the reads the worker checksums go in pieces of their own
// (stream_piece_for). An explicit max_piece_bytes bounds both directions instead.
constexpr std::size_t kTcpWritePiece = std::size_t{512} << 10;
std::size_t max_write_piece_of(const Endpoint& endpoint, const Configuration& configuration) {
  const std::size_t max_piece = max_piece_of(endpoint, configuration);
  if (configuration.max_piece_bytes != 0) return max_piece;
  const bool tcp = endpoint.describe().provider == canonical_provider("tcp");
  return tcp ? std::min(max_piece, kTcpWritePiece) : max_piece;
}
}  // namespace

Result<std::unique_ptr<Worker>> Worker::open(const Configuration& configuration,
                                             const std::string& domain,
                                             std::shared_ptr<ServiceShared> shared,
                                             WorkerOptions options) {
  // Runs on the worker thread, which owns the domain: registrations whose last lease drops on
  // another thread are queued for it and wake it.
  std::weak_ptr<ServiceShared> weak = shared;
  DMA_TRY_ASSIGN(std::unique_ptr<Endpoint> endpoint,
                 Endpoint::open(configuration, Role::kInitiator, domain,
                                DomainOwner::calling_thread([weak] {
                                  if (auto alive = weak.lock()) alive->channel.wake();
                                })));
  return std::unique_ptr<Worker>(
      new Worker(std::move(endpoint), configuration, std::move(shared), options));
}

Worker::Worker(std::unique_ptr<Endpoint> endpoint, const Configuration& configuration,
               std::shared_ptr<ServiceShared> shared, WorkerOptions options)
    : endpoint_(std::move(endpoint)),
      shared_(std::move(shared)),
      held_poll_interval_(options.held_poll_interval),
      idle_poll_(configuration.worker_idle_poll),
      checksum_max_(configuration.worker_checksum_max),
      poster_(*endpoint_, cap_of(*endpoint_), max_piece_of(*endpoint_, configuration),
              max_write_piece_of(*endpoint_, configuration),
              configuration.progress_deadline, options.clock, shared_->counters, shared_->gate),
      reaper_(*endpoint_, shared_->counters, shared_->gate),
      expiry_(configuration.completion_deadline, options.clock, shared_->counters),
      delivery_(*shared_) {
  const bool register_operands =
      endpoint_->local_registration_required() || configuration.always_register_operands;
  regions_ = std::make_unique<LocalRegions>(*endpoint_, register_operands);
  efa_addresses_ = address_format_from(endpoint_->info()->addr_format) == AddressFormat::kEfa;
  yield_in_spin_ = endpoint_->describe().provider == "shm";
  // shm copies a read inside fi_read, on this thread: a piece's checksum cannot overlap the
  // next piece's copy there (docs/PERFORMANCE.md, "Speed, ninth pass").
  checksum_pieces_here_ = !yield_in_spin_;
  peers_ = std::make_unique<PeerAddresses>(
      endpoint_->address_vector(), address_format_from(endpoint_->info()->addr_format),
      endpoint_->info()->addr_format);
  inbox_.reserve(64);
  ended_.reserve(64);
  landed_.reserve(64);
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
  // Left behind by a shutdown while stuck, and back: nothing it could do is still wanted.
  if (shared_->orphaned.load(std::memory_order_acquire)) return false;
  if (closed_ && table_.live_in_flight() > 0 && drain_overdue()) {
    abandon(Error(ErrorCode::kWorkerGone,
                  "the service shut down before the transfer completed (shutdown deadline); the "
                  "local buffer was held until the endpoint closed"));
  }
  // Expired pieces are not work: a worker holding only those parks (waking to reap them).
  if (closed_ && idle()) {
    if (table_.held > 0) release_held();
    delivery_.flush(true, true);
    return false;
  }
  const bool idle_now = idle();
  if (!idle_now) idle_passes_ = 0;
  const bool poll_on = may_block && idle_now && idle_poll_due();
  const bool park = may_block && idle_now && !poll_on;
  const bool nap = may_block && !idle_now && nap_due();
  if (park || nap || poll_on) delivery_.flush(true, true);  // nothing may wait behind a wait
  if (nap) ++naps_;
  if (poll_on) ++idle_polls_;
  // One writer: a plain store, read by the watchdog.
  shared_->turns.store(++turns_, std::memory_order_relaxed);
  if (park) shared_->parked.store(true, std::memory_order_relaxed);
  take_messages(park || nap, nap ? kNapInterval : park_timeout());
  if (park) shared_->parked.store(false, std::memory_order_relaxed);
  const std::uint64_t took = table_.batches;
  // Polling on with nothing come: let whoever waits for this core have it (a yield is a system
  // call; a pass that took work goes straight on).
  if (poll_on && took == quiet_batches_) std::this_thread::yield();
  const std::size_t queued = table_.pending.size();
  post();
  const std::uint64_t reaped_before = table_.reaped[0] + table_.reaped[1];
  const bool dry = reap();
  // Room freed by the reap goes to the next queued transfer before the callbacks run (step 3).
  if (table_.reaped[0] + table_.reaped[1] != reaped_before && !table_.pending.empty()) post(true);
  if (std::optional<std::string> wedged = expiry_.check(table_);
      wedged && !retired_ && !wedge_reported_) {
    // The service opens the new endpoint first and only then retires this one (a
    // RetireMessage), so a caller answered "endpoint replaced" finds the new one in place when
    // it says hello again (a re-HELLO's proof read posted here would fail too).
    wedge_reported_ = true;
    if (shared_->on_retired) shared_->on_retired("the endpoint is wedged: " + *wedged);
  }
  delivery_.flush(dry, false);
  // Progress: a message taken, something posted, or a completion reaped.
  if (took != quiet_batches_ || queued != table_.pending.size() || !dry) {
    quiet_passes_ = 0;
    idle_passes_ = 0;  // work done: an idle poll starts afresh after it
  }
  quiet_batches_ = table_.batches;
  return true;
}

bool Worker::drain_overdue() {
  const std::int64_t until = shared_->drain_until_ns.load(std::memory_order_acquire);
  if (until == 0) return false;
  return std::chrono::steady_clock::now().time_since_epoch().count() >= until;
}

bool Worker::nap_due() {
  if (!table_.pending.empty() || table_.live_in_flight() == 0) {
    quiet_passes_ = 0;
    return false;
  }
  ++quiet_passes_;
  // A spin must not keep the core from whoever needs it: on shm the target that copies this
  // transfer may be queued behind us on it (seen: 113 us of its scheduling delay per 1 MiB,
  // with the other core idle). Not in the first 64 quiet passes, which short transfers
  // complete within: a yield is a system call (~1 us here), and one per 2 us transfer took a
  // third of the rate of 64 B writes at depth 1.
  // Only on shm: on tcp and net the bytes are moved by the provider's thread in our own process
  // (pinned beside us in `dma-bench fabric --pin`), and yielding to it made a 1 MiB net read at
  // depth 1 a quarter slower than spinning and then napping (0.76 of raw against 1.01).
  if (yield_in_spin_ && quiet_passes_ > 64 && quiet_passes_ % kYieldEvery == 0) {
    std::this_thread::yield();
  }
  if (quiet_passes_ % 64 != 0) return false;
  const auto now = std::chrono::steady_clock::now();
  if (quiet_passes_ == 64) {
    quiet_since_ = now;
    return false;
  }
  return now - quiet_since_ >= kSpinBeforeNap;
}

bool Worker::idle_poll_due() {
  if (idle_poll_.count() == 0 || closed_) return false;
  // The first idle pass reads no clock: at depth 1 the next transfer is usually on the channel
  // already (submitted from the completion callback), and this pass takes it.
  if (idle_passes_++ == 0) return true;
  const auto now = std::chrono::steady_clock::now();
  if (idle_passes_ == 2) idle_since_ = now;
  return now - idle_since_ < idle_poll_;
}

void Worker::take_messages(bool park, std::chrono::microseconds timeout) {
  if (!shared_->channel.take(inbox_, park, timeout)) closed_ = true;
  if (!inbox_.empty()) ++table_.batches;
  for (Message& message : inbox_) intake(message);
  inbox_.clear();
  if (endpoint_->deferred_closes()->pending()) endpoint_->deferred_closes()->drain();
}

void Worker::intake(Message& message) {
  if (auto* request = std::get_if<TransferRequest>(&message)) {
    accept(std::move(*request));
  } else if (auto* add = std::get_if<AddPeerMessage>(&message)) {
    clients_.added(add->client_id);
    Result<std::shared_ptr<RegisteredAddress>> entry =
        peers_->handle(add->client_id, add->address.bytes());
    add->reply.send(entry ? Status{} : Status(fail(std::move(entry).error())));
  } else if (auto* remove = std::get_if<RemovePeerMessage>(&message)) {
    if (clients_.remove(remove->client_id)) peers_->release(remove->client_id);
  } else if (auto* registration = std::get_if<RegisterMessage>(&message)) {
    registration->reply.send(regions_->pin(registration->base, registration->length));
  } else if (auto* retirement = std::get_if<RetireMessage>(&message)) {
    if (!retired_) retire(retirement->reason, false);
  }
}

void Worker::retire(const std::string& reason, bool tell_service) {
  abandon(Error(ErrorCode::kFabric, "endpoint replaced: " + reason));
  retired_reason_ = reason;
  finish_ended();
  if (tell_service && shared_->on_retired) shared_->on_retired(reason);
}

void Worker::abandon(const Error& error) {
  if (!retired_) retired_reason_ = error.message();
  retired_ = true;
  for (const auto& owned : table_.pieces()) {
    if (owned->op != nullptr) expire_op(table_, *owned->op, error, shared_->counters);
  }
  for (Op* op = table_.pending.front(); op != nullptr; op = op->next_pending) {
    expire_op(table_, *op, error, shared_->counters);
  }
}

void Worker::accept(TransferRequest&& request) {
  Op* op = table_.acquire_op();
  op->request = std::move(request);
  op->batch = table_.batches;
  clients_.opened(op->request.client_id);
  if (closed_) {
    finish(op, fail(ErrorCode::kWorkerGone, "fabric worker is gone (service shutting down)"));
    return;
  }
  if (retired_) {
    // Submitted as the service moved to the new endpoint: never posted here.
    finish(op, fail(ErrorCode::kFabric, "endpoint replaced: " + retired_reason_));
    return;
  }
  if (Status ready = prepare_transfer(*op, *peers_, *regions_, efa_addresses_); !ready) {
    finish(op, fail(std::move(ready).error()));
    return;
  }
  if (op->length == 0) {
    finish(op, TransferDone{0, std::nullopt});
    return;
  }
  if (op->request.want_checksum && stream_due(*op)) {
    // Over worker_checksum_max the pool checksums the pieces; up to it the worker does, as
    // they land, where they land while it does other things (delivery.hpp).
    const bool here = op->length <= checksum_max_;
    if (!here || checksum_pieces_here_) {
      // Within the direction's own largest piece: the poster cuts no piece of a stream shorter
      // than stream_piece (but the last), or the checksums' pieces would not be the posts'.
      op->stream_piece = stream_piece_for(op->length, poster_.max_piece(op->request.direction),
                                          here ? kHerePiece : kStreamPiece);
      if (op->stream_piece != 0) {
        op->stream = delivery_.open_stream(op->local, op->length, op->stream_piece, here);
      }
    }
  }
  op->queued = true;
  table_.pending.push_back(op);
}

void Worker::post(bool again) {
  poster_.post(table_, closed_, ended_, again && yield_in_spin_);
  finish_ended();
}

bool Worker::reap() {
  const std::size_t reaped = reaper_.reap(table_, ended_, landed_);
  for (const LandedPiece& piece : landed_) delivery_.checksum_piece(piece);
  landed_.clear();
  poster_.ring_unfinished_reads();
  finish_ended();
  return reaped == 0 || table_.in_flight == 0;
}

void Worker::finish_ended() {
  for (Op* op : ended_) {
    if (op->error) {
      finish(op, fail(*op->error));
    } else {
      finish(op, TransferDone{op->length, std::nullopt});
    }
  }
  ended_.clear();
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
  if (op->stream != nullptr) {
    delivery_.close_stream(op->stream, Completion{std::move(op->request.context), std::move(outcome)});
    op->stream = nullptr;
  } else if (outcome && op->request.want_checksum && checksum_here(*op)) {
    outcome->checksum = crc32c(std::span<const std::byte>(op->local, op->length));
    ++checksums_here_;
    delivery_.add(Completion{std::move(op->request.context), std::move(outcome)});
  } else if (outcome && op->request.want_checksum) {
    delivery_.add_checksummed(Completion{std::move(op->request.context), std::move(outcome)},
                              op->local, op->length);
  } else {
    delivery_.add(Completion{std::move(op->request.context), std::move(outcome)});
  }
  op->request.regions.clear();
  table_.release_op(op);
  if (clients_.closed(client_id)) peers_->release(client_id);
}

bool Worker::stream_due(const Op& op) const noexcept {
  // Into one region (a piece is then a slice of the landing), and only while nothing else is
  // queued or live. Over worker_checksum_max, streaming spreads one transfer's checksum over a
  // core that is otherwise idle; with the cores busy with other transfers it costs a pool
  // hand-off per piece and gains nothing (16 MiB DMA.SETs over shm at 4 clients ran 13 % slower
  // streamed always; docs/PERFORMANCE.md, "Speed, eighth pass"). Up to it, the worker checksums
  // the pieces itself as they land, which it would only do for a lone transfer anyway
  // (checksum_here).
  return op.request.regions.size() == 1 && table_.pending.empty() && table_.live_in_flight() == 0;
}

bool Worker::checksum_here(const Op& op) const noexcept {
  // Only a lone completion (a batch of them goes to the pool, which works beside the worker),
  // with nothing else for the worker to do: nothing queued or live, nothing on the channel.
  return op.length <= checksum_max_ && ended_.size() <= 1 && table_.pending.empty() &&
         table_.live_in_flight() == 0 && !shared_->channel.has_pending();
}

void Worker::release_held() {
  // fi_close(ep) returns only once the provider no longer uses the endpoint's operations and
  // their buffers (fi_endpoint(3)); their completions will never be reported.
  endpoint_->close_endpoint();
  for (const auto& owned : table_.pieces()) {
    if (owned->op == nullptr) continue;
    if (Op* over = table_.piece_done(owned.get())) ended_.push_back(over);
  }
  finish_ended();
}

}  // namespace dma::internal
