#include "worker/prepare.hpp"

#include <string>

namespace dma::internal {

namespace {
// The regions' total length, or why they cannot be used.
Result<std::uint64_t> capacity_of(const RemoteRegions& regions) {
  if (regions.empty()) return fail(ErrorCode::kInvalidArgument, "transfer names no remote region");
  if (regions.size() > kMaxRemoteRegions) {
    return fail(ErrorCode::kInvalidArgument,
                "transfer names " + std::to_string(regions.size()) + " remote regions; at most " +
                    std::to_string(kMaxRemoteRegions) + " are allowed");
  }
  std::uint64_t capacity = 0;
  for (std::size_t index = 0; index < regions.size(); ++index) {
    const RemoteRegion& region = regions[index];
    if (region.length == 0) {
      return fail(ErrorCode::kInvalidArgument,
                  "remote region " + std::to_string(index) + " has zero length");
    }
    if (region.address + region.length < region.address) {
      return fail(ErrorCode::kInvalidArgument,
                  "remote region " + std::to_string(index) + " overflows the address space");
    }
    if (capacity + region.length < capacity) {
      return fail(ErrorCode::kInvalidArgument, "remote regions' total length overflows");
    }
    capacity += region.length;
  }
  return capacity;
}

// Points `op` at its local operand.
Status resolve_local(Op& op) {
  TransferRequest& request = op.request;
  if (request.direction == Direction::kToPeer) {
    std::span<const std::byte> source = request.context->source();
    if (source.data() == nullptr) {
      return fail(ErrorCode::kInvalidArgument, "the transfer's context has no source");
    }
    op.local = const_cast<std::byte*>(source.data());  // only read from: fi_writemsg's iov
    op.length = source.size();
    return {};
  }
  std::span<std::byte> landing = request.context->allocate(request.length);
  if (request.length > 0 && (landing.data() == nullptr || landing.size() < request.length)) {
    return fail(ErrorCode::kInvalidArgument,
                "landing buffer is " + std::to_string(landing.size()) +
                    " bytes, shorter than the transfer's " + std::to_string(request.length));
  }
  op.local = landing.data();
  op.length = request.length;
  return {};
}

Result<std::shared_ptr<RegisteredAddress>> peer_of(const TransferRequest& request,
                                                   PeerAddresses& peers) {
  if (!request.peer_address.empty()) {
    return peers.handle(request.client_id, request.peer_address.bytes());
  }
  std::shared_ptr<RegisteredAddress> peer = peers.find(request.client_id);
  if (!peer) {
    return fail(ErrorCode::kNotFound, "client " + std::to_string(request.client_id) +
                                          " has no peer address (call add_peer first)");
  }
  return peer;
}
}  // namespace

Status prepare_transfer(Op& op, PeerAddresses& peers, LocalRegions& regions, bool efa_addresses) {
  TransferRequest& request = op.request;
  if (!request.context) return fail(ErrorCode::kInvalidArgument, "transfer has no context");
  DMA_TRY_ASSIGN(const std::uint64_t capacity, capacity_of(request.regions));
  DMA_TRY(resolve_local(op));
  if (capacity < op.length) {
    return fail(ErrorCode::kInvalidArgument,
                "remote regions hold " + std::to_string(capacity) + " bytes, fewer than the " +
                    std::to_string(op.length) + " to transfer");
  }
  if (op.length == 0) return {};

  DMA_TRY_ASSIGN(std::shared_ptr<RegisteredAddress> peer, peer_of(request, peers));
  op.peer = peer->handle();
  // The op holds the entry until it finishes: measured on tcp, net and shm, a client
  // re-advertising mid-stream otherwise had its old entry removed under its queued transfers,
  // whose slot the new address then took: old bytes landed in the new buffer, and shm crashed.
  // On efa a recycled slot must be removable at once (peer_addresses.hpp), and the transfers of
  // the dead incarnation fail anyway, so there the op keeps only the handle.
  if (!efa_addresses) op.peer_entry = std::move(peer);

  Operands* context = request.context.get();
  DMA_TRY_ASSIGN(op.operand, regions.operand(op.local, op.length,
                                             [context] { return context->cacheable_span(); }));
  return {};
}

}  // namespace dma::internal
