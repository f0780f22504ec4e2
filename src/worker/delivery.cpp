#include "worker/delivery.hpp"

#include <algorithm>
#include <memory>
#include <span>

#include "dma/protocol.hpp"

namespace dma::internal {

bool checksum_flush_due(std::size_t batched, bool queue_dry, bool parking) noexcept {
  if (batched == 0) return false;
  return batched >= kChecksumBatch || queue_dry || parking;
}

namespace {
// Offers each completion to its own context first, then hands the rest to the batch completer
// in one call.
void deliver(std::vector<Completion>& batch, const BatchCompleter& complete_batch) {
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
  if (kept > 0 && complete_batch) complete_batch(std::span<Completion>(batch.data(), kept));
  batch.clear();
}
// An orphaned worker's completions (service_shared.hpp): their callers were answered when the
// worker was left behind, and the completer and the contexts' owners may be gone, so the
// contexts are neither delivered nor destroyed.
void forget(std::vector<Completion>& batch) {
  for (Completion& completion : batch) {
    if (completion.context) keep_forever(std::shared_ptr<Operands>(completion.context.release(), [](Operands*) {}));
  }
  batch.clear();
}
}  // namespace

std::size_t stream_piece_for(std::size_t length, std::size_t max_piece, std::size_t least) noexcept {
  // At least `least`, and large enough that kMaxStreamPieces cover the transfer.
  std::size_t piece = std::max(least, (length + kMaxStreamPieces - 1) / kMaxStreamPieces);
  piece = std::min(piece, max_piece);
  if (piece == 0 || length <= piece) return 0;
  return (length + piece - 1) / piece <= kMaxStreamPieces ? piece : 0;
}

Delivery::Delivery(ServiceShared& shared) : shared_(shared) {
  batch_.reserve(64);
  checksum_batch_.reserve(kChecksumBatch);
}

void Delivery::flush(bool queue_dry, bool parking) {
  if (checksum_flush_due(checksum_batch_.size(), queue_dry, parking)) dispatch_checksums();
  if (!batch_.empty()) deliver_now();
}

void Delivery::deliver_now() {
  shared_.outstanding.fetch_sub(batch_.size(), std::memory_order_acq_rel);
  if (shared_.orphaned.load(std::memory_order_acquire)) {
    forget(batch_);
    return;
  }
  deliver(batch_, shared_.complete_batch);
}

void Delivery::dispatch_checksums() {
  ChecksumJob* job = nullptr;
  {
    std::lock_guard lock(shared_.jobs_mutex);
    ++shared_.jobs;
    if (!free_jobs_.empty()) {
      job = free_jobs_.back();
      free_jobs_.pop_back();
    }
  }
  if (job == nullptr) {
    // Only while the pool falls behind further than ever before; jobs_ is the worker's alone.
    jobs_.push_back(std::make_unique<ChecksumJob>());
    job = jobs_.back().get();
    job->owner = this;
    job->items.reserve(kChecksumBatch);
    job->done.reserve(kChecksumBatch);
    std::lock_guard lock(shared_.jobs_mutex);
    free_jobs_.reserve(jobs_.size());
  }
  // The job's empty vector (with its capacity) becomes the next batch.
  job->items.swap(checksum_batch_);
  shared_.pool->post([job] { run_checksums(job); });
}

ChecksumStream* Delivery::open_stream(const std::byte* data, std::size_t length,
                                      std::size_t piece, bool here) {
  ChecksumStream* stream = nullptr;
  {
    std::lock_guard lock(shared_.jobs_mutex);
    if (!free_streams_.empty()) {
      stream = free_streams_.back();
      free_streams_.pop_back();
    }
  }
  if (stream == nullptr) {
    // Only while more large transfers are in flight than ever before; streams_ is the worker's.
    streams_.push_back(std::make_unique<ChecksumStream>());
    stream = streams_.back().get();
    stream->owner = this;
    stream->done.reserve(1);
    std::lock_guard lock(shared_.jobs_mutex);
    free_streams_.reserve(streams_.size());
  }
  stream->data = data;
  stream->length = length;
  stream->piece = piece;
  stream->here = here;
  stream->tokens.store(1, std::memory_order_relaxed);  // the worker's
  return stream;
}

void Delivery::checksum_piece(const LandedPiece& piece) {
  ChecksumStream& stream = *piece.stream;
  if (stream.here) {
    stream.crcs[piece.offset / stream.piece] =
        crc32c(std::span<const std::byte>(stream.data + piece.offset, piece.size));
    ++pieces_here_;
    return;
  }
  // The job's token is taken here, on the worker, before the worker can close the stream.
  piece.stream->tokens.fetch_add(1, std::memory_order_relaxed);
  {
    std::lock_guard lock(shared_.jobs_mutex);
    ++shared_.jobs;
  }
  shared_.pool->post([stream = piece.stream, offset = piece.offset, size = piece.size] {
    run_piece(stream, offset, size);
  });
}

void Delivery::close_stream(ChecksumStream* stream, Completion completion) {
  stream->done.push_back(std::move(completion));
  if (stream->tokens.fetch_sub(1, std::memory_order_acq_rel) != 1) return;  // a job finishes it
  join(*stream);
  batch_.push_back(std::move(stream->done.front()));
  stream->done.clear();
  std::lock_guard lock(shared_.jobs_mutex);
  free_streams_.push_back(stream);
}

void Delivery::join(ChecksumStream& stream) {
  Completion& completion = stream.done.front();
  if (!completion.outcome) return;
  const std::size_t pieces = (stream.length + stream.piece - 1) / stream.piece;
  std::uint32_t crc = stream.crcs[0];
  for (std::size_t index = 1; index < pieces; ++index) {
    const std::size_t size = std::min(stream.piece, stream.length - index * stream.piece);
    crc = crc32c_combine(crc, stream.crcs[index], size);
  }
  completion.outcome->checksum = crc;
}

void Delivery::run_piece(ChecksumStream* stream, std::size_t offset, std::size_t size) {
  // Raw, not owning, as run_checksums (the header).
  Delivery* owner = stream->owner;
  ServiceShared* shared = &owner->shared_;
  stream->crcs[offset / stream->piece] =
      crc32c(std::span<const std::byte>(stream->data + offset, size));
  owner->pieces_streamed_.fetch_add(1, std::memory_order_relaxed);
  const bool last = stream->tokens.fetch_sub(1, std::memory_order_acq_rel) == 1;
  if (last) {
    // The worker has finished the transfer: its completion goes from here.
    join(*stream);
    shared->outstanding.fetch_sub(1, std::memory_order_acq_rel);
    if (shared->orphaned.load(std::memory_order_acquire)) {
      forget(stream->done);
    } else {
      deliver(stream->done, shared->complete_batch);  // clears `done`
    }
  }
  // As in run_checksums: nothing may touch `shared` or the stream once the lock is released.
  std::lock_guard lock(shared->jobs_mutex);
  if (last) owner->free_streams_.push_back(stream);
  --shared->jobs;
  shared->jobs_done.notify_all();
}

void Delivery::run_checksums(ChecksumJob* job) {
  // Raw, not owning: see the header (seen under tsan: std::system_error, "Resource deadlock
  // avoided", when a job held the last reference).
  ServiceShared* shared = &job->owner->shared_;
  for (ChecksumItem& item : job->items) {
    item.completion.outcome->checksum = crc32c(std::span<const std::byte>(item.data, item.size));
    job->done.push_back(std::move(item.completion));
  }
  job->items.clear();
  shared->outstanding.fetch_sub(job->done.size(), std::memory_order_acq_rel);
  if (shared->orphaned.load(std::memory_order_acquire)) {
    forget(job->done);
  } else {
    deliver(job->done, shared->complete_batch);  // clears `done`
  }
  // Back to the free list and notified under the lock: once it is released the service may be
  // destroyed, so nothing after it may touch `shared` or the job.
  std::lock_guard lock(shared->jobs_mutex);
  job->owner->free_jobs_.push_back(job);
  --shared->jobs;
  shared->jobs_done.notify_all();
}

}  // namespace dma::internal
