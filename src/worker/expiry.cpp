#include "worker/expiry.hpp"

#include <algorithm>
#include <string>

namespace dma::internal {

std::optional<std::string> Expiry::check(OpTable& table) {
  if (table.live_in_flight() == 0 || deadline_.count() <= 0) return std::nullopt;
  const auto now = clock_.now();
  if (now < next_check_) return std::nullopt;
  std::optional<std::string> wedged = expire_overdue(table, now);
  // A tenth of the deadline (at most 100 ms) bounds how late a transfer expires.
  next_check_ = now + std::min<std::chrono::steady_clock::duration>(
                          deadline_ / 10, std::chrono::milliseconds(100));
  return wedged;
}

std::optional<std::string> Expiry::expire_overdue(OpTable& table, WorkerClock::time_point now) {
  std::optional<std::string> wedged;
  for (const auto& owned : table.pieces()) {
    Op* op = owned->op;
    if (op == nullptr || op->expired || now - op->posted_at < deadline_) continue;
    const auto direction = static_cast<std::size_t>(op->request.direction);
    if (!wedged && table.reaped[direction] == op->reaped_at_post &&
        table.first_posts[direction] > op->post_serial) {
      wedged = std::string(op->request.direction == Direction::kToPeer ? "writes" : "reads") +
               " stopped completing: one posted " + std::to_string(deadline_.count()) +
               " ms ago never completed and the " +
               std::to_string(table.first_posts[direction] - op->post_serial) +
               " posted after it are stuck behind it";
    }
    counters_.expired.fetch_add(1, std::memory_order_relaxed);
    // Replaces an error a piece already reported: the caller learns the transfer is over now,
    // and that its operand stays held.
    expire_op(table, *op,
              Error(ErrorCode::kTimedOut,
                    "no completion within the " + std::to_string(deadline_.count()) +
                        " ms completion deadline (peer dead or provider stuck); the local "
                        "buffer stays held until the provider lets go of it"),
              counters_);
  }
  return wedged;
}

void expire_op(OpTable& table, Op& op, Error error, AtomicCounters& /*counters*/) {
  if (op.expired) return;
  op.expired = true;
  table.held += op.in_flight;
  if (op.peer_entry) op.peer_entry->progress.live_pieces -= op.in_flight;
  op.error = std::move(error);
  // Still queued (partly posted, or not at all): the poster drops it, as it has an error now.
  op.request.context->on_expired(*op.error);
}

}  // namespace dma::internal
