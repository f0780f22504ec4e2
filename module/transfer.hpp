// One DMA.GET, DMA.SET or DMA.PROVE in flight: the Operands the fabric service moves bytes
// through, holding a reference on the value-store block they live in.
//
// A GET sends straight from the stored block (or, for a plain string key, from a copy made
// into the arena when the command ran): the reference keeps the bytes alive and unchanged
// while DEL, overwrite, expiry or eviction drops the key's own reference, and the block is
// freed when the last reference goes, after the write has completed. A SET reads into a fresh
// block that becomes the key's value only after the read completed and its CRC32C matched. A
// proof reads the nonce into a small block and compares it. Every operand lies in the arena,
// which is registered once on every service, so no transfer registers memory.
//
// Ownership: the service owns the context while the transfer runs, then the server, as the
// blocked client's private data, until its free callback; whoever destroys it drops the
// reference. Contexts come from a free list (class operator new/delete), and a SET's key of up
// to kInlineKey bytes lives inside the context, so a steady stream of transfers allocates
// nothing here; context_allocations() counts the contexts ever taken from the heap. Thread-safety: touched by one thread at a time, handed over through the service
// (main thread -> worker -> main thread).
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "dma/service.hpp"
#include "store/arena.hpp"

namespace dma::module {

class TransferContext : public Operands {
 public:
  enum class Kind : std::uint8_t { kGet, kSet, kProve };
  // A GET of `block`. `crc_known`: the block's CRC is recorded (a stored value), so the
  // transfer computes none; else (a copy of a plain string) the service computes it.
  static std::unique_ptr<TransferContext> for_get(store::Block block, bool crc_known);
  // A SET into `key` of `landing`'s length, checked against `crc` when given.
  static std::unique_ptr<TransferContext> for_set(std::string_view key, store::Block landing,
                                                  std::optional<std::uint32_t> crc);
  // The read of `client_id`'s proof into `landing` (kNonceBytes long).
  static std::unique_ptr<TransferContext> for_proof(std::uint64_t client_id,
                                                    store::Block landing);

  static void* operator new(std::size_t size);
  static void operator delete(void* memory, std::size_t size) noexcept;
  // Contexts allocated from the heap since load (the free list was empty), and the free list's
  // cap: a steady workload stops raising the first.
  static std::uint64_t context_allocations() noexcept;
  static constexpr std::size_t kFreeListCap = 4096;
  static constexpr std::size_t kInlineKey = 64;

  std::span<const std::byte> source() override;
  std::span<std::byte> allocate(std::size_t length) override;
  std::optional<CacheableSpan> cacheable_span() override;

  Kind kind() const noexcept { return kind_; }
  std::string_view key() const noexcept {
    return key_size_ <= kInlineKey ? std::string_view(key_inline_.data(), key_size_)
                                   : std::string_view(key_long_);
  }
  std::optional<std::uint32_t> expected_crc() const noexcept { return expected_crc_; }
  bool crc_known() const noexcept { return crc_known_; }
  // The block the bytes are sent from or land in (empty in an early answer).
  store::Block& block() noexcept { return block_; }
  std::span<const std::byte> bytes() const noexcept {
    return block_ ? block_.bytes() : std::span<const std::byte>();
  }
  // The connection that issued the command (whose session a proof is for).
  std::uint64_t client_id() const noexcept { return client_id_; }

  // The server's handle on the blocked client, opaque here.
  void* blocked = nullptr;
  // Set by the batch completer before the context goes back to the main thread.
  std::optional<Outcome> outcome;
  // When the command handed the transfer over, for the latency counters.
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();

  // A transfer that expires (Operands::on_expired) is answered at once, but this context and
  // its block stay with the service until the provider lets go of them. The module sets
  // `answer_early`; on expiry it receives a bodiless copy (same kind, key and client, no block,
  // the error as its outcome) that takes over `blocked`, and this context's completion, which
  // comes later with `blocked` null, only frees it. Runs on the worker thread.
  using EarlyAnswer = void (*)(std::unique_ptr<TransferContext> answer);
  EarlyAnswer answer_early = nullptr;
  void on_expired(const Error& error) override;

 private:
  TransferContext(Kind kind, std::string_view key, store::Block block,
                  std::optional<std::uint32_t> crc);
  Kind kind_;
  bool crc_known_ = false;
  std::uint64_t client_id_ = 0;
  std::size_t key_size_ = 0;
  std::array<char, kInlineKey> key_inline_;
  std::string key_long_;  // a key longer than kInlineKey
  std::optional<std::uint32_t> expected_crc_;
  store::Block block_;
};

}  // namespace dma::module
