// The module's server-independent logic: DMA.GET/DMA.SET argument parsing, the HELLO proof's
// sessions and the counters. Nothing here includes the Redis module API or the value store, so
// tests and the fuzz targets link it (dma_module_core) without a server or jemalloc; the
// transfers' contexts are in transfer.hpp (dma_store).
//
// Thread-safety: parsing functions are pure. Counters are relaxed atomics, updated from any
// thread. Sessions is main-thread only (not thread-safe).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "dma/configuration.hpp"
#include "dma/result.hpp"
#include "dma/service.hpp"

namespace dma::module {

// The load arguments (`--loadmodule dma.so [name value]...`) are parsed by the library, next to
// the TOML parser, from the one configuration schema (dma/configuration.hpp,
// src/protocol/settings.hpp); the module names them here as it always has.
using dma::kDefaultInlineMax;
using dma::kDefaultMaxValueSize;
using dma::ModuleOptions;
using dma::parse_module_arguments;

// The remote regions named by `fields` (a multiple of three: rkey addr len), with their total.
struct ParsedRegions {
  RemoteRegions regions;
  std::uint64_t capacity = 0;
};
Result<ParsedRegions> parse_regions(std::span<const std::string_view> fields);

// A CRC32C argument: a decimal that fits in 32 bits.
Result<std::uint32_t> parse_crc(std::string_view field);
// ASCII case-insensitive equality, for keywords such as CRC.
bool equals_ignoring_case(std::string_view left, std::string_view right);

// DMA.GET's arguments after the key: [INLINE <max>] [<rkey> <addr> <len> ...]. Without INLINE
// the regions are required and the value is always written into them. With INLINE a value of
// at most `max` bytes (and the server's inline-max) comes back in the reply instead; a larger
// one is written into the regions, or, if none were given, only its length and CRC are
// answered (the client then knows what buffer to expose).
struct GetArguments {
  std::optional<std::uint64_t> inline_max;
  ParsedRegions regions;  // empty only with INLINE
};
Result<GetArguments> parse_get_arguments(std::span<const std::string_view> fields);

// DMA.SET's arguments after the key: <length> [CRC <crc32c>] <rkey> <addr> <len> ...
struct SetArguments {
  std::uint64_t length = 0;
  std::optional<std::uint32_t> crc;
  ParsedRegions regions;
};
Result<SetArguments> parse_set_arguments(std::span<const std::string_view> fields,
                                         std::size_t max_value_size);

// ---- the HELLO proof ------------------------------------------------------------------------
//
// A session is bound to a fabric address the client *advertises*. Without a proof a client could
// advertise a third party's address (and the key and address of that party's exposed memory)
// and have DMA.GET write into memory it does not own. So a session starts unproven: DMA.HELLO
// hands out a fresh random nonce, the client puts it in memory exposed on its own endpoint, and
// DMA.PROVE has the server *read* it back from the advertised address (a read, so no byte is
// written to an address before it is proven) and compare it in constant time. Only a match
// turns the session proven; only a proven session may DMA.GET or DMA.SET. Anybody able to put
// the nonce into memory behind that address controls it.

inline constexpr std::size_t kNonceBytes = 32;
using Nonce = std::array<std::uint8_t, kNonceBytes>;

// A fresh nonce from getrandom(2) (the kernel's CSPRNG), one per hello. Fails only if the kernel
// refuses (e.g. ENOSYS), never with a weaker source.
Result<Nonce> make_nonce();

// Whether `read` is exactly `nonce`, in time that depends only on the lengths (which are public).
bool matches_nonce(std::span<const std::byte> read, const Nonce& nonce) noexcept;

// The sessions of one server, keyed by client (connection) id: each says hello, proves, and is
// forgotten when its connection goes. Owned by the module state; main thread only.
class Sessions {
 public:
  enum class Stage : std::uint8_t {
    kAwaitingProof,  // said hello, holds a nonce, may send DMA.PROVE once
    kProving,        // DMA.PROVE's read is in flight
    kProven,         // may transfer
  };

  // Starts a session for `client_id` with `nonce`; fails if the connection already has one.
  Status open(std::uint64_t client_id, const Nonce& nonce);
  // Fails unless `client_id`'s session is proven, with a message telling the client what to do.
  Status check_proven(std::uint64_t client_id) const;
  // Moves an awaiting session to kProving and returns its nonce; fails (naming why) if there is
  // no session or it is not awaiting a proof.
  Result<Nonce> begin_proof(std::uint64_t client_id);
  // Ends a proof: a match makes the session proven; anything else ends the session (the caller
  // then removes the peer). Fails if the session is gone or not proving, or on a mismatch.
  Status finish_proof(std::uint64_t client_id, std::span<const std::byte> read);
  // Forgets `client_id`'s session; false if it had none.
  bool close(std::uint64_t client_id);

  bool contains(std::uint64_t client_id) const { return sessions_.contains(client_id); }
  std::size_t size() const noexcept { return sessions_.size(); }
  std::size_t proven() const noexcept { return proven_; }

 private:
  struct Session {
    Stage stage = Stage::kAwaitingProof;
    Nonce nonce{};
  };
  std::unordered_map<std::uint64_t, Session> sessions_;
  std::size_t proven_ = 0;
};

// What INFO dma and DMA.INFO report.
struct Counters {
  std::atomic<std::uint64_t> sessions{0};
  std::atomic<std::uint64_t> gets{0};
  std::atomic<std::uint64_t> sets{0};
  std::atomic<std::uint64_t> bytes_to_clients{0};
  std::atomic<std::uint64_t> bytes_from_clients{0};
  std::atomic<std::uint64_t> errors{0};
  std::atomic<std::uint64_t> in_flight{0};
  // DMA.PROVEs that did not prove (mismatch, failed read, malformed): sessions refused.
  std::atomic<std::uint64_t> proofs_refused{0};
  // DMA.GETs of plain string keys (copied into the arena first) and plain-RESP commands.
  std::atomic<std::uint64_t> plain_string_copies{0};
  std::atomic<std::uint64_t> plain_gets{0};
  std::atomic<std::uint64_t> plain_sets{0};
  // DMA.GETs answered in their reply (INLINE), not over the fabric (those count in `gets`).
  std::atomic<std::uint64_t> inline_gets{0};
  // Command-to-completion latency of finished transfers, in microseconds.
  std::atomic<std::uint64_t> latency_total_us{0};
  std::atomic<std::uint64_t> latency_count{0};
  std::atomic<std::uint64_t> latency_max_us{0};
  void record_latency(std::uint64_t microseconds) noexcept {
    latency_total_us.fetch_add(microseconds, std::memory_order_relaxed);
    latency_count.fetch_add(1, std::memory_order_relaxed);
    std::uint64_t seen = latency_max_us.load(std::memory_order_relaxed);
    while (microseconds > seen &&
           !latency_max_us.compare_exchange_weak(seen, microseconds, std::memory_order_relaxed)) {
    }
  }
  std::uint64_t latency_average_us() const noexcept {
    const std::uint64_t count = latency_count.load(std::memory_order_relaxed);
    return count == 0 ? 0 : latency_total_us.load(std::memory_order_relaxed) / count;
  }
};

// The error reply text for an Error: "ERR <kind>: <message>" on one line.
std::string error_reply(const Error& error);

}  // namespace dma::module
