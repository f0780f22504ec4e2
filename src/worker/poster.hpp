// Private: posting transfers' pieces to the provider, and what -FI_EAGAIN means.
//
// fi_writemsg and fi_read answer -FI_EAGAIN when the provider cannot take the operation now
// (fi_rma(3)): shm's queue is full, or a tcp/net connection is still being set up. Two failures
// follow from handling that naively. Retrying at once burns thousands of calls per completion
// (measured on shm), so an op answered -FI_EAGAIN goes to the back of the queue, behind other
// peers' transfers (among only its own peer's it keeps its place: going behind them gains
// nothing and starved it), and posting stops for this pass; reaping comes next and frees room.
// And a peer that never accepts a
// connection would leave its transfers queued forever, so past the progress deadline of
// continuous refusals the op fails as unreachable. That clock is the *peer's* (its
// RegisteredAddress::Progress), not the op's: an op sent to the back of a deep queue otherwise
// failed at its next turn though the peer had taken posts all along. On efa, where ops hold no
// entry, the clock is the op's own. Before an op's first post to an shm peer, the peer's process
// is asked whether it has exited (peer_process.hpp: a post to a dead one can spin forever).
//
// At shutdown a transfer never posted fails as kWorkerGone, except on shm while its peer has
// refused us and taken nothing yet: shm's first post to a peer leaves our name in the peer's
// command queue and answers -FI_EAGAIN, and the peer's progress, reading that name later, maps
// and reads our region. If we closed the endpoint first (which unmaps and unlinks the region),
// the peer's progress thread crashed (SIGSEGV in smr_progress_connreq reading peer_smr->pid;
// 1-3 runs in 100 of Races.dropping_a_service_*/shm). Such a transfer keeps its turn until one
// is taken, which shm does only once the request has been read; the liveness check, the
// progress deadline and the shutdown drain still bound the wait.
//
// Waking an shm peer (its doorbell, liveness_mark.hpp): after a write, at once, since the
// copy runs in the peer's progress (FI_DELIVERY_COMPLETE keeps shm off its fast path). A read
// usually needs no peer at all: with FI_MR_VIRT_ADDR and no RMA ordering shm copies it inside
// fi_read with process_vm_readv and writes our completion before returning ("fast RMA",
// docs/PROVIDERS.md). So a read's ring waits for the reap that follows its post, and rings only
// if the read is still in flight then (no cross-memory attach: FI_SHM_DISABLE_CMA, a Yama
// ptrace scope that forbids it). Ringing every read woke the client's progress thread for
// nothing; it then polled for its linger on the core the server's main thread needed (1 MiB
// DMA.SET over shm: p50 232 -> 212 us, docs/PERFORMANCE.md). A fast read still leaves a notice
// in the peer's command queue, which only its progress drains: every kReadsPerRing unrung reads
// to a peer ring anyway, before the queue fills and posts are refused.
//
// A streamed transfer (Op::stream: checksummed as it lands, delivery.hpp) posts pieces of at
// most Op::stream_piece bytes, one per turn, so that the reap after each checksums that piece
// (on the pool, or on the worker for a small stream) while the next is on the wire (on shm,
// copied inside the next fi_read).
//
// Ownership: owned by the Worker; borrows the endpoint and counters. Thread-safety: the worker
// thread only.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "fabric/endpoint.hpp"
#include "worker/clock.hpp"
#include "worker/op_table.hpp"
#include "worker/service_shared.hpp"

namespace dma::internal {

// How old an answer to "has the shm peer's process exited?" may be when an operation retries
// after -FI_EAGAIN (a new operation always asks afresh; peer_process.hpp).
inline constexpr std::chrono::milliseconds kOwnerRecheck{1};

// Reads posted to an shm peer without waking it before one does (top of this file). shm's
// command queue holds 1024 by default (FI_SHM_RX_SIZE).
inline constexpr std::uint32_t kReadsPerRing = 64;

class Poster {
 public:
  // `max_piece` bounds a read's pieces, `max_write_piece` a write's (worker.cpp).
  Poster(const Endpoint& endpoint, std::size_t cap, std::size_t max_piece,
         std::size_t max_write_piece, std::chrono::milliseconds progress_deadline,
         WorkerClock clock, AtomicCounters& counters, Gate& gate)
      : endpoint_(endpoint),
        cap_(cap),
        max_piece_(max_piece),
        max_write_piece_(max_write_piece),
        progress_deadline_(progress_deadline),
        clock_(clock),
        counters_(counters),
        gate_(gate),
        contact_queued_(endpoint.describe().provider == "shm") {
    unrung_reads_.reserve(cap_);
  }

  // Posts pieces of the queued transfers while fewer than the cap are live in flight, each
  // transfer getting one turn. A transfer that has failed with nothing of it in flight (or that
  // was never posted when `closed`, which fails it as kWorkerGone, unless its shm peer still
  // holds our unread connection request) is appended to `ended`, with its error set, for the
  // caller to finish.
  // With `stop_at_read`, the pass ends at the first read in the queue (shm copies a read inside
  // the post: the worker's own time, which must not come before the completions it has).
  void post(OpTable& table, bool closed, std::vector<Op*>& ended, bool stop_at_read = false);

  // After the reap that follows post(): wakes the shm peer of each read posted without a ring
  // that is still in flight (its copy needs the peer's progress after all). Before the ended
  // transfers are finished, while every op posted is still the same transfer.
  void ring_unfinished_reads();

  std::size_t cap() const noexcept { return cap_; }
  // The largest piece of a transfer in `direction`.
  std::size_t max_piece(Direction direction) const noexcept {
    return direction == Direction::kToPeer ? max_write_piece_ : max_piece_;
  }
  // Rings of an shm peer's doorbell made and left to after the reap (tests).
  std::uint64_t rings() const noexcept { return rings_; }
  std::uint64_t rings_deferred() const noexcept { return rings_deferred_; }

 private:
  // Whether `op`'s peer has refused every post for the progress deadline (called on -FI_EAGAIN).
  bool past_progress_deadline(Op& op, WorkerClock::time_point now);
  // 0, -FI_EAGAIN, or another negative libfabric error.
  long post_piece(Op& op, Piece& piece, std::size_t size);
  // Whether `op`'s shm peer process has exited; sets op's error if so.
  void check_owner(Op& op, std::uint64_t current_batch);

  const Endpoint& endpoint_;
  std::size_t cap_;
  std::size_t max_piece_;
  std::size_t max_write_piece_;
  std::chrono::milliseconds progress_deadline_;
  WorkerClock clock_;
  AtomicCounters& counters_;
  Gate& gate_;
  // Wakes `op`'s shm peer, if it has one that can be woken.
  void ring(const Op& op) noexcept;

  // shm: a refused first post leaves a request in the peer's queue that reads our region.
  bool contact_queued_;
  // Reads posted this pass whose peer was not woken (ring_unfinished_reads); at most one entry
  // per piece posted, so never more than the cap.
  std::vector<Op*> unrung_reads_;
  std::uint64_t rings_ = 0;
  std::uint64_t rings_deferred_ = 0;
};

}  // namespace dma::internal
