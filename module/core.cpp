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
  if (!fields.empty() && equals_ignoring_case(fields[0], "CRC")) {
    if (fields.size() < 2) return fail(ErrorCode::kInvalidArgument, "CRC needs a value");
    auto crc = parse_crc(fields[1]);
    if (!crc) return fail(std::move(crc).error());
    out.crc = *crc;
    fields = fields.subspan(2);
  }
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

Status Sessions::open(std::uint64_t client_id, const Nonce& nonce) {
  if (sessions_.contains(client_id)) {
    return fail(ErrorCode::kInvalidArgument,
                "this connection already has a session (one DMA.HELLO per connection)");
  }
  sessions_.emplace(client_id, Session{Stage::kAwaitingProof, nonce});
  return {};
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
