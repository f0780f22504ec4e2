#include "fabric/local_regions.hpp"

namespace dma::internal {

namespace {
constexpr std::uint64_t kLocalAccess = FI_READ | FI_WRITE;
}

Result<LocalOperand> LocalRegions::operand(
    const void* pointer, std::size_t length,
    const std::function<std::optional<CacheableSpan>()>& span_of) {
  if (!register_operands_ || length == 0) return LocalOperand{};
  const auto start = reinterpret_cast<std::uintptr_t>(pointer);
  const std::uintptr_t domain = endpoint_.domain_key();
  if (Lease lease = registry::covering(start, start + length, domain)) {
    void* descriptor = lease->descriptor();
    return LocalOperand{descriptor, std::move(lease)};
  }
  if (span_of) {
    if (std::optional<CacheableSpan> span = span_of(); span && span->contains(start, length)) {
      DMA_TRY_ASSIGN(Lease lease,
                     endpoint_.register_memory(span->base(), span->length(), kLocalAccess));
      registry::track(span->base(), span->end(), domain, lease);
      void* descriptor = lease->descriptor();
      return LocalOperand{descriptor, std::move(lease)};
    }
  }
  // Registered for this transfer alone; closed when its lease drops at completion.
  DMA_TRY_ASSIGN(Lease lease, endpoint_.register_memory(start, length, kLocalAccess));
  void* descriptor = lease->descriptor();
  return LocalOperand{descriptor, std::move(lease)};
}

Status LocalRegions::pin(std::uintptr_t base, std::size_t length) {
  DMA_TRY_ASSIGN(Lease lease, endpoint_.register_memory(base, length, kLocalAccess));
  registry::track(base, base + length, endpoint_.domain_key(), lease);
  return {};
}

}  // namespace dma::internal
