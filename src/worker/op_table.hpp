// Private: the worker's transfers (Op) and posted pieces (Piece), pooled, and where they are.
//
// A completion queue entry hands back only the context pointer given at post (fi_cq(3)). Making
// that context the Piece itself (a fi_context2 as its first member) means a completion needs no
// lookup, and pooling Ops and Pieces means a warm worker allocates nothing per transfer. Neither
// may be freed while the provider can still report it: a Piece goes back to the pool only when
// it is reaped or the endpoint is closed under it. The table also keeps the queue of transfers
// waiting to post (linked through the Ops themselves, so queueing never allocates: a std::deque
// allocated a block every 64 transfers) and the in-flight counts every other part of the loop reads: pieces on the
// wire, and how many of those belong to expired transfers ("held": they leave the in-flight cap
// but not the provider).
//
// Ownership: owned by the Worker; Ops and Pieces live as long as the table. Thread-safety: the
// worker thread only.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include <rdma/fabric.h>

#include "dma/service.hpp"
#include "fabric/local_regions.hpp"
#include "fabric/peer_addresses.hpp"

namespace dma::internal {

struct Op;
struct ChecksumStream;  // delivery.hpp
struct Piece {
  fi_context2 context;  // first member: the CQ entry's op_context is this Piece
  Op* op;               // the transfer it belongs to while posted; nullptr while free
  std::size_t offset;   // where in the op's local operand it starts, and its bytes
  std::size_t size;
};

// A piece of a streamed transfer (Op::stream) that landed: its checksum can start.
struct LandedPiece {
  ChecksumStream* stream;
  std::size_t offset;
  std::size_t size;
};

struct Op {
  TransferRequest request;
  fi_addr_t peer = FI_ADDR_UNSPEC;
  // Keeps the address-vector entry `peer` names until the op finishes, so a client
  // re-advertising a new address cannot remove (and let the next insert reuse) the slot its
  // queued and posted transfers still target. Not on efa (see prepare_transfer()).
  std::shared_ptr<RegisteredAddress> peer_entry;
  std::byte* local = nullptr;
  std::size_t length = 0;
  LocalOperand operand;
  std::size_t region = 0;         // posting cursor: which remote region
  std::size_t region_offset = 0;  // and how far into it
  std::size_t local_offset = 0;   // bytes of the local operand posted so far
  std::size_t in_flight = 0;      // pieces posted and not yet reaped
  // A checksummed transfer checksummed piece by piece as its pieces land (delivery.hpp,
  // ChecksumStream), posted in pieces of at most stream_piece bytes; nullptr and 0 otherwise.
  ChecksumStream* stream = nullptr;
  std::size_t stream_piece = 0;
  bool posting_done = false;
  bool queued = false;       // in the pending queue
  Op* next_pending = nullptr;  // the pending queue's link while queued
  bool owner_asked = false;  // whether the peer's process was asked about before its posts
  std::uint64_t batch = 0;   // which channel batch it was taken in (OpTable::batches)
  bool eagain = false;       // efa only (no peer_entry): the op's own progress clock runs
  bool expired = false;      // failed at the completion deadline; held until its pieces are reaped
  std::chrono::steady_clock::time_point first_eagain;
  std::chrono::steady_clock::time_point posted_at;  // its first piece's post
  // Where it stood when its first piece was posted: the how-manyth first post of its direction,
  // and how many pieces of that direction had been reaped (the wedge check, expiry.hpp).
  std::uint64_t post_serial = 0;
  std::uint64_t reaped_at_post = 0;
  std::optional<Error> error;
};

// The transfers waiting to post, in turn order: an intrusive FIFO through Op::next_pending
// that can also put an op back at the front. O(1) for all but at(), which tests use.
class PendingQueue {
 public:
  bool empty() const noexcept { return head_ == nullptr; }
  std::size_t size() const noexcept { return size_; }
  Op* front() const noexcept { return head_; }
  void push_back(Op* op) noexcept {
    counted(*op, 1);
    op->next_pending = nullptr;
    if (tail_ == nullptr) {
      head_ = op;
    } else {
      tail_->next_pending = op;
    }
    tail_ = op;
    ++size_;
  }
  void push_front(Op* op) noexcept {
    counted(*op, 1);
    op->next_pending = head_;
    head_ = op;
    if (tail_ == nullptr) tail_ = op;
    ++size_;
  }
  void pop_front() noexcept {
    Op* op = head_;
    counted(*op, -1);
    head_ = op->next_pending;
    if (head_ == nullptr) tail_ = nullptr;
    op->next_pending = nullptr;
    --size_;
  }
  // The op `position` places from the front; nullptr past the end.
  Op* at(std::size_t position) const noexcept {
    Op* op = head_;
    while (op != nullptr && position-- > 0) op = op->next_pending;
    return op;
  }
  // Whether every op queued is for `op`'s peer (its address-vector entry, which transfers to
  // the same address share); false for an op without one (efa).
  bool only_for_peer_of(const Op& op) const noexcept {
    return op.peer_entry && op.peer_entry->progress.queued == size_;
  }

 private:
  static void counted(const Op& op, int delta) noexcept {
    if (op.peer_entry) op.peer_entry->progress.queued += static_cast<std::size_t>(delta);
  }

  Op* head_ = nullptr;
  Op* tail_ = nullptr;
  std::size_t size_ = 0;
};

class OpTable {
 public:
  OpTable() = default;
  OpTable(const OpTable&) = delete;
  OpTable& operator=(const OpTable&) = delete;

  // A reset Op (its request is the caller's to overwrite).
  Op* acquire_op();
  void release_op(Op* op) { free_ops_.push_back(op); }
  // A zeroed Piece bound to `op`.
  Piece* acquire_piece(Op* op);
  void release_piece(Piece* piece) {
    piece->op = nullptr;
    free_pieces_.push_back(piece);
  }

  // One piece is back from the provider (reaped, or its endpoint closed): frees it and updates
  // the counts. Returns its op if that op is now over (nothing in flight, nothing to post), for
  // the caller to finish.
  Op* piece_done(Piece* piece);

  // Every Piece ever made, free or posted (a posted one has op != nullptr).
  const std::vector<std::unique_ptr<Piece>>& pieces() const noexcept { return pieces_; }

  PendingQueue pending;      // transfers waiting to post, in turn order
  std::size_t in_flight = 0; // pieces posted and not reaped
  std::size_t held = 0;      // of those, pieces of expired transfers
  std::uint64_t batches = 0; // batches of messages taken from the channel so far
  // Per direction (Direction's value): transfers whose first piece was posted, and pieces
  // reaped, so far. A transfer that expires with nothing of its direction reaped since its
  // post, and later ones of that direction posted behind it, has wedged the endpoint.
  std::uint64_t first_posts[2] = {0, 0};
  std::uint64_t reaped[2] = {0, 0};
  std::size_t live_in_flight() const noexcept { return in_flight - held; }

 private:
  std::vector<std::unique_ptr<Op>> ops_;  // every Op ever made; reused through free_ops_
  std::vector<Op*> free_ops_;
  std::vector<std::unique_ptr<Piece>> pieces_;
  std::vector<Piece*> free_pieces_;
};

}  // namespace dma::internal
