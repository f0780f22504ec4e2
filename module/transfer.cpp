#include "transfer.hpp"

#include <cstring>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

namespace dma::module {
namespace {

// The contexts' free list: taken on the main thread, given back on the main thread (free
// callback) or a worker (an expired transfer's context). Process-wide, like the allocator it
// stands in front of; never destroyed (a worker may still give a context back at exit).
struct FreeList {
  std::mutex mutex;
  std::vector<void*> blocks;  // guarded by mutex; reserved to the cap once
  std::uint64_t allocations = 0;  // guarded by mutex
};
FreeList& free_list() {
  static FreeList* list = [] {
    auto* made = new FreeList;
    made->blocks.reserve(TransferContext::kFreeListCap);
    return made;
  }();
  return *list;
}

}  // namespace

void* TransferContext::operator new(std::size_t size) {
  FreeList& list = free_list();
  {
    std::lock_guard lock(list.mutex);
    if (size == sizeof(TransferContext) && !list.blocks.empty()) {
      void* memory = list.blocks.back();
      list.blocks.pop_back();
      return memory;
    }
    ++list.allocations;
  }
  return ::operator new(size);
}

void TransferContext::operator delete(void* memory, std::size_t size) noexcept {
  if (memory == nullptr) return;
  FreeList& list = free_list();
  {
    std::lock_guard lock(list.mutex);
    if (size == sizeof(TransferContext) && list.blocks.size() < kFreeListCap) {
      list.blocks.push_back(memory);
      return;
    }
  }
  ::operator delete(memory, size);
}

std::uint64_t TransferContext::context_allocations() noexcept {
  FreeList& list = free_list();
  std::lock_guard lock(list.mutex);
  return list.allocations;
}

TransferContext::TransferContext(Kind kind, std::string_view key, store::Block block,
                                 std::optional<std::uint32_t> crc)
    : kind_(kind), key_size_(key.size()), expected_crc_(crc), block_(std::move(block)) {
  if (key.size() <= kInlineKey) {
    if (!key.empty()) std::memcpy(key_inline_.data(), key.data(), key.size());
  } else {
    key_long_.assign(key);
  }
}

std::unique_ptr<TransferContext> TransferContext::for_get(store::Block block, bool crc_known) {
  std::unique_ptr<TransferContext> context(
      new TransferContext(Kind::kGet, {}, std::move(block), std::nullopt));
  context->crc_known_ = crc_known;
  return context;
}

std::unique_ptr<TransferContext> TransferContext::for_set(std::string_view key,
                                                          store::Block landing,
                                                          std::optional<std::uint32_t> crc) {
  return std::unique_ptr<TransferContext>(
      new TransferContext(Kind::kSet, key, std::move(landing), crc));
}

std::unique_ptr<TransferContext> TransferContext::for_proof(std::uint64_t client_id,
                                                            store::Block landing) {
  std::unique_ptr<TransferContext> context(
      new TransferContext(Kind::kProve, {}, std::move(landing), std::nullopt));
  context->client_id_ = client_id;
  return context;
}

std::span<const std::byte> TransferContext::source() {
  if (kind_ != Kind::kGet || !block_) return {};
  return block_.bytes();
}

std::span<std::byte> TransferContext::allocate(std::size_t length) {
  if (kind_ == Kind::kGet || !block_ || length > block_.length()) return {};
  return block_.writable();
}

std::optional<CacheableSpan> TransferContext::cacheable_span() {
  // Only asked on a registration-cache miss, which the arena's registration at load rules out;
  // should it ever miss, the whole arena is the extent to register, once.
  if (!block_) return std::nullopt;
  return block_.arena_span();
}

void TransferContext::on_expired(const Error& error) {
  if (answer_early == nullptr || blocked == nullptr) return;
  std::unique_ptr<TransferContext> answer(new TransferContext(kind_, key(), {}, expected_crc_));
  answer->client_id_ = client_id_;
  answer->started = started;
  answer->outcome = Outcome(fail(error));
  answer->blocked = std::exchange(blocked, nullptr);
  answer_early(std::move(answer));
}

}  // namespace dma::module
