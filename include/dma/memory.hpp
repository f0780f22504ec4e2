// Caller memory the service may register: CacheableSpan (an extent a caller vouches for),
// invalidate() (the hook an allocator calls before it reclaims pages), and MemoryRegion<S>
// (caller storage registered on a service, retired when its last copy goes).
//
// Registrations are kept in one process-wide cache, because pages are a process-wide resource:
// whoever reclaims them must retire every registration over them, on every domain, at once.
// invalidate() is thread-safe and may be called from any thread, including allocator hooks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>

#include "dma/export.hpp"
#include "dma/result.hpp"

namespace dma {

// Retires every cached registration, on any domain, overlapping [start, end). Nothing new binds
// to a retired registration; the region itself is closed when the last in-flight transfer using
// it completes, never under the cache's lock. Call it before the pages are unmapped, decommitted
// or madvise()d away.
DMA_EXPORT void invalidate(std::uintptr_t start, std::uintptr_t end) noexcept;

// How many memory registrations (fi_mr_reg) this process has made so far, on every domain, for
// operands and exposed buffers alike: what a server reports as registrations per operation.
DMA_EXPORT std::uint64_t registrations_made() noexcept;

// An extent the caller knows to be stable and registrable as a whole (an allocator's extent, a
// slab) that contains an operand. Registering the span instead of the operand lets neighbouring
// operands share one registration. The caller must invalidate() it before reclaiming it.
class DMA_EXPORT CacheableSpan {
 public:
  static Result<CacheableSpan> create(std::uintptr_t base, std::size_t length);
  std::uintptr_t base() const noexcept { return base_; }
  std::uintptr_t end() const noexcept { return base_ + length_; }
  std::size_t length() const noexcept { return length_; }
  bool contains(std::uintptr_t start, std::size_t length) const noexcept {
    return start >= base_ && length <= length_ && start - base_ <= length_ - length;
  }

 private:
  CacheableSpan(std::uintptr_t base, std::size_t length) : base_(base), length_(length) {}
  std::uintptr_t base_;
  std::size_t length_;
};

// Caller storage `S` (anything with data() and size() over contiguous bytes whose address does
// not move when S is moved: std::vector, std::string of large size, std::unique_ptr<T[]> wrapped
// in a span-like type) registered on a service. Copies share the storage; when the last copy is
// destroyed the registration is retired (invalidate) *before* the storage is freed, so a
// transfer still in flight keeps a valid registration over memory that is still there.
// Thread-safety: copies may be used and destroyed on different threads.
template <typename S>
class MemoryRegion {
 public:
  // Used by FabricService::register_memory once the span is registered. Not for callers.
  MemoryRegion(std::unique_ptr<S> storage, std::uintptr_t base, std::uintptr_t end)
      : holder_(std::make_shared<Holder>(std::move(storage), base, end)) {}

  S& storage() noexcept { return *holder_->storage; }
  const S& storage() const noexcept { return *holder_->storage; }
  std::uintptr_t base() const noexcept { return holder_->base; }
  std::size_t length() const noexcept { return holder_->end - holder_->base; }

 private:
  struct Holder {
    Holder(std::unique_ptr<S> s, std::uintptr_t b, std::uintptr_t e)
        : storage(std::move(s)), base(b), end(e) {}
    Holder(const Holder&) = delete;
    Holder& operator=(const Holder&) = delete;
    // Runs before `storage` is destroyed (members die after the destructor body).
    ~Holder() { invalidate(base, end); }
    std::unique_ptr<S> storage;
    std::uintptr_t base;
    std::uintptr_t end;
  };
  std::shared_ptr<Holder> holder_;
};

}  // namespace dma
