// Private: checking a transfer at intake and resolving what it needs to post.
//
// Everything that can be known wrong about a transfer is found before anything is posted: a
// partial write would leave the client holding half a value. So at intake the remote regions
// are checked (count, zero length, overflow, total capacity), the local operand resolved on the
// worker (Operands::source() for kToPeer, allocate(length) for kFromPeer; a missing or short
// buffer fails the op at once), the peer's address-vector entry found or inserted, and the
// operand's registration resolved (LocalRegions).
//
// Ownership: a free function over the worker's parts. Thread-safety: the worker thread only.
#pragma once

#include "dma/result.hpp"
#include "fabric/local_regions.hpp"
#include "fabric/peer_addresses.hpp"
#include "worker/op_table.hpp"

namespace dma::internal {

// Fills `op`'s local operand, length, peer and registration from its request, or says why the
// transfer cannot be posted. A zero-length transfer succeeds with nothing resolved. With
// `efa_addresses` the op keeps only the peer's handle, not its entry (see the body).
Status prepare_transfer(Op& op, PeerAddresses& peers, LocalRegions& regions, bool efa_addresses);

}  // namespace dma::internal
