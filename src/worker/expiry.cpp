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

namespace {

// Nothing of `op`'s direction has completed since it was posted, and later posts wait behind
// it: how many, or 0.
std::uint64_t stuck_behind(const OpTable& table, const Op& op) {
  const auto direction = static_cast<std::size_t>(op.request.direction);
  if (table.reaped[direction] != op.reaped_at_post) return 0;
  const std::uint64_t later = table.first_posts[direction];
  return later > op.post_serial ? later - op.post_serial : 0;
}

std::string stopped_completing(const Op& op, std::uint64_t behind, const std::string& which) {
  return std::string(op.request.direction == Direction::kToPeer ? "writes" : "reads") +
         " stopped completing: one " + which + " never completed and the " +
         std::to_string(behind) + " posted after it are stuck behind it";
}

}  // namespace

std::optional<std::string> Expiry::dead_peer_wedge(const OpTable& table, const Op& op,
                                                   WorkerClock::time_point now) const {
  if (!op.peer_entry || now - op.posted_at < kDeadPeerGrace) return std::nullopt;
  const PeerProcess* owner = op.peer_entry->owner();
  if (owner == nullptr) return std::nullopt;
  const std::uint64_t behind = stuck_behind(table, op);
  if (behind == 0 || !owner->exited(now, kDeadPeerGrace)) return std::nullopt;
  return stopped_completing(op, behind,
                            "posted to a peer whose process (pid " +
                                std::to_string(owner->pid()) + ") has since exited");
}

std::optional<std::string> Expiry::expire_overdue(OpTable& table, WorkerClock::time_point now) {
  std::optional<std::string> wedged;
  for (const auto& owned : table.pieces()) {
    Op* op = owned->op;
    if (op == nullptr || op->expired) continue;
    if (now - op->posted_at < deadline_) {
      if (!wedged) wedged = dead_peer_wedge(table, *op, now);
      continue;
    }
    if (!wedged) {
      if (const std::uint64_t behind = stuck_behind(table, *op); behind > 0) {
        wedged = stopped_completing(*op, behind,
                                    "posted " + std::to_string(deadline_.count()) + " ms ago");
      }
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
