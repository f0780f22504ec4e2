// DMA.GET, DMA.SET and their plain-RESP counterparts DMA.GETPLAIN and DMA.SETPLAIN (for
// clients without a fabric; replication, the AOF and its rewrite carry writes as DMA.SETPLAIN).
//
// A stored value (a `dma-value`, store/arena.hpp) is sent straight from its block, its transfer
// holding a reference, so DEL, overwrite or expiry meanwhile frees the block only after the
// write. A DMA.SET reads into a fresh block that replaces the key's value only after the read
// completed, its CRC32C matched, and NX/XX still hold; on any failure the key is untouched. The
// write itself (TTL, WATCH, keyspace events, replication) is write.hpp's.
#include <algorithm>
#include <cstring>
#include <optional>
#include <string>

#include "blocking.hpp"
#include "commands.hpp"
#include "dma/protocol.hpp"
#include "keys.hpp"
#include "state.hpp"
#include "write.hpp"

namespace dma::module {
namespace {

// DMA.GET's and DMA.SET's reply once the transfer is done. A SET's block becomes the key's value
// here, on the main thread, only if the read succeeded and the CRC matches.
int reply_transfer(RedisModuleCtx* ctx, RedisModuleString** /*argv*/, int /*argc*/) {
  auto* context = static_cast<TransferContext*>(RedisModule_GetBlockedClientPrivateData(ctx));
  const Outcome& outcome = *context->outcome;
  if (!outcome) return reply_error(ctx, outcome.error());
  store::Block& block = context->block();
  const std::size_t length = block.length();
  const std::uint32_t crc = context->crc_known() ? block.crc()
                            : outcome->checksum   ? *outcome->checksum
                                                  : crc32c(block.bytes());
  if (context->kind() == TransferContext::Kind::kSet) {
    if (context->expected_crc() && *context->expected_crc() != crc) {
      state->counters.errors.fetch_add(1, std::memory_order_relaxed);
      return reply_error(ctx, ErrorCode::kCorrupted,
                         "CRC32C mismatch: the client said " +
                             std::to_string(*context->expected_crc()) + ", the bytes read have " +
                             std::to_string(crc) + "; the key is unchanged");
    }
    block.set_crc(crc);
    const OwnedString name(ctx, context->key());
    if (auto refusal = refusal_to_write_now(ctx, name.get())) {
      state->counters.writes_refused_late.fetch_add(1, std::memory_order_relaxed);
      return RedisModule_ReplyWithError(ctx, refusal->c_str());
    }
    auto written = write_value(ctx, name.get(), block, context->options());
    if (!written) return reply_error(ctx, written.error());
    // NX/XX no longer hold (the key was created or deleted while the read was in flight): the
    // same nil a DMA.SET refused up front answers, and the bytes read are dropped.
    if (*written == Written::kSkipped) return RedisModule_ReplyWithNull(ctx);
  }
  return reply_length_and_crc(ctx, length, crc);
}

// Writes that arrive from the master or the AOF were accepted where they were first made: a
// replica or a restart applies them whatever its own max-value-size (arena-bytes still bounds
// them, and a refusal is logged, since nobody reads the reply).
bool replayed(RedisModuleCtx* ctx) {
  return (RedisModule_GetContextFlags(ctx) &
          (REDISMODULE_CTX_FLAGS_REPLICATED | REDISMODULE_CTX_FLAGS_LOADING)) != 0;
}

// A relative TTL that overflows is refused before anything else happens (as SET does).
Status check_expiry(const Expiry& expiry) {
  if (expiry.kind != Expiry::Kind::kRelative) return {};
  DMA_TRY(expiry_deadline(expiry, RedisModule_Milliseconds()));
  return {};
}

}  // namespace

// DMA.GET <key> [INLINE <max>] [<rkey> <addr> <len> ...]  (core.hpp, GetArguments)
// With INLINE, a value of at most <max> bytes (and inline-max) is answered in the reply,
// [length, crc32c, bytes], with no transfer. Otherwise a stored value goes straight from its
// block with its recorded CRC and a plain string is copied into the arena first (the key may
// change or vanish while the write is on the wire); [length, crc32c] once it has landed. With
// INLINE and no regions, a larger value is answered [length, crc32c] and nothing moves.
int get_command(RedisModuleCtx* ctx, RedisModuleString** argv, int argc) {
  // <key> INLINE <max> [triples] or <key> <one or more triples>.
  const bool asks_inline = argc >= 4 && equals_ignoring_case(view_of(argv[2]), "INLINE");
  if (asks_inline ? (argc - 4) % 3 != 0 : argc < 5 || (argc - 2) % 3 != 0) {
    return RedisModule_WrongArity(ctx);
  }
  const std::uint64_t client_id = RedisModule_GetClientId(ctx);
  if (rehello_if_stale(ctx, client_id)) return REDISMODULE_OK;
  if (Status proven = state->sessions.check_proven(client_id); !proven) {
    return reply_error(ctx, proven.error());
  }
  const auto fields = fields_of(argv, 2, argc);
  auto arguments = parse_get_arguments(fields);
  if (!arguments) return reply_error(ctx, arguments.error());
  // Without INLINE the command always transfers: refused in MULTI whatever the key holds.
  if (!arguments->inline_max && !may_block(ctx)) return REDISMODULE_OK;

  HeldValue held = held_by(open_key(ctx, argv[1], REDISMODULE_READ).get());
  if (held.kind == HeldValue::Kind::kMissing) return RedisModule_ReplyWithNull(ctx);
  if (held.kind == HeldValue::Kind::kOtherType) {
    return RedisModule_ReplyWithError(ctx, REDISMODULE_ERRORMSG_WRONGTYPE);
  }
  const bool crc_known = held.kind == HeldValue::Kind::kStored;
  const std::span<const std::byte> bytes = crc_known ? held.stored.bytes() : held.text;
  const std::size_t length = bytes.size();
  if (arguments->inline_max) {
    const std::uint64_t most = std::min<std::uint64_t>(*arguments->inline_max,
                                                        state->options.inline_max);
    const bool fits = length <= most;
    if (fits || arguments->regions.regions.empty()) {
      const std::uint32_t crc = crc_known ? held.stored.crc() : crc32c(bytes);
      RedisModule_ReplyWithArray(ctx, fits ? 3 : 2);
      RedisModule_ReplyWithLongLong(ctx, static_cast<long long>(length));
      RedisModule_ReplyWithLongLong(ctx, static_cast<long long>(crc));
      if (!fits) return REDISMODULE_OK;
      state->counters.inline_gets.fetch_add(1, std::memory_order_relaxed);
      state->counters.bytes_to_clients.fetch_add(length, std::memory_order_relaxed);
      return RedisModule_ReplyWithStringBuffer(ctx, reinterpret_cast<const char*>(bytes.data()),
                                               length);
    }
  }
  if (length > arguments->regions.capacity) {
    return reply_error(ctx, ErrorCode::kInvalidArgument,
                       "regions hold " + std::to_string(arguments->regions.capacity) +
                           " bytes, fewer than the value's " + std::to_string(length));
  }
  if (arguments->inline_max && !may_block(ctx)) return REDISMODULE_OK;
  store::Block block = std::move(held.stored);
  if (!crc_known) {
    auto copy = state->arena->allocate(length);
    if (!copy) return reply_error(ctx, copy.error());
    if (length != 0) std::memcpy(copy->data(), bytes.data(), length);
    block = std::move(*copy);
    state->counters.plain_string_copies.fetch_add(1, std::memory_order_relaxed);
  }
  TransferRequest request;
  request.client_id = client_id;
  request.regions = std::move(arguments->regions.regions);
  request.direction = Direction::kToPeer;
  request.want_checksum = !crc_known;
  return block_and_submit(ctx, TransferContext::for_get(std::move(block), crc_known),
                          std::move(request), reply_transfer);
}

// DMA.SET <key> <length> [CRC <c>] [EX s|PX ms|EXAT s|PXAT ms|KEEPTTL] [NX|XX]
//         <rkey> <addr> <len> [...]
// Reads into a fresh block; the key changes only in reply_transfer, after the read and the CRC.
// NX/XX are decided here, before any read (nil if they do not hold), and again there.
int set_command(RedisModuleCtx* ctx, RedisModuleString** argv, int argc) {
  if (argc < 6) return RedisModule_WrongArity(ctx);
  const std::uint64_t client_id = RedisModule_GetClientId(ctx);
  if (!ready_to_transfer(ctx, client_id)) return REDISMODULE_OK;
  const auto fields = fields_of(argv, 2, argc);
  auto arguments = parse_set_arguments(fields, state->options.max_value_size);
  if (!arguments) return reply_error(ctx, arguments.error());
  if (Status valid = check_expiry(arguments->options.expiry); !valid) {
    return reply_error(ctx, valid.error());
  }
  if (!condition_holds_now(ctx, arguments->options.condition, argv[1])) {
    state->counters.conditions_failed.fetch_add(1, std::memory_order_relaxed);
    return RedisModule_ReplyWithNull(ctx);
  }
  auto landing = state->arena->allocate(arguments->length);
  if (!landing) {
    state->counters.errors.fetch_add(1, std::memory_order_relaxed);
    return reply_error(ctx, landing.error());
  }
  auto context = TransferContext::for_set(view_of(argv[1]), std::move(*landing),
                                          arguments->options);
  TransferRequest request;
  request.client_id = client_id;
  request.regions = std::move(arguments->regions.regions);
  request.direction = Direction::kFromPeer;
  request.length = arguments->length;
  request.want_checksum = true;
  return block_and_submit(ctx, std::move(context), std::move(request), reply_transfer);
}

// DMA.GETPLAIN <key>  ->  the value's bytes (a stored value or a plain string), or nil: for
// clients without a fabric.
int getplain_command(RedisModuleCtx* ctx, RedisModuleString** argv, int argc) {
  if (argc != 2) return RedisModule_WrongArity(ctx);
  OpenedKey key = open_key(ctx, argv[1], REDISMODULE_READ);
  const HeldValue held = held_by(key.get());
  state->counters.plain_gets.fetch_add(1, std::memory_order_relaxed);
  switch (held.kind) {
    case HeldValue::Kind::kMissing:
      return RedisModule_ReplyWithNull(ctx);
    case HeldValue::Kind::kOtherType:
      return RedisModule_ReplyWithError(ctx, REDISMODULE_ERRORMSG_WRONGTYPE);
    case HeldValue::Kind::kStored:
      return RedisModule_ReplyWithStringBuffer(
          ctx, reinterpret_cast<const char*>(held.stored.data()), held.stored.length());
    case HeldValue::Kind::kString:
      return RedisModule_ReplyWithStringBuffer(
          ctx, reinterpret_cast<const char*>(held.text.data()), held.text.size());
  }
  return REDISMODULE_OK;
}

// DMA.SETPLAIN <key> <value> [CRC <c>] [EX s|PX ms|EXAT s|PXAT ms|KEEPTTL] [NX|XX] [GET]
//   ->  [length, crc32c], or nil if NX/XX did not hold; with GET, the old value (or nil).
// Stores a value as DMA.SET does, its bytes carried in the command (clients without a fabric;
// replication and the AOF carry every write this way). With CRC, bytes that do not match are
// refused and the key is untouched.
int setplain_command(RedisModuleCtx* ctx, RedisModuleString** argv, int argc) {
  if (argc < 3) return RedisModule_WrongArity(ctx);
  const std::string_view value = view_of(argv[2]);
  const bool from_elsewhere = replayed(ctx);
  auto refuse = [&](const Error& error) {
    state->counters.errors.fetch_add(1, std::memory_order_relaxed);
    if (from_elsewhere) {
      RedisModule_Log(ctx, "warning", "dma: a replicated or replayed DMA.SETPLAIN was refused: %s",
                      error.describe().c_str());
    }
    return reply_error(ctx, error);
  };
  auto options = parse_setplain_options(fields_of(argv, 3, argc));
  if (!options) return refuse(options.error());
  if (Status valid = check_expiry(options->expiry); !valid) return refuse(valid.error());
  if (value.size() > state->options.max_value_size && !from_elsewhere) {
    return refuse(Error(ErrorCode::kInvalidArgument,
                        "length " + std::to_string(value.size()) + " exceeds max-value-size " +
                            std::to_string(state->options.max_value_size)));
  }
  // GET: the old value, kept (a reference on its block, a copy of a string) across the write.
  HeldValue old;
  std::string old_text;
  if (options->get) {
    old = held_by(open_key(ctx, argv[1], REDISMODULE_READ).get());
    if (old.kind == HeldValue::Kind::kOtherType) {
      return RedisModule_ReplyWithError(ctx, REDISMODULE_ERRORMSG_WRONGTYPE);
    }
    if (old.kind == HeldValue::Kind::kString) {
      old_text.assign(reinterpret_cast<const char*>(old.text.data()), old.text.size());
    }
  }
  auto reply_old_value = [&]() {
    switch (old.kind) {
      case HeldValue::Kind::kStored:
        return RedisModule_ReplyWithStringBuffer(
            ctx, reinterpret_cast<const char*>(old.stored.data()), old.stored.length());
      case HeldValue::Kind::kString:
        return RedisModule_ReplyWithStringBuffer(ctx, old_text.data(), old_text.size());
      default:
        return RedisModule_ReplyWithNull(ctx);
    }
  };
  if (!condition_holds_now(ctx, options->condition, argv[1])) {
    state->counters.conditions_failed.fetch_add(1, std::memory_order_relaxed);
    return options->get ? reply_old_value() : RedisModule_ReplyWithNull(ctx);
  }
  auto block = state->arena->copy_of(std::as_bytes(std::span(value.data(), value.size())));
  if (!block) return refuse(block.error());
  if (options->crc && *options->crc != block->crc()) {
    return refuse(Error(ErrorCode::kCorrupted,
                        "CRC32C mismatch: the client said " + std::to_string(*options->crc) +
                            ", the bytes have " + std::to_string(block->crc()) +
                            "; the key is unchanged"));
  }
  // Already in the form the write is replicated in (write.hpp): handed on as it came.
  const bool replicable_as_sent = argc == 5 && options->crc &&
                                  options->expiry.kind == Expiry::Kind::kClear &&
                                  options->condition == Condition::kAlways && !options->get;
  auto written = write_value(ctx, argv[1], *block, *options, argv[2], replicable_as_sent);
  if (!written) return refuse(written.error());
  state->counters.plain_sets.fetch_add(1, std::memory_order_relaxed);
  state->counters.bytes_from_clients.fetch_add(value.size(), std::memory_order_relaxed);
  if (options->get) return reply_old_value();
  if (*written == Written::kSkipped) return RedisModule_ReplyWithNull(ctx);
  return reply_length_and_crc(ctx, block->length(), block->crc());
}

}  // namespace dma::module
