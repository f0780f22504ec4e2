// Private: handing finished transfers to their callers, and checksums to the CRC pool.
//
// A completer called once per transfer would cost a call (and usually a lock) per op; one call
// per batch is the contract (service.hpp). Transfers that asked for a checksum must not have it
// computed on the worker (CRC32C of a 16 MiB value would stall every other transfer), so they go
// to the pool in batches of kChecksumBatch; the one exception, a lone small transfer while the
// worker has nothing else to do, the worker decides and checksums before it gets here
// (worker.hpp, step 5). The flush policy prevents the opposite failure: a
// partial batch left behind waits for unrelated traffic, so it goes as soon as the completion
// queue runs dry and always before the worker parks (a parked worker waits for an unrelated
// message). outstanding() drops before the completer runs, so a caller woken by its completion
// never sees its own transfer still counted.
//
// A checksummed transfer taken in while the worker is idle is checksummed as it lands instead (a
// ChecksumStream): the worker posts it in pieces (poster.hpp), one per turn, and the pieces'
// checksums are joined (crc32c_combine) when the transfer is done. Two kinds:
// - larger than worker_checksum_max: each landed piece's CRC32C runs on the pool at once, and
//   whichever finishes last, the worker's finish or the last piece's job, joins them. The
//   checksum then costs the transfer only its last piece's, not a pass over the whole value
//   after the copy (a 16 MiB DMA.SET over shm: ~0.9 of 4.4 ms; docs/PERFORMANCE.md, "Speed,
//   eighth pass");
// - at most worker_checksum_max (`here`): the worker checksums each piece itself as it reaps
//   it, in pieces of kHerePiece, while the bytes just copied are still in its cache. A 1 MiB
//   value checksummed after its whole copy is read back from memory: 34-48 us per MiB against
//   15-18 us in 256 KiB pieces on this VM, and ~75 us in the module's worker
//   (docs/PERFORMANCE.md, "Speed, ninth pass").
// A stream counts its owners (`tokens`: the worker until it finishes the transfer, and each
// piece's pool job), and its completion is delivered only when the last one lets go, so no job
// reads a landing its caller already has back.
//
// No allocation per transfer: a checksum batch travels to the pool in a ChecksumJob that comes
// back to a free list when the job is done (its vectors keep their capacity), and the job
// posted is one pointer, which std::function stores without allocating.
//
// Ownership: owned by the Worker; pool jobs hold a raw pointer to their ChecksumJob and through
// it to this Delivery and its ServiceShared, valid because the worker waits for
// ServiceShared::jobs to reach zero before it (and the service) can go. An owning one
// could make a pool thread drop the service's last reference, and with it the pool's, and the
// pool would join its own thread. Thread-safety: the worker thread only; jobs run on the pool.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "dma/service.hpp"
#include "worker/op_table.hpp"
#include "worker/service_shared.hpp"

namespace dma::internal {

inline constexpr std::size_t kChecksumBatch = 32;
// Streams: the least piece, and the most pieces (a longer transfer gets larger pieces). A piece
// the worker checksums itself is smaller: it must still be in the worker's cache when reaped.
inline constexpr std::size_t kStreamPiece = std::size_t{1} << 20;
inline constexpr std::size_t kHerePiece = std::size_t{256} << 10;
inline constexpr std::size_t kMaxStreamPieces = 64;
// The piece size a checksummed transfer of `length` bytes into one region is streamed in, with
// pieces of at least `least` (kStreamPiece, or kHerePiece when the worker checksums them) and of
// at most `max_piece` posted; 0 if it is not streamed (it fits one piece, or the pieces it
// would need are more than kMaxStreamPieces).
std::size_t stream_piece_for(std::size_t length, std::size_t max_piece,
                             std::size_t least = kStreamPiece) noexcept;

class Delivery;
struct ChecksumStream {
  Delivery* owner = nullptr;
  const std::byte* data = nullptr;
  std::size_t length = 0;
  std::size_t piece = 0;
  bool here = false;  // the worker checksums each piece as it lands (no pool jobs)
  // The worker's (until it finishes the transfer) plus one per piece job not yet done.
  std::atomic<std::uint32_t> tokens{0};
  std::array<std::uint32_t, kMaxStreamPieces> crcs{};
  std::vector<Completion> done;  // the transfer's completion, once the worker has finished it
};
// Whether a checksum batch of `batched` should go now: full, the queue ran dry, or parking.
bool checksum_flush_due(std::size_t batched, bool queue_dry, bool parking) noexcept;

class Delivery {
 public:
  explicit Delivery(ServiceShared& shared);

  // Queues one finished transfer; with `checksum`, the CRC32C of [data, data + size) is computed
  // on the pool first (`outcome` must then be a success).
  void add(Completion completion) { batch_.push_back(std::move(completion)); }
  void add_checksummed(Completion completion, const std::byte* data, std::size_t size) {
    checksum_batch_.push_back(ChecksumItem{std::move(completion), data, size});
  }
  // Dispatches the checksum batch if checksum_flush_due, then delivers the rest.
  void flush(bool queue_dry, bool parking);

  std::size_t checksums_batched() const noexcept { return checksum_batch_.size(); }

  // A stream for a transfer of `length` bytes landing at `data`, in pieces of `piece`
  // (stream_piece_for), checksummed `here` on the worker or on the pool. The worker holds it
  // until close_stream().
  ChecksumStream* open_stream(const std::byte* data, std::size_t length, std::size_t piece,
                              bool here);
  // A piece that landed: its checksum now, on this (the worker's) thread if the stream is
  // `here`, else started on the pool.
  void checksum_piece(const LandedPiece& piece);
  // The worker is done with the transfer: `completion` goes to its caller (with the joined
  // checksum, if it succeeded) once every piece's job has finished; now, if they all have.
  void close_stream(ChecksumStream* stream, Completion completion);
  // Pieces checksummed as they landed, on the pool and on the worker (tests, diagnostics; a
  // pool thread adds to the first).
  std::uint64_t pieces_streamed() const noexcept {
    return pieces_streamed_.load(std::memory_order_relaxed);
  }
  std::uint64_t pieces_here() const noexcept { return pieces_here_; }

 private:
  struct ChecksumItem {
    Completion completion;
    const std::byte* data;
    std::size_t size;
  };
  struct ChecksumJob {
    Delivery* owner = nullptr;
    std::vector<ChecksumItem> items;
    std::vector<Completion> done;
  };
  void deliver_now();
  void dispatch_checksums();
  static void run_checksums(ChecksumJob* job);
  static void run_piece(ChecksumStream* stream, std::size_t offset, std::size_t size);
  // Joins the pieces' checksums into the completion's (when it succeeded).
  static void join(ChecksumStream& stream);

  ServiceShared& shared_;
  std::vector<Completion> batch_;
  std::vector<ChecksumItem> checksum_batch_;
  // Every job ever made, and the idle ones; free_jobs_ is guarded by shared_.jobs_mutex.
  std::vector<std::unique_ptr<ChecksumJob>> jobs_;
  std::vector<ChecksumJob*> free_jobs_;
  // Every stream ever made, and the idle ones; free_streams_ is guarded by shared_.jobs_mutex.
  std::vector<std::unique_ptr<ChecksumStream>> streams_;
  std::vector<ChecksumStream*> free_streams_;
  std::atomic<std::uint64_t> pieces_streamed_{0};
  std::uint64_t pieces_here_ = 0;
};

}  // namespace dma::internal
