// Ballast: makes memory the server's allocator does not hand out count in its `used_memory`, so
// that maxmemory, eviction, deny-oom and INFO memory see the value store.
//
// The failure it prevents: the arena (store/arena.hpp) is one mmap'd reservation carved by a
// jemalloc arena of its own, outside Redis's zmalloc, whose counter alone is `used_memory`. A
// server full of DMA values would then report a few MiB used, never reach maxmemory, never
// evict a value under allkeys-lru and never refuse a deny-oom command, while its RSS grows to
// arena-bytes. Redis 7.0 has no module call that adds to used_memory, but memory a module takes
// with RedisModule_Alloc/TryAlloc "is taken into account as memory allocated by Redis" (the
// module API reference). So the ballast holds such allocations, in chunks, for as many bytes as
// the arena's blocks take, and gives their pages back to the kernel (MADV_DONTNEED) at once:
// the server counts them, the machine does not pay for them (address space only). Freeing a
// value frees chunks, so eviction sees used_memory fall by what it freed.
//
// Precision: it holds between `bytes` and `bytes` + the band, the larger of 2 chunks and 1/32 of
// `bytes` (the hysteresis keeps a value stored and deleted at a chunk boundary, and a DMA.SET's
// swap, which allocates the new block before it frees the old, from allocating and freeing
// chunks each time: with a 2-chunk band, each 1 MiB DMA.SET took and gave back two chunks and
// their madvise, ~5 us of the main thread). So used_memory over-counts the store by less than
// 512 KiB (the default chunk) or 1/32 of it, whichever is larger, and eviction may free up to
// that much more than it needed.
//
// Ownership: owns its chunks and releases them in its destructor. Thread-safety: follow() may
// be called from any thread (the arena calls it wherever a block is freed: a fabric worker when
// a transfer held the last reference); one mutex. The allocator must be thread-safe (zmalloc
// is: its counters are atomic).
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

namespace dma::store {

class Ballast {
 public:
  struct Allocator {
    void* (*allocate)(std::size_t bytes);  // null when refused
    void (*release)(void* memory);
  };
  static constexpr std::size_t kDefaultChunk = std::size_t{256} << 10;

  explicit Ballast(Allocator allocator, std::size_t chunk = kDefaultChunk);
  ~Ballast();
  Ballast(const Ballast&) = delete;
  Ballast& operator=(const Ballast&) = delete;

  // Holds at least `bytes` and less than `bytes` + band(bytes) (or as much as the allocator
  // gave); nothing for 0.
  void follow(std::size_t bytes) noexcept;

  std::size_t held() const noexcept;
  // Chunks the allocator refused (the server is out of address space): the store then counts
  // for less than it takes.
  std::uint64_t refused() const noexcept;
  std::size_t chunk() const noexcept { return chunk_; }
  // How much it may hold beyond `bytes` before it gives chunks back: 2 chunks or bytes / 32.
  std::size_t band(std::size_t bytes) const noexcept;

 private:
  const Allocator allocator_;
  const std::size_t chunk_;
  mutable std::mutex mutex_;
  std::vector<void*> chunks_;  // guarded by mutex_
  std::uint64_t refused_ = 0;  // guarded by mutex_
};

}  // namespace dma::store
