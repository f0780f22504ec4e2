// Private: reading the completion queue.
//
// Completions are read in batches of 64 (fi_cq_read(3)); each entry's op_context is the Piece
// posted (op_table.hpp), so no lookup is needed. An error entry (-FI_EAVAIL, then
// fi_cq_readerr) fails exactly the transfer its piece belongs to. shm also reports errors with
// no op_context at all (writes to a peer that died, err -FI_EIO): they cannot be attributed, are
// only counted, and the completion deadline fails the operation they meant.
//
// Ownership: owned by the Worker; borrows the endpoint and counters. Thread-safety: the worker
// thread only.
#pragma once

#include <cstddef>
#include <vector>

#include "fabric/endpoint.hpp"
#include "worker/op_table.hpp"
#include "worker/service_shared.hpp"

namespace dma::internal {

class Reaper {
 public:
  Reaper(const Endpoint& endpoint, AtomicCounters& counters, Gate& gate)
      : endpoint_(endpoint), counters_(counters), gate_(gate) {}

  // Reads the queue until it is empty or nothing is in flight. Transfers whose last piece came
  // back are appended to `ended` for the caller to finish, and pieces of streamed transfers
  // (Op::stream) that landed intact to `landed`. Returns the entries read.
  std::size_t reap(OpTable& table, std::vector<Op*>& ended, std::vector<LandedPiece>& landed);

 private:
  const Endpoint& endpoint_;
  AtomicCounters& counters_;
  Gate& gate_;  // lent out around fi_cq_read, where shm makes its progress
};

}  // namespace dma::internal
