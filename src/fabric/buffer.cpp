// dma::Buffer (dma/memory.hpp): anonymous mappings for values, on huge pages where they pay.
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "dma/memory.hpp"

namespace dma {
namespace {

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14
#endif

constexpr std::size_t kSmallPage = 4096;

std::size_t round_up(std::size_t length, std::size_t unit) {
  return (length + unit - 1) / unit * unit;
}

Error mapping_failed(const char* call, std::size_t length, int error) {
  return Error(ErrorCode::kResourceExhausted,
               std::string("Buffer of ") + std::to_string(length) + " bytes: " + call +
                   " failed: " + std::strerror(error));
}

// Faults every page in, writing, so no transfer pays a page fault (and the kernel picks the
// page size now, under the advice). MADV_POPULATE_WRITE where the kernel has it; else a write
// per 4 KiB page (the mapping is zero-filled, so writing a zero changes nothing).
void fault_in(std::byte* data, std::size_t mapped) {
  if (madvise(data, mapped, MADV_POPULATE_WRITE) == 0) return;
  for (std::size_t offset = 0; offset < mapped; offset += kSmallPage) {
    *static_cast<volatile std::byte*>(data + offset) = std::byte{0};
  }
}

}  // namespace

Result<Buffer> Buffer::allocate(std::size_t length, HugePages huge_pages) {
  if (length == 0) return fail(ErrorCode::kInvalidArgument, "a Buffer needs at least one byte");
  const bool huge = huge_pages == HugePages::kAlways ||
                    (huge_pages == HugePages::kAuto && length >= kHugePagesFrom);
  const std::size_t unit = huge ? kHugePageBytes : kSmallPage;
  if (length > std::numeric_limits<std::size_t>::max() - 2 * unit) {
    return fail(ErrorCode::kInvalidArgument,
                "a Buffer of " + std::to_string(length) + " bytes cannot be mapped");
  }
  const std::size_t mapped = round_up(length, unit);
  // Huge pages need a 2 MiB-aligned start: map one page more and trim both ends.
  const std::size_t reserved = huge ? mapped + unit : mapped;
  void* reservation =
      mmap(nullptr, reserved, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (reservation == MAP_FAILED) return fail(mapping_failed("mmap", length, errno));
  auto* start = static_cast<std::byte*>(reservation);
  bool advised = false;
  if (huge) {
    const auto address = reinterpret_cast<std::uintptr_t>(start);
    const std::size_t head = round_up(address, unit) - address;
    if (head != 0) (void)munmap(start, head);
    const std::size_t tail = reserved - head - mapped;
    if (tail != 0) (void)munmap(start + head + mapped, tail);
    start += head;
    advised = madvise(start, mapped, MADV_HUGEPAGE) == 0;
  } else if (huge_pages == HugePages::kNever) {
    // Under THP "always" the kernel would back any aligned 2 MiB of it with a huge page.
    (void)madvise(start, mapped, MADV_NOHUGEPAGE);
  }
  fault_in(start, mapped);
  return Buffer(start, length, mapped, advised);
}

Buffer::Buffer(Buffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      mapped_(std::exchange(other.mapped_, 0)),
      huge_(std::exchange(other.huge_, false)) {}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    mapped_ = std::exchange(other.mapped_, 0);
    huge_ = std::exchange(other.huge_, false);
  }
  return *this;
}

Buffer::~Buffer() { release(); }

void Buffer::release() noexcept {
  if (data_ == nullptr) return;
  const auto base = reinterpret_cast<std::uintptr_t>(data_);
  // Registrations over these pages are retired before the pages go (memory.hpp).
  invalidate(base, base + mapped_);
  (void)munmap(data_, mapped_);
  data_ = nullptr;
  size_ = 0;
  mapped_ = 0;
  huge_ = false;
}

}  // namespace dma
