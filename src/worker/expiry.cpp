#include "worker/expiry.hpp"

#include <algorithm>
#include <string>

namespace dma::internal {

void Expiry::check(OpTable& table) {
  if (table.live_in_flight() == 0 || deadline_.count() <= 0) return;
  const auto now = clock_.now();
  if (now < next_check_) return;
  expire_overdue(table, now);
  // A tenth of the deadline (at most 100 ms) bounds how late a transfer expires.
  next_check_ = now + std::min<std::chrono::steady_clock::duration>(
                          deadline_ / 10, std::chrono::milliseconds(100));
}

void Expiry::expire_overdue(OpTable& table, WorkerClock::time_point now) {
  for (const auto& owned : table.pieces()) {
    Op* op = owned->op;
    if (op == nullptr || op->expired || now - op->posted_at < deadline_) continue;
    op->expired = true;
    table.held += op->in_flight;
    if (op->peer_entry) op->peer_entry->progress.live_pieces -= op->in_flight;
    counters_.expired.fetch_add(1, std::memory_order_relaxed);
    // Replaces an error a piece already reported: the caller learns the transfer is over now,
    // and that its operand stays held.
    op->error = Error(ErrorCode::kTimedOut,
                      "no completion within the " + std::to_string(deadline_.count()) +
                          " ms completion deadline (peer dead or provider stuck); the local "
                          "buffer stays held until the provider lets go of it");
    // Still queued (partly posted): the poster drops it, as it has an error now.
    op->request.context->on_expired(*op->error);
  }
}

}  // namespace dma::internal
