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

// ---- a write's options (DMA.SET, DMA.SETPLAIN) -----------------------------------------------
//
// SET's rules, so that a DMA write is a Redis write: a write clears the key's TTL unless it says
// KEEPTTL; EX/PX give a TTL from when the value is stored, EXAT/PXAT an absolute Unix time; NX
// writes only a key that does not exist, XX only one that does; GET (DMA.SETPLAIN only) answers
// the old value. Keywords are ASCII case-insensitive, each may appear once, and EX, PX, EXAT,
// PXAT and KEEPTTL exclude each other, as NX and XX do.

// What a write does to the key's TTL.
struct Expiry {
  enum class Kind : std::uint8_t {
    kClear,     // no option: the key ends without a TTL (SET's default)
    kKeep,      // KEEPTTL: the key keeps the TTL it had
    kRelative,  // EX, PX: `milliseconds` from when the value is stored
    kAbsolute,  // EXAT, PXAT: at `milliseconds` since the Unix epoch
  };
  Kind kind = Kind::kClear;
  std::int64_t milliseconds = 0;  // >= 1 for kRelative and kAbsolute
  friend bool operator==(const Expiry&, const Expiry&) = default;
};

// When the write happens at all.
enum class Condition : std::uint8_t {
  kAlways,
  kIfAbsent,   // NX
  kIfPresent,  // XX
};

struct WriteOptions {
  std::optional<std::uint32_t> crc;  // CRC <crc32c>: the bytes must have this CRC32C
  Expiry expiry;
  Condition condition = Condition::kAlways;
  bool get = false;  // GET: reply with the old value (DMA.SETPLAIN only)
  friend bool operator==(const WriteOptions&, const WriteOptions&) = default;
};

// The options at the front of `fields`: parsing stops at the first field that is not an option
// keyword (DMA.SET's regions follow its options). `allow_get`: GET is an option here (else it
// is refused naming why). `consumed` is how many fields the options took.
struct ParsedOptions {
  WriteOptions options;
  std::size_t consumed = 0;
};
Result<ParsedOptions> parse_write_options(std::span<const std::string_view> fields,
                                          bool allow_get);

// Whether the write should go ahead, given whether the key exists now. NX and XX are decided
// when a DMA.SET starts its read and again when the value is swapped in (the key may have been
// created or deleted meanwhile); the value is stored only if both hold.
bool condition_holds(Condition condition, bool key_exists) noexcept;

// The absolute expiry (milliseconds since the Unix epoch) of a kRelative or kAbsolute expiry
// stored at `now_ms`; kInvalidArgument for kClear/kKeep, or if it overflows (Redis refuses
// those as "invalid expire time" too).
Result<std::int64_t> expiry_deadline(const Expiry& expiry, std::int64_t now_ms);

// DMA.SET's arguments after the key:
//   <length> [CRC <crc32c>] [EX s | PX ms | EXAT unix-s | PXAT unix-ms | KEEPTTL] [NX | XX]
//   <rkey> <addr> <len> [<rkey> <addr> <len> ...]
// The options come in any order between the length and the regions; GET is refused (the old
// value would need regions of its own: use DMA.GET first, or DMA.SETPLAIN ... GET).
struct SetArguments {
  std::uint64_t length = 0;
  WriteOptions options;
  ParsedRegions regions;
};
Result<SetArguments> parse_set_arguments(std::span<const std::string_view> fields,
                                         std::size_t max_value_size);

// DMA.SETPLAIN's options after the key and the value, in any order:
//   [CRC <crc32c>] [EX s | PX ms | EXAT unix-s | PXAT unix-ms | KEEPTTL] [NX | XX] [GET]
// Nothing else may follow.
Result<WriteOptions> parse_setplain_options(std::span<const std::string_view> fields);

// ---- fork safety of the arena's registration ------------------------------------------------
//
// A BGSAVE, an AOF rewrite or a full resync forks the server, and the child reads every value
// from the arena. On providers that pin registered memory (verbs, efa) that is safe only when
// the kernel copies DMA-pinned pages into the child at fork (Linux 5.13+ with rdma-core 35+:
// ibv_is_fork_initialized() answers IBV_FORK_UNNEEDED). libibverbs' own fork support
// (ibv_fork_init, RDMAV_FORK_SAFE/IBV_FORK_SAFE, FI_EFA_FORK_SAFE) marks registrations
// MADV_DONTFORK instead, so the child has no arena and dies on its first value; with neither, a
// parent's write to a pinned page after fork breaks copy-on-write away from the page the NIC
// uses (and libfabric's efa provider aborts the process at fork). docs/RELIABILITY.md, "Fork".
enum class ForkSafety : std::uint8_t {
  kNotPinned,      // tcp, net, shm: nothing pinned, fork is ordinary copy-on-write
  kKernelCopies,   // pinned, and the kernel copies pinned pages at fork: safe
  kDontFork,       // pinned, registrations MADV_DONTFORK: children cannot read values
  kUnsafe,         // pinned, no fork support: fork may corrupt values or abort
};
// Whether a provider (EndpointDescription::provider, e.g. "verbs;ofi_rxm", "efa") pins memory.
bool provider_pins_memory(std::string_view provider) noexcept;
// `ibv_status`: ibv_is_fork_initialized()'s answer (0 disabled, 1 enabled, 2 unneeded), or
// nullopt if libibverbs is not loaded or too old to have it.
ForkSafety fork_safety(bool pins, std::optional<int> ibv_status) noexcept;
// The INFO dma value (dma_fork_safety) and a sentence for the load-time log.
std::string_view fork_safety_name(ForkSafety safety) noexcept;
std::string fork_safety_advice(ForkSafety safety);

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
  // `generation`: ServiceSet::generation() when it said hello (stale() compares it).
  Status open(std::uint64_t client_id, const Nonce& nonce, std::uint64_t generation = 0);
  // Whether `client_id` has a session opened at a generation other than `current` (a server
  // endpoint was replaced since its hello: its peer address and proof are for the old one).
  bool stale(std::uint64_t client_id, std::uint64_t current) const;
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
    std::uint64_t generation = 0;
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
  // Commands answered REHELLO (the session's server endpoint was replaced; session reset).
  std::atomic<std::uint64_t> rehellos{0};
  // DMA.GETs of plain string keys (copied into the arena first) and plain-RESP commands.
  std::atomic<std::uint64_t> plain_string_copies{0};
  std::atomic<std::uint64_t> plain_gets{0};
  std::atomic<std::uint64_t> plain_sets{0};
  // Writes replicated (to replicas and the AOF, as DMA.SETPLAIN), and writes NX/XX skipped (at
  // the command or, for a DMA.SET, when its read completed).
  std::atomic<std::uint64_t> writes_replicated{0};
  // Writes of large values not propagated because nothing would have received them (no AOF, no
  // replication backlog, no replica: write.hpp).
  std::atomic<std::uint64_t> writes_unpropagated{0};
  std::atomic<std::uint64_t> conditions_failed{0};
  // DMA.SETs whose read completed but which could not write any more (the server became a
  // replica, or the key's slot moved away meanwhile): answered READONLY/TRYAGAIN, key untouched.
  std::atomic<std::uint64_t> writes_refused_late{0};
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
