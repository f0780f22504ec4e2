#include "store/arena.hpp"

#include <jemalloc/jemalloc.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "dma/protocol.hpp"

namespace dma::store {

// jemalloc passes the hooks pointer it was given back to every hook, so the reservation sits
// right behind it. All hooks but alloc only answer "done" or "refused": the memory is one
// mapping, always committed, registered as a whole, and never given back before ~Arena.
struct Arena::Hooks {
  extent_hooks_t table;  // first member: jemalloc's pointer to it is a pointer to Hooks
  std::byte* base = nullptr;
  std::size_t capacity = 0;
  std::atomic<std::size_t> bumped{0};  // offset of the first byte never handed out

  static Hooks* of(extent_hooks_t* table) { return reinterpret_cast<Hooks*>(table); }

  // A fresh piece of the reservation (a bump pointer: jemalloc reuses what it was given and
  // never returns it, so nothing is handed out twice). Never-touched anonymous pages are zero.
  static void* alloc(extent_hooks_t* table, void* new_addr, std::size_t size,
                     std::size_t alignment, bool* zero, bool* commit, unsigned /*arena*/) {
    Hooks* hooks = of(table);
    const std::uintptr_t base = reinterpret_cast<std::uintptr_t>(hooks->base);
    if (alignment == 0) alignment = 1;
    std::size_t offset = hooks->bumped.load(std::memory_order_relaxed);
    std::size_t start = 0;
    do {
      const std::uintptr_t aligned = (base + offset + alignment - 1) / alignment * alignment;
      start = aligned - base;
      if (new_addr != nullptr && reinterpret_cast<std::uintptr_t>(new_addr) != aligned) {
        return nullptr;  // growing in place is possible only at the bump pointer
      }
      if (start > hooks->capacity || size > hooks->capacity - start) return nullptr;
    } while (!hooks->bumped.compare_exchange_weak(offset, start + size, std::memory_order_relaxed));
    *zero = true;
    *commit = true;
    return hooks->base + start;
  }
  // true: refused (jemalloc keeps the extent for reuse).
  static bool dalloc(extent_hooks_t*, void*, std::size_t, bool, unsigned) { return true; }
  static void destroy(extent_hooks_t*, void*, std::size_t, bool, unsigned) {}
  static bool commit(extent_hooks_t*, void*, std::size_t, std::size_t, std::size_t, unsigned) {
    return false;  // already committed
  }
  static bool decommit(extent_hooks_t*, void*, std::size_t, std::size_t, std::size_t, unsigned) {
    return true;
  }
  static bool purge(extent_hooks_t*, void*, std::size_t, std::size_t, std::size_t, unsigned) {
    return true;
  }
  // Splitting and merging inside one mapping (one registration) is always fine.
  static bool split(extent_hooks_t*, void*, std::size_t, std::size_t, std::size_t, bool, unsigned) {
    return false;
  }
  static bool merge(extent_hooks_t*, void*, std::size_t, void*, std::size_t, bool, unsigned) {
    return false;
  }

  Hooks(std::byte* reservation, std::size_t size) : base(reservation), capacity(size) {
    table.alloc = alloc;
    table.dalloc = dalloc;
    table.destroy = destroy;
    table.commit = commit;
    table.decommit = decommit;
    table.purge_lazy = purge;
    table.purge_forced = purge;
    table.split = split;
    table.merge = merge;
  }
};

namespace {

constexpr std::size_t kHeader = sizeof(detail::BlockHeader);
static_assert(kHeader == 64);

std::string arena_control(unsigned index, const char* name) {
  return "arena." + std::to_string(index) + "." + name;
}

}  // namespace

Arena::Arena(std::byte* base, std::size_t capacity) : base_(base), capacity_(capacity) {}

Result<std::unique_ptr<Arena>> Arena::create(std::size_t capacity, UsageListener listener,
                                             bool huge_pages) {
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  capacity = (capacity + page - 1) / page * page;
  void* mapped = ::mmap(nullptr, capacity, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (mapped == MAP_FAILED) {
    return fail(ErrorCode::kResourceExhausted, "cannot reserve arena-bytes " +
                                                   std::to_string(capacity) +
                                                   " for the value store: " + std::strerror(errno));
  }
  std::unique_ptr<Arena> arena(new Arena(static_cast<std::byte*>(mapped), capacity));
  // Before any page is touched, so every 2 MiB-aligned stretch can fault in as one huge page.
  // EINVAL: a kernel built without transparent huge pages; the arena works on 4 KiB pages.
  arena->huge_pages_ = huge_pages && ::madvise(mapped, capacity, MADV_HUGEPAGE) == 0;
  arena->hooks_ = std::make_unique<Hooks>(arena->base_, capacity);
  arena->listener_ = std::move(listener);
  extent_hooks_t* table = &arena->hooks_->table;
  unsigned index = 0;
  std::size_t index_size = sizeof(index);
  if (const int code = ::mallctl("arenas.create", &index, &index_size, &table, sizeof(table));
      code != 0) {
    ::munmap(mapped, capacity);
    arena->base_ = nullptr;
    return fail(ErrorCode::kResourceExhausted,
                std::string("jemalloc refused a new arena for the value store: ") +
                    std::strerror(code));
  }
  arena->index_ = index;
  arena->flags_ = MALLOCX_ARENA(index) | MALLOCX_TCACHE_NONE | MALLOCX_ALIGN(kHeader);
  arena->owner_ = std::this_thread::get_id();
  arena->owner_flags_ = arena->flags_;
  unsigned tcache = 0;
  std::size_t tcache_size = sizeof(tcache);
  if (::mallctl("tcache.create", &tcache, &tcache_size, nullptr, 0) == 0) {
    arena->owner_tcache_ = tcache;
    arena->owner_flags_ = MALLOCX_ARENA(index) | MALLOCX_TCACHE(tcache) | MALLOCX_ALIGN(kHeader);
  }
  // Decay 0: a freed extent goes straight through jemalloc's purge path, where our hooks refuse
  // every purge, so it lands in the retained set still mapped, committed and registered. Only
  // there does jemalloc coalesce free neighbours (dirty extents wait for decay to merge), so a
  // 1 MiB hole next to a 7 MiB hole serves an 8 MiB value. A steady workload reuses
  // already-faulted memory. Growth in steps of at most 64 MiB keeps the bump pointer from
  // overshooting a small arena.
  ssize_t immediately = 0;
  std::size_t grow_limit = std::size_t{64} << 20;
  (void)::mallctl(arena_control(index, "dirty_decay_ms").c_str(), nullptr, nullptr, &immediately,
                  sizeof(immediately));
  (void)::mallctl(arena_control(index, "muzzy_decay_ms").c_str(), nullptr, nullptr, &immediately,
                  sizeof(immediately));
  (void)::mallctl(arena_control(index, "retain_grow_limit").c_str(), nullptr, nullptr,
                  &grow_limit, sizeof(grow_limit));
  arena->prime();
  return arena;
}

// jemalloc 5.3 never merges free extents across the boundary of two alloc-hook calls (each is a
// "head"), and grows in many small steps, so without this the arena would be cut into pieces
// no larger than its growth steps: a 1 GiB arena could not hold one 100 MiB value after a mix
// of smaller ones came and went. One allocation of nearly all of it, freed at once, makes
// jemalloc take the reservation in one piece that it then splits and re-coalesces freely. The
// rest (1/32, at least 4 MiB) is left to the hook for jemalloc's own metadata.
void Arena::prime() noexcept {
  const std::size_t headroom = std::max<std::size_t>(std::size_t{4} << 20, capacity_ / 32);
  if (capacity_ <= 2 * headroom) return;
  for (std::size_t size = capacity_ - headroom; size >= capacity_ / 2; size -= size / 16) {
    if (void* whole = ::mallocx(size, flags_)) {
      ::dallocx(whole, flags_);
      return;
    }
  }
}

Arena::~Arena() {
  if (base_ == nullptr) return;
  if (owner_tcache_) {  // its cached regions go back to the arena first
    unsigned tcache = *owner_tcache_;
    (void)::mallctl("tcache.destroy", nullptr, nullptr, &tcache, sizeof(tcache));
  }
  (void)::mallctl(arena_control(index_, "destroy").c_str(), nullptr, nullptr, nullptr, 0);
  const std::uintptr_t start = base();
  invalidate(start, start + capacity_);  // before the pages go
  ::munmap(base_, capacity_);
}

Result<Block> Arena::allocate(std::size_t length) noexcept {
  // One byte at least past the header, so data() points into the allocation.
  const std::size_t wanted = kHeader + (length == 0 ? 1 : length);
  if (wanted < length) {
    return fail(ErrorCode::kResourceExhausted, "a value of " + std::to_string(length) +
                                                   " bytes does not fit in the address space");
  }
  const int flags = flags_here();
  std::unique_lock lock(mutex_);
  void* memory = ::mallocx(wanted, flags);
  if (memory == nullptr) {
    ++refused_;
    const std::size_t in_use = in_use_;
    lock.unlock();
    return fail(ErrorCode::kResourceExhausted,
                "the value store is full: arena-bytes " + std::to_string(capacity_) + " (" +
                    std::to_string(in_use) + " in use) cannot hold a value of " +
                    std::to_string(length) + " bytes");
  }
  const std::size_t footprint = ::sallocx(memory, flags);
  in_use_ += footprint;
  ++blocks_;
  if (listener_) listener_(in_use_);
  lock.unlock();
  auto* header = new (memory) detail::BlockHeader;
  header->length = length;
  header->footprint = footprint;
  header->arena = this;
  return Block(header);
}

Result<Block> Arena::copy_of(std::span<const std::byte> bytes) noexcept {
  DMA_TRY_ASSIGN(Block block, allocate(bytes.size()));
  if (!bytes.empty()) std::memcpy(block.data(), bytes.data(), bytes.size());
  block.set_crc(crc32c(bytes));
  return block;
}

void Arena::free(detail::BlockHeader* header) noexcept {
  const std::size_t footprint = header->footprint;
  header->~BlockHeader();
  const int flags = flags_here();
  const std::lock_guard lock(mutex_);
  ::dallocx(header, flags);
  in_use_ -= footprint;
  --blocks_;
  if (listener_) listener_(in_use_);
}

CacheableSpan Arena::span() const noexcept { return *CacheableSpan::create(base(), capacity_); }

ArenaStats Arena::stats() const noexcept {
  const std::lock_guard lock(mutex_);
  ArenaStats stats;
  stats.registered = capacity_;
  stats.in_use = in_use_;
  stats.free = capacity_ - std::min(in_use_, capacity_);
  stats.mapped = hooks_->bumped.load(std::memory_order_relaxed);
  stats.blocks = blocks_;
  stats.refused = refused_;
  return stats;
}

}  // namespace dma::store
