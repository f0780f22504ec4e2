#include "store/ballast.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>

namespace dma::store {
namespace {

// Hands the whole pages inside [memory, memory + bytes) back to the kernel: they read as zero if
// touched again, which no one does (the allocator keeps its own bookkeeping out of band, and a
// chunk is only ever freed, never read).
void drop_pages(void* memory, std::size_t bytes) noexcept {
  const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto start = reinterpret_cast<std::uintptr_t>(memory);
  const std::uintptr_t first = (start + page - 1) / page * page;
  const std::uintptr_t last = (start + bytes) / page * page;
  if (last > first) {
    (void)::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
  }
}

}  // namespace

Ballast::Ballast(Allocator allocator, std::size_t chunk) : allocator_(allocator), chunk_(chunk) {}

Ballast::~Ballast() {
  for (void* memory : chunks_) allocator_.release(memory);
}

void Ballast::follow(std::size_t bytes) noexcept {
  const std::lock_guard lock(mutex_);
  while (chunks_.size() * chunk_ < bytes) {
    void* memory = allocator_.allocate(chunk_);
    if (memory == nullptr) {
      ++refused_;
      break;
    }
    drop_pages(memory, chunk_);
    try {
      chunks_.push_back(memory);
    } catch (...) {  // no exception leaves: this runs inside the arena's free
      allocator_.release(memory);
      ++refused_;
      break;
    }
  }
  // An empty store holds nothing (so used_memory returns exactly where it was).
  while (!chunks_.empty() && (bytes == 0 || chunks_.size() * chunk_ >= bytes + band(bytes))) {
    allocator_.release(chunks_.back());
    chunks_.pop_back();
  }
}

std::size_t Ballast::band(std::size_t bytes) const noexcept {
  return std::max(2 * chunk_, bytes / 32);
}

std::size_t Ballast::held() const noexcept {
  const std::lock_guard lock(mutex_);
  return chunks_.size() * chunk_;
}

std::uint64_t Ballast::refused() const noexcept {
  const std::lock_guard lock(mutex_);
  return refused_;
}

}  // namespace dma::store
