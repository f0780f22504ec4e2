// The value store's memory: one address range reserved at load and registered once on every
// fabric service, from which a private jemalloc arena carves every value. DMA.GET sends straight
// from a value's bytes and DMA.SET reads straight into a fresh block, so a transfer neither
// copies nor registers (fi_mr_reg costs 300-500 us on efa; issue 11).
//
// Why one registered reservation under jemalloc, not extents registered as jemalloc creates
// them: jemalloc splits and merges extents freely, and a block spanning two registrations is
// covered by neither (the worker would register it per transfer); an alloc hook that registers
// would also have to block on every service's worker while jemalloc holds its grow lock. With
// one reservation every block lies inside one registration whatever jemalloc does, the hooks
// never block, and jemalloc (the allocator redis-server itself links, libjemalloc.so.2) keeps
// fragmentation in check. Its extents are never handed back (dalloc, decommit and purges are
// refused, so a freed extent is retained, coalesced with its free neighbours, still mapped and
// registered), so a steady workload takes no page fault. The cost: on providers that pin (verbs, efa) the whole
// reservation is pinned at load, so `arena-bytes` is a budget of locked memory there.
//
// Blocks: a value's bytes follow a 64-byte header in the same allocation (one mallocx per
// value, nothing on the C++ heap). The header holds an atomic reference count, so a transfer
// in flight keeps the block it sends from even after DEL, overwrite or expiry drops the key's
// reference; the last reference frees it, on whatever thread drops it.
//
// Ownership: the Arena owns the reservation and the jemalloc arena; every Block must be gone
// before it is destroyed. Thread-safety: allocate() and Block copies and destruction may run on
// any thread (one mutex serialises the arena's calls into jemalloc, which also gives exact
// counters); the bytes of a block are the caller's to synchronise.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <utility>

#include "dma/memory.hpp"
#include "dma/result.hpp"

namespace dma::store {

class Arena;

// What INFO dma reports about the arena.
struct ArenaStats {
  std::size_t registered = 0;  // bytes reserved and registered on every service
  std::size_t in_use = 0;      // bytes of live blocks, headers included
  std::size_t free = 0;        // registered - in_use
  std::size_t mapped = 0;      // bytes handed to jemalloc so far (its high-water mark)
  std::size_t blocks = 0;      // live blocks
  std::uint64_t refused = 0;   // allocations refused because the arena was full
};

namespace detail {
struct alignas(64) BlockHeader {
  std::atomic<std::uint32_t> references{1};
  std::uint32_t crc = 0;
  std::uint64_t length = 0;
  std::size_t footprint = 0;  // bytes this allocation counts in ArenaStats::in_use
  Arena* arena = nullptr;
};
}  // namespace detail

// A look at a stored block without taking a reference (RDB save runs in a forked child, where
// touching the count would only copy pages).
struct BlockView {
  std::span<const std::byte> bytes;
  std::uint32_t crc = 0;
  std::size_t footprint = 0;
};

// A counted reference on one block. Copies share the block; the last one frees it.
class Block {
 public:
  Block() = default;
  Block(const Block& other) noexcept : header_(other.header_) { retain(); }
  Block(Block&& other) noexcept : header_(std::exchange(other.header_, nullptr)) {}
  Block& operator=(Block other) noexcept {
    std::swap(header_, other.header_);
    return *this;
  }
  ~Block() { release(); }

  explicit operator bool() const noexcept { return header_ != nullptr; }
  std::size_t length() const noexcept { return header_->length; }
  std::uint32_t crc() const noexcept { return header_->crc; }
  // The CRC32C of the bytes, recorded once they are final (DMA.SET after its check).
  void set_crc(std::uint32_t crc) noexcept { header_->crc = crc; }
  // Never null, even for an empty value (the service takes a null source as "no source").
  std::byte* data() const noexcept { return reinterpret_cast<std::byte*>(header_ + 1); }
  std::span<const std::byte> bytes() const noexcept { return {data(), length()}; }
  std::span<std::byte> writable() const noexcept { return {data(), length()}; }
  // The arena the block lives in, as the extent registered for it.
  CacheableSpan arena_span() const noexcept;

  // The Redis value pointer: hands this reference over as an opaque pointer (a key's value),
  // and takes one back. adopt() takes over the reference; share() adds one.
  void* release_to_opaque() noexcept { return std::exchange(header_, nullptr); }
  static Block adopt(void* opaque) noexcept {
    return Block(static_cast<detail::BlockHeader*>(opaque));
  }
  static Block share(void* opaque) noexcept {
    Block block(static_cast<detail::BlockHeader*>(opaque));
    block.retain();
    return block;
  }
  static BlockView view(const void* opaque) noexcept {
    const auto* header = static_cast<const detail::BlockHeader*>(opaque);
    return BlockView{{reinterpret_cast<const std::byte*>(header + 1), header->length},
                     header->crc,
                     header->footprint};
  }
  // References held on this block (tests).
  std::uint32_t references() const noexcept {
    return header_->references.load(std::memory_order_relaxed);
  }

 private:
  friend class Arena;
  explicit Block(detail::BlockHeader* header) noexcept : header_(header) {}
  void retain() noexcept {
    if (header_ != nullptr) header_->references.fetch_add(1, std::memory_order_relaxed);
  }
  void release() noexcept;
  detail::BlockHeader* header_ = nullptr;
};

class Arena {
 public:
  // Told the arena's in-use bytes (ArenaStats::in_use) after every change, in order, under the
  // arena's lock, on whichever thread allocated or freed. Must not call back into the arena.
  // The module mirrors them into the server's used_memory (store/ballast.hpp).
  using UsageListener = std::function<void(std::size_t in_use)>;

  // Reserves `capacity` bytes (mmap, MAP_NORESERVE: pages are committed on first touch) and
  // creates a jemalloc arena drawing from them. Fails if the kernel or jemalloc refuses. With
  // `huge_pages`, advises the kernel to back the reservation with transparent huge pages
  // (MADV_HUGEPAGE; a kernel without them leaves it on 4 KiB pages: huge_pages() says which).
  static Result<std::unique_ptr<Arena>> create(std::size_t capacity, UsageListener listener = {},
                                               bool huge_pages = false);
  // Destroys the jemalloc arena, retires any registration over the reservation
  // (dma::invalidate) and unmaps it. Every Block must be gone.
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  // A block for `length` bytes, its contents unspecified. kResourceExhausted naming arena-bytes
  // when the reservation cannot hold it. Never throws.
  Result<Block> allocate(std::size_t length) noexcept;
  // A block holding a copy of `bytes`, with their CRC32C recorded.
  Result<Block> copy_of(std::span<const std::byte> bytes) noexcept;

  // The reservation, to register on every service (ServiceSet::pin) and to answer
  // Operands::cacheable_span.
  std::uintptr_t base() const noexcept { return reinterpret_cast<std::uintptr_t>(base_); }
  std::size_t capacity() const noexcept { return capacity_; }
  // Whether the kernel took the MADV_HUGEPAGE advice (create()).
  bool huge_pages() const noexcept { return huge_pages_; }
  CacheableSpan span() const noexcept;
  ArenaStats stats() const noexcept;

  struct Hooks;  // the jemalloc extent hooks (arena.cpp)

 private:
  friend class Block;
  Arena(std::byte* base, std::size_t capacity);
  void free(detail::BlockHeader* header) noexcept;
  void prime() noexcept;

  std::byte* base_;
  std::size_t capacity_;
  bool huge_pages_ = false;
  std::unique_ptr<Hooks> hooks_;  // must outlive the jemalloc arena
  UsageListener listener_;        // called under mutex_
  unsigned index_ = 0;            // the jemalloc arena's index
  int flags_ = 0;                 // MALLOCX_ARENA(index_) | MALLOCX_TCACHE_NONE | alignment
  // The creating thread (the server's main thread, which allocates every block and frees most)
  // allocates and frees through a cache of its own: jemalloc's bin lock and slab bookkeeping for
  // each small block took ~0.25 us of a 4 KiB DMA.SETPLAIN. An explicit tcache must never be used
  // by two threads at once, so other threads (a fabric worker dropping a transfer's last
  // reference) go without it. Regions it caches are not in use (in_use_).
  std::thread::id owner_;
  std::optional<unsigned> owner_tcache_;
  int owner_flags_ = 0;           // flags_ with MALLOCX_TCACHE(owner_tcache_)
  int flags_here() const noexcept {
    return std::this_thread::get_id() == owner_ ? owner_flags_ : flags_;
  }
  mutable std::mutex mutex_;
  std::size_t in_use_ = 0;        // guarded by mutex_
  std::size_t blocks_ = 0;        // guarded by mutex_
  std::uint64_t refused_ = 0;     // guarded by mutex_
};

inline CacheableSpan Block::arena_span() const noexcept { return header_->arena->span(); }

inline void Block::release() noexcept {
  if (header_ == nullptr) return;
  if (header_->references.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    header_->arena->free(header_);
  }
  header_ = nullptr;
}

}  // namespace dma::store
