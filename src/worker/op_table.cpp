#include "worker/op_table.hpp"

#include <cstring>

namespace dma::internal {

Op* OpTable::acquire_op() {
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
  op->stream = nullptr;
  op->stream_piece = 0;
  op->posting_done = op->queued = op->eagain = op->expired = op->owner_asked = false;
  op->next_pending = nullptr;
  op->error.reset();
  return op;
}

Piece* OpTable::acquire_piece(Op* op) {
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
  piece->offset = piece->size = 0;
  return piece;
}

Op* OpTable::piece_done(Piece* piece) {
  Op* op = piece->op;
  release_piece(piece);
  --in_flight;
  --op->in_flight;
  if (op->expired) {
    --held;
  } else if (op->peer_entry) {
    --op->peer_entry->progress.live_pieces;
  }
  if (op->in_flight != 0 || op->queued) return nullptr;
  return op->error || op->posting_done ? op : nullptr;
}

}  // namespace dma::internal
