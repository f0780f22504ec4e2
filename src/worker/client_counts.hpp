// Private: per-client outstanding transfers, and removing a client's peer only after them.
//
// remove_peer() arrives on the same channel as the client's transfers, after the ones it
// submitted before it. Releasing the client's address-vector entry at once would fail those
// transfers (or post them to a slot the next insert reuses). So each client's transfers are
// counted from intake (not from post: a queued transfer needs the entry as much as a posted
// one), and a removal asked while the count is non-zero is deferred until it reaches zero.
//
// A count stays in the map at zero until its client's removal: erasing it when it reaches zero
// would allocate a node per transfer for a client with one request at a time.
//
// Ownership: owned by the Worker. Thread-safety: the worker thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <unordered_set>

namespace dma::internal {

class ClientCounts {
 public:
  // A transfer of `client_id` was taken in.
  void opened(std::uint64_t client_id) { ++outstanding_[client_id]; }
  // A transfer of `client_id` finished. True if a deferred removal is now due: the caller
  // releases the client's peer.
  bool closed(std::uint64_t client_id);
  // remove_peer for `client_id`. True if it is due now (nothing outstanding); otherwise it is
  // deferred until closed() says so.
  bool remove(std::uint64_t client_id);
  // add_peer for `client_id`: cancels a removal still deferred (the client is back).
  void added(std::uint64_t client_id) { removal_pending_.erase(client_id); }

  std::size_t outstanding(std::uint64_t client_id) const;
  bool removal_pending(std::uint64_t client_id) const {
    return removal_pending_.count(client_id) != 0;
  }

 private:
  std::unordered_map<std::uint64_t, std::size_t> outstanding_;
  std::unordered_set<std::uint64_t> removal_pending_;
};

}  // namespace dma::internal
