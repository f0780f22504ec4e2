// Caller memory the service may register: CacheableSpan (an extent a caller vouches for),
// invalidate() (the hook an allocator calls before it reclaims pages), MemoryRegion<S>
// (caller storage registered on a service, retired when its last copy goes), and Buffer (memory
// for values that cross the fabric, on huge pages where they pay).
//
// Registrations are kept in one process-wide cache, because pages are a process-wide resource:
// whoever reclaims them must retire every registration over them, on every domain, at once.
// invalidate() is thread-safe and may be called from any thread, including allocator hooks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
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

// Memory for the values a client moves over the fabric (DMA.GET landings, DMA.SET sources,
// exposed buffers): its own anonymous mapping, faulted in before allocate() returns, and from
// Buffer::kHugePagesFrom bytes aligned to 2 MiB, rounded up to whole 2 MiB pages and advised
// onto transparent huge pages (madvise MADV_HUGEPAGE; the system's
// /sys/kernel/mm/transparent_hugepage/enabled must say "madvise" or "always").
//
// Why: whoever copies a value between two processes pins the other process's pages one by
// one (on shm the server copies a DMA.SET's value out of the client with process_vm_readv,
// docs/PROVIDERS.md), and registration and RDMA NICs walk them the same way, so the page size
// of the client's memory sets the speed. A 1 MiB DMA.SET over shm from a Buffer ran 1.9x the
// speed of Redis's own SET at one client and 2.6x at four, against 1.4x and 1.8x from malloc's
// memory (docs/PERFORMANCE.md, "Speed, seventh pass"). malloc
// cannot give this to a 1 MiB value: a huge page needs a 2 MiB-aligned 2 MiB range, and a
// 1 MiB allocation never spans one.
//
// The price: a Buffer of 1 MiB maps 2 MiB (mapped() says how much), and a huge page written
// after fork() copies 2 MiB. Below kHugePagesFrom the mapping is whole 4 KiB pages.
//
// Destroying a Buffer invalidate()s its range before unmapping it, so a registration the
// process-wide cache holds over it (a service's pin() or operands) is retired first. An Exposed
// region over it (Target::expose) is the caller's to destroy before the Buffer, as with any
// memory. Move-only; like a std::vector, several threads may read it at once.
class DMA_EXPORT Buffer {
 public:
  static constexpr std::size_t kHugePageBytes = std::size_t{2} << 20;
  static constexpr std::size_t kHugePagesFrom = std::size_t{1} << 20;
  enum class HugePages : std::uint8_t {
    kAuto,    // from kHugePagesFrom bytes
    kAlways,  // any length (a 4 KiB value maps 2 MiB)
    kNever,   // 4 KiB pages whatever the length (MADV_NOHUGEPAGE, also under THP "always")
  };

  // `length` bytes, zeroed. kInvalidArgument for 0 or a length whose mapping would overflow;
  // kResourceExhausted (naming the length and errno) if the mapping or its faulting-in fails.
  // Where madvise refuses the advice (a kernel without THP) the buffer is still returned, on
  // 4 KiB pages, and huge_pages() says false.
  static Result<Buffer> allocate(std::size_t length, HugePages huge_pages = HugePages::kAuto);

  Buffer() noexcept = default;  // empty: data() nullptr, size() 0
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  std::byte* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  std::span<std::byte> bytes() const noexcept { return {data_, size_}; }
  // Bytes mapped for it: size() rounded up to 4 KiB or 2 MiB pages.
  std::size_t mapped() const noexcept { return mapped_; }
  // Whether it was advised onto huge pages (the kernel may still have backed it with 4 KiB
  // pages: THP "never", or no free huge page; /proc/self/smaps, AnonHugePages, tells).
  bool huge_pages() const noexcept { return huge_; }

 private:
  Buffer(std::byte* data, std::size_t size, std::size_t mapped, bool huge) noexcept
      : data_(data), size_(size), mapped_(mapped), huge_(huge) {}
  void release() noexcept;
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
  std::size_t mapped_ = 0;
  bool huge_ = false;
};

}  // namespace dma
