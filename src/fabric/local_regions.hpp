// Private: resolves a transfer's local operand to a descriptor and a lease, per endpoint.
//
// Resolution order: a cached registration covering the operand (a lease on it); else the
// caller's CacheableSpan, if it contains the operand, registered whole and cached so its
// neighbours hit; else the operand alone, registered for this one transfer. A span that does
// not contain the operand is ignored: registering it would pin the wrong memory and leave the
// operand unregistered.
//
// Ownership: belongs to the endpoint's owning thread; not thread-safe (the registry it uses is).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>

#include "dma/memory.hpp"
#include "fabric/endpoint.hpp"

namespace dma::internal {

struct LocalOperand {
  void* descriptor = nullptr;  // fi_mr_desc, or nullptr when the provider does not need one
  Lease lease;                 // held from post to completion; empty when unregistered
};

class LocalRegions {
 public:
  // `register_operands`: resolve operands to registrations. Required under FI_MR_LOCAL; other
  // providers accept a null descriptor, and skipping registration is then the fast path.
  LocalRegions(Endpoint& endpoint, bool register_operands)
      : endpoint_(endpoint), register_operands_(register_operands) {}

  // `span_of` is asked only on a cache miss.
  Result<LocalOperand> operand(const void* pointer, std::size_t length,
                               const std::function<std::optional<CacheableSpan>()>& span_of);
  // Registers [base, base+length) and caches it (FabricService::pin / register_memory).
  Status pin(std::uintptr_t base, std::size_t length);

 private:
  Endpoint& endpoint_;
  bool register_operands_;
};

}  // namespace dma::internal
