#include "worker/reaper.hpp"

#include <array>
#include <string>

#include <rdma/fi_eq.h>

namespace dma::internal {

std::size_t Reaper::reap(OpTable& table, std::vector<Op*>& ended,
                         std::vector<LandedPiece>& landed) {
  if (table.in_flight == 0) return 0;
  std::array<fi_cq_entry, 64> entries;
  std::size_t total = 0;
  const auto done = [&](Piece* piece) {
    ++table.reaped[static_cast<std::size_t>(piece->op->request.direction)];
    if (Op* over = table.piece_done(piece)) ended.push_back(over);
  };
  while (table.in_flight > 0) {
    gate_.enter();
    const ssize_t count =
        fi_cq_read(endpoint_.completion_queue(), entries.data(), entries.size());
    gate_.leave();
    if (count == -FI_EAGAIN) break;
    if (count == -FI_EAVAIL) {
      fi_cq_err_entry failure{};
      if (fi_cq_readerr(endpoint_.completion_queue(), &failure, 0) != 1) break;
      auto* piece = static_cast<Piece*>(failure.op_context);
      if (piece == nullptr || piece->op == nullptr) {
        // Nothing to attribute it to: shm reports the failed writes to a peer that died as
        // error entries with no op_context (seen here: err -FI_EIO, flags FI_COMPLETION), so
        // the operation it meant never completes; the completion deadline fails it.
        counters_.unattributed_errors.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      Op* op = piece->op;
      ++total;
      if (!op->error) {
        // fi_cq_strerror decodes prov_errno; several providers (tcp) put a bare errno there
        // that means nothing to a reader, so it is reported as a number.
        op->error = Error(ErrorCode::kFabric,
                          std::string(op->request.direction == Direction::kToPeer
                                          ? "write to peer failed: "
                                          : "read from peer failed: ") +
                              fi_strerror(failure.err) + " (provider error " +
                              std::to_string(failure.prov_errno) + ")");
      }
      done(piece);
      continue;
    }
    if (count < 0) {
      // The queue itself failed; nothing to attribute it to. Surface it on the next error entry.
      break;
    }
    for (ssize_t index = 0; index < count; ++index) {
      auto* piece = static_cast<Piece*>(entries[index].op_context);
      if (piece == nullptr || piece->op == nullptr) continue;  // not one of ours (see above)
      if (const Op* op = piece->op; op->stream != nullptr && !op->error) {
        landed.push_back(LandedPiece{op->stream, piece->offset, piece->size});
      }
      done(piece);
    }
    total += static_cast<std::size_t>(count);
    if (static_cast<std::size_t>(count) < entries.size()) break;
  }
  return total;
}

}  // namespace dma::internal
