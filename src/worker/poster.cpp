#include "worker/poster.hpp"

#include <algorithm>
#include <string>

#include <rdma/fi_rma.h>

#include "worker/post_hook.hpp"

namespace dma::internal {

void Poster::post(OpTable& table, bool closed, std::vector<Op*>& ended, bool stop_at_read) {
  PendingQueue& pending = table.pending;
  std::size_t turns = pending.size();
  while (turns-- > 0 && !pending.empty() && table.live_in_flight() < cap_) {
    Op* op = pending.front();
    if (stop_at_read && op->request.direction == Direction::kFromPeer) break;
    pending.pop_front();
    op->queued = false;
    const bool awaits_contact =
        contact_queued_ && op->peer_entry && op->peer_entry->progress.awaits_contact();
    if (closed && op->local_offset == 0 && op->in_flight == 0 && !op->error && !awaits_contact) {
      op->error = Error(ErrorCode::kWorkerGone, "fabric worker is gone (service shutting down)");
      ended.push_back(op);
      continue;
    }
    if (!op->error && op->peer_entry) check_owner(*op, table.batches);
    bool stalled = false;
    bool turn_over = false;  // a streamed transfer posts one piece per turn
    while (!op->error && !op->posting_done && table.live_in_flight() < cap_) {
      const RemoteRegion& region = op->request.regions[op->region];
      std::size_t size = std::min({static_cast<std::size_t>(region.length - op->region_offset),
                                   op->length - op->local_offset,
                                   max_piece(op->request.direction)});
      if (op->stream_piece != 0) size = std::min(size, op->stream_piece);
      Piece* piece = table.acquire_piece(op);
      piece->offset = op->local_offset;
      piece->size = size;
      // The call may never return (shm, a dead target's region lock): the watchdog may take the
      // table meanwhile (Gate), expiring this op too; a piece it posts after all is then held.
      gate_.enter();
      run_post_hook();  // tests: a worker stuck inside the provider (post_hook.hpp)
      const long code = post_piece(*op, *piece, size);
      gate_.leave();
      if (code == 0) {
        if (op->local_offset == 0) {
          op->posted_at = clock_.now();
          const auto direction = static_cast<std::size_t>(op->request.direction);
          op->post_serial = ++table.first_posts[direction];
          op->reaped_at_post = table.reaped[direction];
        }
        ++table.in_flight;
        ++op->in_flight;
        op->eagain = false;
        if (op->peer_entry) op->peer_entry->progress.contact_answered = true;
        if (op->expired) {
          ++table.held;
        } else if (op->peer_entry) {
          ++op->peer_entry->progress.live_pieces;
          op->peer_entry->progress.refusing_since.reset();
          // shm: a write's copy runs in the target's progress; wake it if it sleeps. A read's
          // wake waits for the reap (top of poster.hpp).
          if (op->request.direction == Direction::kFromPeer && op->peer_entry->owner() &&
              ++op->peer_entry->progress.unrung_reads < kReadsPerRing) {
            if (unrung_reads_.empty() || unrung_reads_.back() != op) unrung_reads_.push_back(op);
          } else {
            ring(*op);
          }
        }
        op->local_offset += size;
        op->region_offset += size;
        if (op->region_offset == region.length) {
          ++op->region;
          op->region_offset = 0;
        }
        op->posting_done = op->local_offset == op->length;
        if (op->stream != nullptr && !op->posting_done) {
          // The reap after this pass starts the piece's checksum while the next is copied
          // (on shm the copy happens inside this very call).
          turn_over = true;
          break;
        }
        continue;
      }
      table.release_piece(piece);
      if (op->error) break;  // expired by the watchdog during the call: already answered
      if (code == -FI_EAGAIN) {
        counters_.eagain.fetch_add(1, std::memory_order_relaxed);
        // shm refuses posts until the target's progress has taken our first contact (its
        // connection request) or drained its queue: wake it for that too.
        if (op->peer_entry) {
          op->peer_entry->progress.contact_requested = true;
          ring(*op);
        }
        if (past_progress_deadline(*op, clock_.now())) {
          op->error = Error(ErrorCode::kUnreachable,
                            "peer unreachable: the provider answered -FI_EAGAIN for " +
                                std::to_string(progress_deadline_.count()) +
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
      if (op->in_flight == 0) ended.push_back(op);
      // else: the last reaped piece ends it
      continue;
    }
    if (op->posting_done) continue;  // reaping ends it
    op->queued = true;
    if (turn_over) {
      pending.push_back(op);  // its next piece on its next turn; the others have theirs now
      continue;
    }
    if (stalled) {
      // EAGAIN: to the back, so other peers get their turn, and no more posting this pass. The
      // provider's queue is full (shm) or this peer is not ready (tcp connecting); either way
      // retrying the rest now only burns calls that fail (measured: thousands per completion
      // on shm). Reaping comes next and frees room. With only this peer's transfers queued it
      // keeps its place: sent to the back, it came round to the front again at a pass that
      // found the peer full (shm takes small writes one at a time), and again, while those
      // behind it went (64 B writes at depth 64: p99 1.0-1.3 ms against raw's 0.2).
      if (pending.only_for_peer_of(*op)) {
        pending.push_front(op);
      } else {
        pending.push_back(op);
      }
    } else {
      pending.push_front(op);  // the cap is full: keep its place
    }
    break;
  }
}

void Poster::ring(const Op& op) noexcept {
  if (!op.peer_entry) return;
  const PeerProcess* owner = op.peer_entry->owner();
  if (owner == nullptr) return;
  op.peer_entry->progress.unrung_reads = 0;
  owner->ring();
  ++rings_;
}

void Poster::ring_unfinished_reads() {
  for (Op* op : unrung_reads_) {
    if (op->in_flight > 0 && !op->expired) {
      ring(*op);
      ++rings_deferred_;
    }
  }
  unrung_reads_.clear();
}

void Poster::check_owner(Op& op, std::uint64_t current_batch) {
  // shm: a target that died holding its region lock would leave the post spinning forever
  // (peer_process.hpp); a dead process gets nothing more posted to it. A transfer's first turn
  // is answered by a question asked after its batch left the channel (once per peer and
  // batch), so nothing submitted after a death could be seen is posted; its retries after
  // -FI_EAGAIN reuse an answer up to kOwnerRecheck old.
  const PeerProcess* owner = op.peer_entry->owner();
  const bool first_turn = !op.owner_asked;
  op.owner_asked = true;
  if (owner != nullptr &&
      (first_turn ? owner->exited_for_batch(op.batch, current_batch)
                  : owner->exited(clock_.now(), kOwnerRecheck))) {
    op.error = Error(ErrorCode::kUnreachable, "peer unreachable: its process (pid " +
                                                  std::to_string(owner->pid()) + ") has exited");
  }
}

bool Poster::past_progress_deadline(Op& op, WorkerClock::time_point now) {
  if (!op.peer_entry) {
    // efa: ops keep no entry (prepare_transfer()), so the clock is the op's own.
    if (!op.eagain) {
      op.eagain = true;
      op.first_eagain = now;
      return false;
    }
    return now - op.first_eagain >= progress_deadline_;
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
  const bool restart = !peer.refusing_since || now - peer.last_refusal >= progress_deadline_;
  peer.last_refusal = now;
  if (restart) {
    peer.refusing_since = now;
    return false;
  }
  return now - *peer.refusing_since >= progress_deadline_;
}

long Poster::post_piece(Op& op, Piece& piece, std::size_t size) {
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
    return fi_writemsg(endpoint_.endpoint(), &message, FI_DELIVERY_COMPLETE | FI_COMPLETION);
  }
  return fi_read(endpoint_.endpoint(), local, size, descriptor, op.peer, remote, region.key,
                 &piece.context);
}

}  // namespace dma::internal
