#include "core.hpp"

#include <utility>

#include <sys/random.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <limits>

#include "dma/protocol.hpp"

namespace dma::module {

bool equals_ignoring_case(std::string_view left, std::string_view right) {
  return left.size() == right.size() &&
         std::equal(left.begin(), left.end(), right.begin(), [](char a, char b) {
           return std::tolower(static_cast<unsigned char>(a)) ==
                  std::tolower(static_cast<unsigned char>(b));
         });
}

Result<std::uint32_t> parse_crc(std::string_view field) {
  auto crc = parse_decimal(field, "crc32c");
  if (!crc) return fail(std::move(crc).error());
  if (*crc > std::numeric_limits<std::uint32_t>::max()) {
    return fail(ErrorCode::kInvalidArgument,
                "crc32c " + std::string(field) + " does not fit in 32 bits");
  }
  return static_cast<std::uint32_t>(*crc);
}

Result<ParsedRegions> parse_regions(std::span<const std::string_view> fields) {
  if (fields.empty() || fields.size() % 3 != 0) {
    return fail(ErrorCode::kInvalidArgument,
                "regions are <rkey> <addr> <len> triples, at least one");
  }
  const std::size_t count = fields.size() / 3;
  if (count > kMaxRemoteRegions) {
    return fail(ErrorCode::kInvalidArgument, std::to_string(count) + " regions; at most " +
                                                 std::to_string(kMaxRemoteRegions) +
                                                 " are allowed");
  }
  ParsedRegions out;
  for (std::size_t index = 0; index < count; ++index) {
    auto key = parse_decimal(fields[3 * index], "rkey");
    if (!key) return fail(std::move(key).error());
    auto address = parse_decimal(fields[3 * index + 1], "addr");
    if (!address) return fail(std::move(address).error());
    auto length = parse_decimal(fields[3 * index + 2], "len");
    if (!length) return fail(std::move(length).error());
    if (*length == 0) {
      return fail(ErrorCode::kInvalidArgument,
                  "region " + std::to_string(index) + " has zero length");
    }
    if (*address + *length < *address) {
      return fail(ErrorCode::kInvalidArgument,
                  "region " + std::to_string(index) + " overflows the address space");
    }
    if (out.capacity + *length < out.capacity) {
      return fail(ErrorCode::kInvalidArgument, "the regions' total length overflows");
    }
    out.capacity += *length;
    out.regions.push_back(RemoteRegion{*key, *address, *length});
  }
  return out;
}

namespace {

constexpr std::int64_t kMaxMilliseconds = std::numeric_limits<std::int64_t>::max();

// The TTL keywords and what they mean: relative or absolute, in seconds or milliseconds.
struct TtlKeyword {
  std::string_view name;
  Expiry::Kind kind;
  bool seconds;
};
constexpr TtlKeyword kTtlKeywords[] = {
    {"EX", Expiry::Kind::kRelative, true},
    {"PX", Expiry::Kind::kRelative, false},
    {"EXAT", Expiry::Kind::kAbsolute, true},
    {"PXAT", Expiry::Kind::kAbsolute, false},
};

Error twice_or_combined(std::string_view earlier, std::string_view now) {
  if (earlier == now) return Error(ErrorCode::kInvalidArgument, std::string(now) + " is given twice");
  return Error(ErrorCode::kInvalidArgument,
               std::string(earlier) + " and " + std::string(now) + " cannot be combined");
}

}  // namespace

Result<ParsedOptions> parse_write_options(std::span<const std::string_view> fields,
                                          bool allow_get) {
  ParsedOptions out;
  WriteOptions& options = out.options;
  std::string_view ttl_option;        // the TTL keyword seen, if any
  std::string_view condition_option;  // NX or XX, if seen
  std::size_t index = 0;
  while (index < fields.size()) {
    const std::string_view field = fields[index];
    if (equals_ignoring_case(field, "CRC")) {
      if (options.crc) return fail(twice_or_combined("CRC", "CRC"));
      if (index + 1 >= fields.size()) {
        return fail(ErrorCode::kInvalidArgument, "CRC needs a value");
      }
      DMA_TRY_ASSIGN(options.crc, parse_crc(fields[index + 1]));
      index += 2;
      continue;
    }
    const TtlKeyword* ttl = nullptr;
    for (const TtlKeyword& keyword : kTtlKeywords) {
      if (equals_ignoring_case(field, keyword.name)) ttl = &keyword;
    }
    if (ttl != nullptr || equals_ignoring_case(field, "KEEPTTL")) {
      const std::string_view name = ttl != nullptr ? ttl->name : std::string_view("KEEPTTL");
      if (!ttl_option.empty()) return fail(twice_or_combined(ttl_option, name));
      ttl_option = name;
      if (ttl == nullptr) {
        options.expiry = Expiry{Expiry::Kind::kKeep, 0};
        index += 1;
        continue;
      }
      if (index + 1 >= fields.size()) {
        return fail(ErrorCode::kInvalidArgument, std::string(name) + " needs a value");
      }
      DMA_TRY_ASSIGN(const std::uint64_t value, parse_decimal(fields[index + 1], name));
      const std::uint64_t limit = ttl->seconds ? static_cast<std::uint64_t>(kMaxMilliseconds) / 1000
                                               : static_cast<std::uint64_t>(kMaxMilliseconds);
      if (value == 0 || value > limit) {
        return fail(ErrorCode::kInvalidArgument,
                    "invalid expire time: " + std::string(name) + " " + std::to_string(value) +
                        " is not in 1.." + std::to_string(limit));
      }
      options.expiry = Expiry{ttl->kind, static_cast<std::int64_t>(value) * (ttl->seconds ? 1000 : 1)};
      index += 2;
      continue;
    }
    if (equals_ignoring_case(field, "NX") || equals_ignoring_case(field, "XX")) {
      const bool absent = equals_ignoring_case(field, "NX");
      const std::string_view name = absent ? "NX" : "XX";
      if (!condition_option.empty()) return fail(twice_or_combined(condition_option, name));
      condition_option = name;
      options.condition = absent ? Condition::kIfAbsent : Condition::kIfPresent;
      index += 1;
      continue;
    }
    if (equals_ignoring_case(field, "GET")) {
      if (!allow_get) {
        return fail(ErrorCode::kInvalidArgument,
                    "GET does not fit DMA.SET: the old value would need regions of its own (use "
                    "DMA.GET first, or DMA.SETPLAIN ... GET)");
      }
      if (options.get) return fail(twice_or_combined("GET", "GET"));
      options.get = true;
      index += 1;
      continue;
    }
    break;  // not an option: DMA.SET's regions start here
  }
  out.consumed = index;
  return out;
}

bool condition_holds(Condition condition, bool key_exists) noexcept {
  switch (condition) {
    case Condition::kAlways:
      return true;
    case Condition::kIfAbsent:
      return !key_exists;
    case Condition::kIfPresent:
      return key_exists;
  }
  return false;
}

Result<std::int64_t> expiry_deadline(const Expiry& expiry, std::int64_t now_ms) {
  if (expiry.kind == Expiry::Kind::kAbsolute) return expiry.milliseconds;
  if (expiry.kind != Expiry::Kind::kRelative) {
    return fail(ErrorCode::kInvalidArgument, "this write sets no expiry");
  }
  std::int64_t deadline = 0;
  if (__builtin_add_overflow(now_ms, expiry.milliseconds, &deadline)) {
    return fail(ErrorCode::kInvalidArgument,
                "invalid expire time: " + std::to_string(expiry.milliseconds) +
                    " ms from now overflows");
  }
  return deadline;
}

Result<GetArguments> parse_get_arguments(std::span<const std::string_view> fields) {
  GetArguments out;
  if (!fields.empty() && equals_ignoring_case(fields[0], "INLINE")) {
    if (fields.size() < 2) return fail(ErrorCode::kInvalidArgument, "INLINE needs a length");
    auto most = parse_decimal(fields[1], "inline length");
    if (!most) return fail(std::move(most).error());
    out.inline_max = *most;
    fields = fields.subspan(2);
    if (fields.empty()) return out;
  }
  auto regions = parse_regions(fields);
  if (!regions) return fail(std::move(regions).error());
  out.regions = std::move(*regions);
  return out;
}

Result<SetArguments> parse_set_arguments(std::span<const std::string_view> fields,
                                         std::size_t max_value_size) {
  if (fields.empty()) return fail(ErrorCode::kInvalidArgument, "missing length");
  SetArguments out;
  auto length = parse_decimal(fields[0], "length");
  if (!length) return fail(std::move(length).error());
  if (*length > max_value_size) {
    return fail(ErrorCode::kInvalidArgument,
                "length " + std::to_string(*length) + " exceeds max-value-size " +
                    std::to_string(max_value_size));
  }
  out.length = *length;
  fields = fields.subspan(1);
  DMA_TRY_ASSIGN(const ParsedOptions options, parse_write_options(fields, /*allow_get=*/false));
  out.options = options.options;
  fields = fields.subspan(options.consumed);
  auto regions = parse_regions(fields);
  if (!regions) return fail(std::move(regions).error());
  if (regions->capacity < out.length) {
    return fail(ErrorCode::kInvalidArgument,
                "regions hold " + std::to_string(regions->capacity) + " bytes, fewer than the " +
                    std::to_string(out.length) + " to read");
  }
  out.regions = std::move(*regions);
  return out;
}

Result<WriteOptions> parse_setplain_options(std::span<const std::string_view> fields) {
  DMA_TRY_ASSIGN(const ParsedOptions options, parse_write_options(fields, /*allow_get=*/true));
  if (options.consumed != fields.size()) {
    return fail(ErrorCode::kInvalidArgument,
                "unknown option " + quote_for_log(fields[options.consumed], kMaxQuotedBytes) +
                    " after the value (expected CRC, EX, PX, EXAT, PXAT, KEEPTTL, NX, XX or GET)");
  }
  return options.options;
}

bool provider_pins_memory(std::string_view provider) noexcept {
  // "verbs;ofi_rxm", "verbs", "efa", "efa-direct": the first (core) provider decides.
  const std::string_view core = provider.substr(0, provider.find(';'));
  return core == "verbs" || core.starts_with("efa");
}

ForkSafety fork_safety(bool pins, std::optional<int> ibv_status) noexcept {
  if (!pins) return ForkSafety::kNotPinned;
  // enum ibv_fork_status { IBV_FORK_DISABLED, IBV_FORK_ENABLED, IBV_FORK_UNNEEDED }
  if (ibv_status == 2) return ForkSafety::kKernelCopies;
  if (ibv_status == 1) return ForkSafety::kDontFork;
  return ForkSafety::kUnsafe;
}

std::string_view fork_safety_name(ForkSafety safety) noexcept {
  switch (safety) {
    case ForkSafety::kNotPinned:
      return "not-pinned";
    case ForkSafety::kKernelCopies:
      return "kernel-copies";
    case ForkSafety::kDontFork:
      return "dontfork";
    case ForkSafety::kUnsafe:
      return "unsafe";
  }
  return "unsafe";
}

std::string fork_safety_advice(ForkSafety safety) {
  switch (safety) {
    case ForkSafety::kNotPinned:
      return "fork (BGSAVE, AOF rewrite, full resync) is ordinary copy-on-write: this provider "
             "pins no memory";
    case ForkSafety::kKernelCopies:
      return "fork is safe: the kernel copies the pinned arena into each child at fork (a fork "
             "costs a copy of the arena's pinned pages, up to arena-bytes)";
    case ForkSafety::kDontFork:
      return "libibverbs' fork support marks the arena MADV_DONTFORK: a BGSAVE, AOF rewrite or "
             "full resync child cannot read any value and dies; unset RDMAV_FORK_SAFE, "
             "IBV_FORK_SAFE and FI_EFA_FORK_SAFE and use Linux 5.13+ with rdma-core 35+";
    case ForkSafety::kUnsafe:
      return "fork is unsafe: the arena is pinned and the kernel does not copy pinned pages at "
             "fork, so a value stored while a BGSAVE or AOF rewrite child runs can be lost (and "
             "libfabric's efa provider aborts the server at fork); use Linux 5.13+ with "
             "rdma-core 35+, or run without BGSAVE, AOF rewrite and replicas";
  }
  return {};
}

Result<Nonce> make_nonce() {
  Nonce nonce{};
  std::size_t filled = 0;
  while (filled < nonce.size()) {
    // getrandom(2): up to 256 bytes from the urandom source never return short once the pool is
    // initialised, but EINTR is possible before that; loop either way.
    const ssize_t got = ::getrandom(nonce.data() + filled, nonce.size() - filled, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      return fail(ErrorCode::kResourceExhausted,
                  std::string("getrandom failed, no nonce for the hello: ") + std::strerror(errno));
    }
    filled += static_cast<std::size_t>(got);
  }
  return nonce;
}

bool matches_nonce(std::span<const std::byte> read, const Nonce& nonce) noexcept {
  if (read.size() != nonce.size()) return false;
  // No early exit: the time taken must not say how many leading bytes were right.
  unsigned difference = 0;
  for (std::size_t index = 0; index < nonce.size(); ++index) {
    difference |= std::to_integer<unsigned>(read[index]) ^ nonce[index];
  }
  return difference == 0;
}

Status Sessions::open(std::uint64_t client_id, const Nonce& nonce, std::uint64_t generation) {
  if (sessions_.contains(client_id)) {
    return fail(ErrorCode::kInvalidArgument,
                "this connection already has a session (one DMA.HELLO per connection)");
  }
  sessions_.emplace(client_id, Session{Stage::kAwaitingProof, nonce, generation});
  return {};
}

bool Sessions::stale(std::uint64_t client_id, std::uint64_t current) const {
  const auto found = sessions_.find(client_id);
  return found != sessions_.end() && found->second.generation != current;
}

Status Sessions::check_proven(std::uint64_t client_id) const {
  const auto found = sessions_.find(client_id);
  if (found == sessions_.end()) {
    return fail(ErrorCode::kNotFound,
                "no session on this connection: send DMA.HELLO <client-address-hex> first");
  }
  if (found->second.stage != Stage::kProven) {
    return fail(ErrorCode::kInvalidArgument,
                "session not proven: write DMA.HELLO's nonce into memory exposed on the "
                "advertised address and send DMA.PROVE <rkey> <addr> <len> first");
  }
  return {};
}

Result<Nonce> Sessions::begin_proof(std::uint64_t client_id) {
  const auto found = sessions_.find(client_id);
  if (found == sessions_.end()) {
    return fail(ErrorCode::kNotFound,
                "no session to prove on this connection: send DMA.HELLO <client-address-hex> "
                "first");
  }
  if (found->second.stage == Stage::kProven) {
    return fail(ErrorCode::kInvalidArgument, "this session is already proven");
  }
  if (found->second.stage == Stage::kProving) {
    return fail(ErrorCode::kInvalidArgument, "a proof of this session is already running");
  }
  found->second.stage = Stage::kProving;
  return found->second.nonce;
}

Status Sessions::finish_proof(std::uint64_t client_id, std::span<const std::byte> read) {
  const auto found = sessions_.find(client_id);
  if (found == sessions_.end() || found->second.stage != Stage::kProving) {
    return fail(ErrorCode::kInvalidArgument, "proof refused: no proof of this session is running");
  }
  if (!matches_nonce(read, found->second.nonce)) {
    sessions_.erase(found);
    return fail(ErrorCode::kInvalidArgument,
                "proof refused: the bytes read from the advertised address are not this "
                "session's nonce; the session is closed (say DMA.HELLO again)");
  }
  found->second.stage = Stage::kProven;
  ++proven_;
  return {};
}

bool Sessions::close(std::uint64_t client_id) {
  const auto found = sessions_.find(client_id);
  if (found == sessions_.end()) return false;
  if (found->second.stage == Stage::kProven) --proven_;
  sessions_.erase(found);
  return true;
}

std::string error_reply(const Error& error) {
  std::string text = "ERR " + error.describe();
  std::replace(text.begin(), text.end(), '\r', ' ');
  std::replace(text.begin(), text.end(), '\n', ' ');
  return text;
}

}  // namespace dma::module
