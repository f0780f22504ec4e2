#include "transfer.hpp"

#include <utility>

namespace dma::module {

std::unique_ptr<TransferContext> TransferContext::for_get(store::Block block, bool crc_known) {
  std::unique_ptr<TransferContext> context(
      new TransferContext(Kind::kGet, {}, std::move(block), WriteOptions{}));
  context->crc_known_ = crc_known;
  return context;
}

std::unique_ptr<TransferContext> TransferContext::for_set(std::string key, store::Block landing,
                                                          WriteOptions options) {
  return std::unique_ptr<TransferContext>(
      new TransferContext(Kind::kSet, std::move(key), std::move(landing), std::move(options)));
}

std::unique_ptr<TransferContext> TransferContext::for_proof(std::uint64_t client_id,
                                                            store::Block landing) {
  std::unique_ptr<TransferContext> context(
      new TransferContext(Kind::kProve, {}, std::move(landing), WriteOptions{}));
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
  std::unique_ptr<TransferContext> answer(new TransferContext(kind_, key_, {}, options_));
  answer->client_id_ = client_id_;
  answer->started = started;
  answer->outcome = Outcome(fail(error));
  answer->blocked = std::exchange(blocked, nullptr);
  answer_early(std::move(answer));
}

}  // namespace dma::module
