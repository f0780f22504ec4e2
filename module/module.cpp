// The Redis/Valkey module: DMA.HELLO, DMA.PROVE, DMA.GET, DMA.SET, DMA.GETPLAIN, DMA.SETPLAIN,
// DMA.INFO, the `INFO dma` section, and the `dma-value` data type DMA.SET stores.
//
// Values (store/arena.hpp, transfer.hpp): DMA.SET and DMA.SETPLAIN store a `dma-value`, a
// reference on a block of the value store's arena, which is registered once on every service
// at load. DMA.GET sends straight from that block (its transfer holds a reference, so DEL,
// overwrite or expiry meanwhile frees the block only after the write); DMA.SET reads into a
// fresh block that replaces the key's value only after the read completed and its CRC32C
// matched. Each value records its length and CRC32C; RDB save/load and AOF rewrite keep both.
//
// Threads: every command, reply callback and server event runs on the server's main thread,
// which owns the session set. The fabric workers (and CRC pool threads) only run the batch
// completer, which records the outcome in the transfer's context and hands it back with
// RedisModule_UnblockClient (documented thread-safe). The main thread never waits on a transfer:
// a DMA.GET/SET/PROVE blocks only its own client. DMA.HELLO waits for the workers to insert the
// client's address (a local address-vector insert, no network round trip), so a bad address
// fails the hello instead of the first transfer.
//
// Sessions (core.hpp, Sessions): DMA.HELLO opens an unproven session and hands out a nonce;
// DMA.PROVE reads the nonce back from the advertised address and only a match lets the
// connection transfer. Nothing is ever written to an address before its session is proven.
//
// Lifetimes: a TransferContext is owned by the service while the transfer runs, then by the
// server as the blocked client's private data; free_context (the free-privdata callback) deletes
// it whether the client is still there, timed out or disconnected. The server never registers
// memory for remote access: the arena is registered for local access only.
//
// Shutdown: on the server's shutdown event the services are stopped (in-flight transfers finish
// or fail, workers joined) before the server exits, so no worker is inside libfabric while the
// process runs its exit-time destructors (libfabric's fi_fini among them).
#include <dlfcn.h>
#include <signal.h>

#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core.hpp"
#include "dma/memory.hpp"
#include "dma/protocol.hpp"
#include "dma/service.hpp"
#include "redis_module_api.h"
#include "store/arena.hpp"
#include "transfer.hpp"

namespace dma::module {
namespace {

// The module's state, created at load. Deliberately never destroyed at process exit: the
// workers may still be running completions then, and the server is going away anyway. MODULE
// UNLOAD destroys it only when nothing is in flight and no session is open.
struct State {
  ModuleOptions options;
  Counters counters;
  // Declared before the services: their endpoints close (and drop the arena's registrations)
  // before the arena unmaps.
  std::unique_ptr<store::Arena> arena;
  std::unique_ptr<ServiceSet> services;  // null once the server is shutting down
  Sessions sessions;                     // main thread only
  RedisModuleType* value_type = nullptr;
  // registrations_made() once the arena was registered: what transfers add is counted after.
  std::uint64_t registrations_at_load = 0;
  std::atomic<std::uint64_t> transfers{0};  // submitted DMA.GET/SET/PROVE transfers
};
State* state = nullptr;

// The `dma-value` type's RDB encoding: <length> <crc32c> <bytes>.
constexpr int kValueEncoding = 1;

// ---- RAII over the server's handles ----------------------------------------------------------

struct KeyCloser {
  void operator()(RedisModuleKey* key) const noexcept { RedisModule_CloseKey(key); }
};
using OpenedKey = std::unique_ptr<RedisModuleKey, KeyCloser>;

OpenedKey open_key(RedisModuleCtx* ctx, RedisModuleString* name, int mode) {
  return OpenedKey(static_cast<RedisModuleKey*>(RedisModule_OpenKey(ctx, name, mode)));
}

// A string the module created, freed with the context it was made in.
class OwnedString {
 public:
  OwnedString(RedisModuleCtx* ctx, std::string_view text)
      : ctx_(ctx), string_(RedisModule_CreateString(ctx, text.data(), text.size())) {}
  ~OwnedString() { RedisModule_FreeString(ctx_, string_); }
  OwnedString(const OwnedString&) = delete;
  OwnedString& operator=(const OwnedString&) = delete;
  RedisModuleString* get() const noexcept { return string_; }

 private:
  RedisModuleCtx* ctx_;
  RedisModuleString* string_;
};

// What a key holds, for the commands that read values.
struct HeldValue {
  enum class Kind : std::uint8_t { kMissing, kStored, kString, kOtherType };
  Kind kind = Kind::kMissing;
  store::Block stored;              // kStored: a reference on the key's block
  std::span<const std::byte> text;  // kString: the string's bytes, valid while the key is open
};

HeldValue held_by(RedisModuleKey* key) {
  HeldValue held;
  if (key == nullptr || RedisModule_KeyType(key) == REDISMODULE_KEYTYPE_EMPTY) return held;
  const int type = RedisModule_KeyType(key);
  if (type == REDISMODULE_KEYTYPE_MODULE && RedisModule_ModuleTypeGetType(key) == state->value_type) {
    held.kind = HeldValue::Kind::kStored;
    held.stored = store::Block::share(RedisModule_ModuleTypeGetValue(key));
  } else if (type == REDISMODULE_KEYTYPE_STRING) {
    held.kind = HeldValue::Kind::kString;
    std::size_t length = 0;
    const char* bytes = RedisModule_StringDMA(key, &length, REDISMODULE_READ);
    held.text = std::as_bytes(std::span<const char>(bytes == nullptr ? "" : bytes, length));
  } else {
    held.kind = HeldValue::Kind::kOtherType;
  }
  return held;
}

// Makes `block` the value of `name` (a new reference for the key; whatever it held goes, its
// expiry with it, as with SET).
Status store_value(RedisModuleCtx* ctx, RedisModuleString* name, const store::Block& block) {
  OpenedKey key = open_key(ctx, name, REDISMODULE_WRITE);
  store::Block for_key = block;
  void* opaque = for_key.release_to_opaque();
  if (!key || RedisModule_ModuleTypeSetValue(key.get(), state->value_type, opaque) !=
                  REDISMODULE_OK) {
    (void)store::Block::adopt(opaque);
    return fail(ErrorCode::kInvalidArgument, "could not store the value");
  }
  return {};
}

std::string_view view_of(RedisModuleString* string) {
  std::size_t length = 0;
  const char* data = RedisModule_StringPtrLen(string, &length);
  return {data, length};
}

int reply_error(RedisModuleCtx* ctx, const Error& error) {
  const std::string text = error_reply(error);
  return RedisModule_ReplyWithError(ctx, text.c_str());
}

int reply_error(RedisModuleCtx* ctx, ErrorCode code, std::string message) {
  return reply_error(ctx, Error(code, std::move(message)));
}

void publish_session_count() {
  state->counters.sessions.store(state->sessions.size(), std::memory_order_relaxed);
}

// Refuses a blocking command inside MULTI or a script (it would never get its reply), and any
// transfer once the services have stopped for shutdown.
bool may_block(RedisModuleCtx* ctx) {
  if (!state->services) {
    reply_error(ctx, ErrorCode::kWorkerGone, "the server is shutting down");
    return false;
  }
  if (RedisModule_GetContextFlags(ctx) & REDISMODULE_CTX_FLAGS_DENY_BLOCKING) {
    reply_error(ctx, ErrorCode::kInvalidArgument,
                "DMA transfers block their client; they cannot run inside MULTI or a script");
    return false;
  }
  return true;
}

// Fails the command unless the connection has a proven session and may block.
bool ready_to_transfer(RedisModuleCtx* ctx, std::uint64_t client_id) {
  if (Status proven = state->sessions.check_proven(client_id); !proven) {
    reply_error(ctx, proven.error());
    return false;
  }
  return may_block(ctx);
}

// Ends a session whose proof failed: the peer goes (once its transfers drain) and the
// connection may say DMA.HELLO again.
void refuse_session(std::uint64_t client_id) {
  state->sessions.close(client_id);
  publish_session_count();
  state->counters.proofs_refused.fetch_add(1, std::memory_order_relaxed);
  if (state->services) state->services->remove_peer(client_id);
}

// ---- blocked-client callbacks (main thread) ------------------------------------------------

int reply_length_and_crc(RedisModuleCtx* ctx, std::size_t length, std::uint32_t crc) {
  RedisModule_ReplyWithArray(ctx, 2);
  RedisModule_ReplyWithLongLong(ctx, static_cast<long long>(length));
  RedisModule_ReplyWithLongLong(ctx, static_cast<long long>(crc));
  return REDISMODULE_OK;
}

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
    if (Status stored = store_value(ctx, name.get(), block); !stored) {
      return reply_error(ctx, stored.error());
    }
  }
  return reply_length_and_crc(ctx, length, crc);
}

int reply_timeout(RedisModuleCtx* ctx, RedisModuleString** /*argv*/, int /*argc*/) {
  state->counters.errors.fetch_add(1, std::memory_order_relaxed);
  return reply_error(ctx, ErrorCode::kTimedOut,
                     "the DMA transfer did not complete in time; for a SET the key is unchanged");
}

// DMA.PROVE's reply: the read landed (or failed); only the nonce, byte for byte, proves.
int reply_proof(RedisModuleCtx* ctx, RedisModuleString** /*argv*/, int /*argc*/) {
  auto* context = static_cast<TransferContext*>(RedisModule_GetBlockedClientPrivateData(ctx));
  const Outcome& outcome = *context->outcome;
  const std::uint64_t client_id = context->client_id();
  if (!outcome) {
    refuse_session(client_id);
    return reply_error(ctx, ErrorCode::kInvalidArgument,
                       "proof refused: could not read the nonce from the advertised address (" +
                           outcome.error().describe() +
                           "); the session is closed (say DMA.HELLO again)");
  }
  if (Status proven = state->sessions.finish_proof(client_id, context->bytes()); !proven) {
    refuse_session(client_id);
    return reply_error(ctx, proven.error());
  }
  return RedisModule_ReplyWithSimpleString(ctx, "OK");
}

void free_context(RedisModuleCtx* /*ctx*/, void* privdata) {
  delete static_cast<TransferContext*>(privdata);
}

// Runs on the worker thread when a transfer expires: the client gets its error now; the
// transfer's own context stays with the service until the provider lets go of its bytes.
void answer_expired(std::unique_ptr<TransferContext> answer) {
  state->counters.errors.fetch_add(1, std::memory_order_relaxed);
  state->counters.in_flight.fetch_sub(1, std::memory_order_relaxed);
  auto* blocked = static_cast<RedisModuleBlockedClient*>(answer->blocked);
  RedisModule_UnblockClient(blocked, answer.release());
}

// Runs on a worker or pool thread: hand each finished transfer back to its blocked client.
void complete_batch(std::span<Completion> batch) {
  for (Completion& completion : batch) {
    auto* context = static_cast<TransferContext*>(completion.context.release());
    if (context->blocked == nullptr) {
      // Expired and already answered (answer_expired); the provider has let go of its bytes.
      delete context;
      continue;
    }
    if (context->kind() == TransferContext::Kind::kProve) {
      // Counted by reply_proof (a refused proof), not as traffic.
    } else if (completion.outcome) {
      if (context->kind() == TransferContext::Kind::kGet) {
        state->counters.gets.fetch_add(1, std::memory_order_relaxed);
        state->counters.bytes_to_clients.fetch_add(completion.outcome->bytes,
                                                   std::memory_order_relaxed);
      } else {
        state->counters.sets.fetch_add(1, std::memory_order_relaxed);
        state->counters.bytes_from_clients.fetch_add(completion.outcome->bytes,
                                                     std::memory_order_relaxed);
      }
    } else {
      state->counters.errors.fetch_add(1, std::memory_order_relaxed);
    }
    context->outcome = std::move(completion.outcome);
    state->counters.record_latency(static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() -
                                                              context->started)
            .count()));
    state->counters.in_flight.fetch_sub(1, std::memory_order_relaxed);
    RedisModule_UnblockClient(static_cast<RedisModuleBlockedClient*>(context->blocked), context);
  }
}

// Blocks the client and submits; the reply comes from `reply` (reply_transfer or reply_proof)
// once the transfer is done.
int block_and_submit(RedisModuleCtx* ctx, std::unique_ptr<TransferContext> context,
                     TransferRequest request, RedisModuleCmdFunc reply = reply_transfer) {
  const Configuration& configuration = state->options.configuration;
  // A safety net only: the service fails every transfer by its own deadlines first.
  const long long timeout_ms = 30000 + configuration.progress_deadline.count() +
                               configuration.completion_deadline.count();
  RedisModuleBlockedClient* blocked =
      RedisModule_BlockClient(ctx, reply, reply_timeout, free_context, timeout_ms);
  context->blocked = blocked;
  context->answer_early = answer_expired;
  TransferContext* raw = context.get();
  request.context = std::move(context);
  state->counters.in_flight.fetch_add(1, std::memory_order_relaxed);
  state->transfers.fetch_add(1, std::memory_order_relaxed);
  if (Status submitted = state->services->submit(std::move(request)); !submitted) {
    // The request is left untouched on failure: its context comes back to us.
    state->counters.in_flight.fetch_sub(1, std::memory_order_relaxed);
    state->counters.errors.fetch_add(1, std::memory_order_relaxed);
    request.context.release();
    raw->outcome = Outcome(fail(std::move(submitted).error()));
    RedisModule_UnblockClient(blocked, raw);
  }
  return REDISMODULE_OK;
}

std::vector<std::string_view> fields_of(RedisModuleString** argv, int from, int argc) {
  std::vector<std::string_view> fields;
  fields.reserve(static_cast<std::size_t>(argc - from));
  for (int index = from; index < argc; ++index) fields.push_back(view_of(argv[index]));
  return fields;
}

// ---- commands (main thread) ------------------------------------------------------------------

// DMA.HELLO <client-address-hex>  ->  [<nonce-hex>, [<server-endpoint-address-hex>, ...]]
// Opens an unproven session for this connection and adds the address as its peer.
int hello_command(RedisModuleCtx* ctx, RedisModuleString** argv, int argc) {
  if (argc != 2) return RedisModule_WrongArity(ctx);
  const std::uint64_t client_id = RedisModule_GetClientId(ctx);
  if (state->sessions.contains(client_id)) {
    return reply_error(ctx, ErrorCode::kInvalidArgument,
                       "this connection already has a session (one DMA.HELLO per connection)");
  }
  auto address = hex_decode(view_of(argv[1]));
  if (!address) return reply_error(ctx, address.error());
  if (address->empty()) return reply_error(ctx, ErrorCode::kInvalidArgument, "empty address");
  if (!state->services) return reply_error(ctx, ErrorCode::kWorkerGone, "the server is shutting down");
  auto nonce = make_nonce();
  if (!nonce) return reply_error(ctx, nonce.error());
  if (Status added = state->services->add_peer(client_id, *address); !added) {
    return reply_error(ctx, added.error());
  }
  if (Status opened = state->sessions.open(client_id, *nonce); !opened) {
    state->services->remove_peer(client_id);
    return reply_error(ctx, opened.error());
  }
  publish_session_count();
  const std::string nonce_hex = hex_encode(*nonce);
  const auto addresses = state->services->local_addresses();
  RedisModule_ReplyWithArray(ctx, 2);
  RedisModule_ReplyWithStringBuffer(ctx, nonce_hex.data(), nonce_hex.size());
  RedisModule_ReplyWithArray(ctx, static_cast<long>(addresses.size()));
  for (const auto& bytes : addresses) {
    const std::string hex = hex_encode(bytes);
    RedisModule_ReplyWithStringBuffer(ctx, hex.data(), hex.size());
  }
  return REDISMODULE_OK;
}

// DMA.PROVE <rkey> <addr> <len>  ->  OK once the server has read the nonce back from there.
// One attempt per hello: any failure after the session is found ends the session and removes
// the peer; the connection may then say DMA.HELLO again (and gets a new nonce).
int prove_command(RedisModuleCtx* ctx, RedisModuleString** argv, int argc) {
  if (argc != 4) return RedisModule_WrongArity(ctx);
  const std::uint64_t client_id = RedisModule_GetClientId(ctx);
  if (!may_block(ctx)) return REDISMODULE_OK;
  if (auto started = state->sessions.begin_proof(client_id); !started) {
    return reply_error(ctx, started.error());
  }
  const auto fields = fields_of(argv, 1, argc);
  auto regions = parse_regions(fields);
  if (!regions || regions->capacity != kNonceBytes) {
    refuse_session(client_id);
    return reply_error(ctx, ErrorCode::kInvalidArgument,
                       "proof refused: " +
                           (regions ? "the proof is the nonce's " + std::to_string(kNonceBytes) +
                                          " bytes, not " + std::to_string(regions->capacity)
                                    : regions.error().message()) +
                           "; the session is closed (say DMA.HELLO again)");
  }
  auto landing = state->arena->allocate(kNonceBytes);
  if (!landing) {
    refuse_session(client_id);
    return reply_error(ctx, landing.error());
  }
  TransferRequest request;
  request.client_id = client_id;
  request.regions = std::move(regions->regions);
  request.direction = Direction::kFromPeer;
  request.length = kNonceBytes;
  return block_and_submit(ctx, TransferContext::for_proof(client_id, std::move(*landing)),
                          std::move(request), reply_proof);
}

// DMA.GET <key> <rkey> <addr> <len> [<rkey> <addr> <len> ...]
// A stored value goes straight from its block with its recorded CRC; a plain string is copied
// into the arena first (the key may change or vanish while the write is on the wire).
int get_command(RedisModuleCtx* ctx, RedisModuleString** argv, int argc) {
  if (argc < 5 || (argc - 2) % 3 != 0) return RedisModule_WrongArity(ctx);
  const std::uint64_t client_id = RedisModule_GetClientId(ctx);
  if (!ready_to_transfer(ctx, client_id)) return REDISMODULE_OK;
  const auto fields = fields_of(argv, 2, argc);
  auto regions = parse_regions(fields);
  if (!regions) return reply_error(ctx, regions.error());

  HeldValue held = held_by(open_key(ctx, argv[1], REDISMODULE_READ).get());
  if (held.kind == HeldValue::Kind::kMissing) return RedisModule_ReplyWithNull(ctx);
  if (held.kind == HeldValue::Kind::kOtherType) {
    return RedisModule_ReplyWithError(ctx, REDISMODULE_ERRORMSG_WRONGTYPE);
  }
  const std::size_t length =
      held.kind == HeldValue::Kind::kStored ? held.stored.length() : held.text.size();
  if (length > regions->capacity) {
    return reply_error(ctx, ErrorCode::kInvalidArgument,
                       "regions hold " + std::to_string(regions->capacity) +
                           " bytes, fewer than the value's " + std::to_string(length));
  }
  const bool crc_known = held.kind == HeldValue::Kind::kStored;
  store::Block block = std::move(held.stored);
  if (!crc_known) {
    auto copy = state->arena->allocate(length);
    if (!copy) return reply_error(ctx, copy.error());
    if (length != 0) std::memcpy(copy->data(), held.text.data(), length);
    block = std::move(*copy);
    state->counters.plain_string_copies.fetch_add(1, std::memory_order_relaxed);
  }
  TransferRequest request;
  request.client_id = client_id;
  request.regions = std::move(regions->regions);
  request.direction = Direction::kToPeer;
  request.want_checksum = !crc_known;
  return block_and_submit(ctx, TransferContext::for_get(std::move(block), crc_known),
                          std::move(request));
}

// DMA.SET <key> <length> [CRC <crc32c>] <rkey> <addr> <len> [...]
// Reads into a fresh block; the key changes only in reply_transfer, after the read and the CRC.
int set_command(RedisModuleCtx* ctx, RedisModuleString** argv, int argc) {
  if (argc < 6) return RedisModule_WrongArity(ctx);
  const std::uint64_t client_id = RedisModule_GetClientId(ctx);
  if (!ready_to_transfer(ctx, client_id)) return REDISMODULE_OK;
  const auto fields = fields_of(argv, 2, argc);
  auto arguments = parse_set_arguments(fields, state->options.max_value_size);
  if (!arguments) return reply_error(ctx, arguments.error());
  auto landing = state->arena->allocate(arguments->length);
  if (!landing) {
    state->counters.errors.fetch_add(1, std::memory_order_relaxed);
    return reply_error(ctx, landing.error());
  }
  auto context = TransferContext::for_set(std::string(view_of(argv[1])), std::move(*landing),
                                          arguments->crc);
  TransferRequest request;
  request.client_id = client_id;
  request.regions = std::move(arguments->regions.regions);
  request.direction = Direction::kFromPeer;
  request.length = arguments->length;
  request.want_checksum = true;
  return block_and_submit(ctx, std::move(context), std::move(request));
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

// DMA.SETPLAIN <key> <value> [CRC <crc32c>]  ->  [length, crc32c]: stores a value as DMA.SET
// does, its bytes carried in the command (clients without a fabric; AOF rewrite emits it).
// With CRC, bytes that do not match are refused and the key is untouched.
int setplain_command(RedisModuleCtx* ctx, RedisModuleString** argv, int argc) {
  if (argc != 3 && argc != 5) return RedisModule_WrongArity(ctx);
  const std::string_view value = view_of(argv[2]);
  if (value.size() > state->options.max_value_size) {
    return reply_error(ctx, ErrorCode::kInvalidArgument,
                       "length " + std::to_string(value.size()) + " exceeds max-value-size " +
                           std::to_string(state->options.max_value_size));
  }
  std::optional<std::uint32_t> expected;
  if (argc == 5) {
    if (!equals_ignoring_case(view_of(argv[3]), "CRC")) {
      return reply_error(ctx, ErrorCode::kInvalidArgument, "expected CRC <crc32c> after the value");
    }
    auto crc = parse_crc(view_of(argv[4]));
    if (!crc) return reply_error(ctx, crc.error());
    expected = *crc;
  }
  auto block = state->arena->copy_of(std::as_bytes(std::span(value.data(), value.size())));
  if (!block) {
    state->counters.errors.fetch_add(1, std::memory_order_relaxed);
    return reply_error(ctx, block.error());
  }
  if (expected && *expected != block->crc()) {
    state->counters.errors.fetch_add(1, std::memory_order_relaxed);
    return reply_error(ctx, ErrorCode::kCorrupted,
                       "CRC32C mismatch: the client said " + std::to_string(*expected) +
                           ", the bytes have " + std::to_string(block->crc()) +
                           "; the key is unchanged");
  }
  if (Status stored = store_value(ctx, argv[1], *block); !stored) {
    return reply_error(ctx, stored.error());
  }
  state->counters.plain_sets.fetch_add(1, std::memory_order_relaxed);
  return reply_length_and_crc(ctx, block->length(), block->crc());
}

void reply_counter(RedisModuleCtx* ctx, const char* name, std::uint64_t value) {
  RedisModule_ReplyWithStringBuffer(ctx, name, std::strlen(name));
  RedisModule_ReplyWithLongLong(ctx, static_cast<long long>(value));
}

// DMA.INFO: module counters, then one entry per endpoint.
int info_command(RedisModuleCtx* ctx, RedisModuleString** /*argv*/, int argc) {
  if (argc != 1) return RedisModule_WrongArity(ctx);
  const Counters& counters = state->counters;
  RedisModule_ReplyWithArray(ctx, 16);
  reply_counter(ctx, "sessions", state->sessions.size());
  reply_counter(ctx, "in_flight", counters.in_flight.load(std::memory_order_relaxed));
  reply_counter(ctx, "gets", counters.gets.load(std::memory_order_relaxed));
  reply_counter(ctx, "sets", counters.sets.load(std::memory_order_relaxed));
  reply_counter(ctx, "bytes_to_clients", counters.bytes_to_clients.load(std::memory_order_relaxed));
  reply_counter(ctx, "bytes_from_clients",
                counters.bytes_from_clients.load(std::memory_order_relaxed));
  reply_counter(ctx, "errors", counters.errors.load(std::memory_order_relaxed));
  RedisModule_ReplyWithStringBuffer(ctx, "endpoints", 9);
  const std::size_t endpoints = state->services ? state->services->size() : 0;
  RedisModule_ReplyWithArray(ctx, static_cast<long>(endpoints));
  for (std::size_t index = 0; index < endpoints; ++index) {
    FabricService& service = state->services->at(index);
    const ServiceCounters totals = service.counters();
    const std::string address = hex_encode(service.local_address());
    const std::string description = service.describe().to_string();
    RedisModule_ReplyWithArray(ctx, 20);
    RedisModule_ReplyWithStringBuffer(ctx, "address", 7);
    RedisModule_ReplyWithStringBuffer(ctx, address.data(), address.size());
    RedisModule_ReplyWithStringBuffer(ctx, "description", 11);
    RedisModule_ReplyWithStringBuffer(ctx, description.data(), description.size());
    reply_counter(ctx, "outstanding", service.outstanding());
    reply_counter(ctx, "submitted", totals.submitted);
    reply_counter(ctx, "completed", totals.completed);
    reply_counter(ctx, "failed", totals.failed);
    reply_counter(ctx, "bytes_to_peer", totals.bytes_to_peer);
    reply_counter(ctx, "bytes_from_peer", totals.bytes_from_peer);
    reply_counter(ctx, "eagain", totals.eagain);
    reply_counter(ctx, "expired", totals.expired);
  }
  return REDISMODULE_OK;
}

// ---- server hooks (main thread) ----------------------------------------------------------------

void on_client_change(RedisModuleCtx* /*ctx*/, RedisModuleEvent /*event*/, std::uint64_t subevent,
                      void* data) {
  if (subevent != REDISMODULE_SUBEVENT_CLIENT_CHANGE_DISCONNECTED || data == nullptr) return;
  const std::uint64_t client_id = static_cast<RedisModuleClientInfo*>(data)->id;
  if (!state->sessions.close(client_id)) return;
  publish_session_count();
  // The service releases the peer only after the transfers it already has for it finish.
  if (state->services) state->services->remove_peer(client_id);
}

// The server is about to exit (SHUTDOWN, SIGTERM): stop the workers now, while the process is
// whole. Transfers in flight finish or fail and their blocked clients are unblocked (their
// replies are never sent: the server exits next). Later commands cannot arrive.
void on_shutdown(RedisModuleCtx* ctx, RedisModuleEvent /*event*/, std::uint64_t /*subevent*/,
                 void* /*data*/) {
  if (!state->services) return;
  RedisModule_Log(ctx, "notice", "dma: stopping the fabric services (%llu transfers in flight)",
                  static_cast<unsigned long long>(
                      state->counters.in_flight.load(std::memory_order_relaxed)));
  state->services.reset();
  RedisModule_Log(ctx, "notice", "dma: fabric services stopped");
}

void on_info(RedisModuleInfoCtx* ctx, int /*for_crash_report*/) {
  const Counters& counters = state->counters;
  RedisModule_InfoAddSection(ctx, "");
  RedisModule_InfoAddFieldULongLong(ctx, "sessions",
                                    counters.sessions.load(std::memory_order_relaxed));
  RedisModule_InfoAddFieldULongLong(ctx, "sessions_proven", state->sessions.proven());
  RedisModule_InfoAddFieldULongLong(ctx, "proofs_refused",
                                    counters.proofs_refused.load(std::memory_order_relaxed));
  RedisModule_InfoAddFieldULongLong(ctx, "endpoints",
                                    state->services ? state->services->size() : 0);
  RedisModule_InfoAddFieldULongLong(ctx, "transfers_to_clients",
                                    counters.gets.load(std::memory_order_relaxed));
  RedisModule_InfoAddFieldULongLong(ctx, "transfers_from_clients",
                                    counters.sets.load(std::memory_order_relaxed));
  RedisModule_InfoAddFieldULongLong(ctx, "bytes_to_clients",
                                    counters.bytes_to_clients.load(std::memory_order_relaxed));
  RedisModule_InfoAddFieldULongLong(ctx, "bytes_from_clients",
                                    counters.bytes_from_clients.load(std::memory_order_relaxed));
  RedisModule_InfoAddFieldULongLong(ctx, "errors", counters.errors.load(std::memory_order_relaxed));
  RedisModule_InfoAddFieldULongLong(ctx, "in_flight",
                                    counters.in_flight.load(std::memory_order_relaxed));
  RedisModule_InfoAddFieldULongLong(ctx, "latency_avg_us", counters.latency_average_us());
  RedisModule_InfoAddFieldULongLong(ctx, "latency_max_us",
                                    counters.latency_max_us.load(std::memory_order_relaxed));
  const store::ArenaStats arena = state->arena->stats();
  RedisModule_InfoAddFieldULongLong(ctx, "arena_bytes_registered", arena.registered);
  RedisModule_InfoAddFieldULongLong(ctx, "arena_bytes_in_use", arena.in_use);
  RedisModule_InfoAddFieldULongLong(ctx, "arena_bytes_free", arena.free);
  RedisModule_InfoAddFieldULongLong(ctx, "arena_bytes_mapped", arena.mapped);
  RedisModule_InfoAddFieldULongLong(ctx, "arena_blocks", arena.blocks);
  RedisModule_InfoAddFieldULongLong(ctx, "arena_refused", arena.refused);
  // Registrations made since the arena was registered at load, against transfers submitted:
  // 0 unless some operand missed the arena (each would cost an fi_mr_reg on verbs and efa).
  const std::uint64_t registrations = registrations_made() - state->registrations_at_load;
  const std::uint64_t transfers = state->transfers.load(std::memory_order_relaxed);
  RedisModule_InfoAddFieldULongLong(ctx, "registrations", registrations);
  RedisModule_InfoAddFieldULongLong(ctx, "transfers", transfers);
  char per_op[32];
  std::snprintf(per_op, sizeof(per_op), "%.4f",
                transfers == 0 ? 0.0
                               : static_cast<double>(registrations) / static_cast<double>(transfers));
  RedisModule_InfoAddFieldCString(ctx, "registrations_per_op", per_op);
  RedisModule_InfoAddFieldULongLong(ctx, "plain_string_copies",
                                    counters.plain_string_copies.load(std::memory_order_relaxed));
  RedisModule_InfoAddFieldULongLong(ctx, "plain_gets",
                                    counters.plain_gets.load(std::memory_order_relaxed));
  RedisModule_InfoAddFieldULongLong(ctx, "plain_sets",
                                    counters.plain_sets.load(std::memory_order_relaxed));
}

// ---- the dma-value data type (main thread; rdb_save also in a BGSAVE child) ------------------

// RDB: <length> <crc32c> <bytes>. A value whose bytes do not match its CRC, or that the arena
// cannot hold, fails the load (logged, naming why) rather than loading wrong or partial data.
void* value_load(RedisModuleIO* rdb, int encoding) {
  if (encoding != kValueEncoding) {
    RedisModule_LogIOError(rdb, "warning", "dma: unknown dma-value encoding %d", encoding);
    return nullptr;
  }
  const std::uint64_t length = RedisModule_LoadUnsigned(rdb);
  const std::uint64_t crc = RedisModule_LoadUnsigned(rdb);
  std::size_t loaded = 0;
  std::unique_ptr<char, void (*)(void*)> bytes(RedisModule_LoadStringBuffer(rdb, &loaded),
                                               RedisModule_Free);
  if (RedisModule_IsIOError(rdb) || !bytes) return nullptr;
  auto block = state->arena->copy_of(std::as_bytes(std::span<const char>(bytes.get(), loaded)));
  if (!block) {
    RedisModule_LogIOError(rdb, "warning", "dma: cannot load a value: %s",
                           block.error().describe().c_str());
    return nullptr;
  }
  if (loaded != length || block->crc() != crc) {
    RedisModule_LogIOError(rdb, "warning",
                           "dma: a value of %zu bytes (recorded %llu) has CRC32C %u, recorded %llu",
                           loaded, static_cast<unsigned long long>(length), block->crc(),
                           static_cast<unsigned long long>(crc));
    return nullptr;
  }
  return block->release_to_opaque();
}

void value_save(RedisModuleIO* rdb, void* value) {
  const store::BlockView view = store::Block::view(value);
  RedisModule_SaveUnsigned(rdb, view.bytes.size());
  RedisModule_SaveUnsigned(rdb, view.crc);
  RedisModule_SaveStringBuffer(rdb, reinterpret_cast<const char*>(view.bytes.data()),
                               view.bytes.size());
}

// AOF rewrite: one DMA.SETPLAIN per key, with its CRC so a damaged AOF is refused on replay.
void value_rewrite(RedisModuleIO* aof, RedisModuleString* key, void* value) {
  const store::BlockView view = store::Block::view(value);
  RedisModule_EmitAOF(aof, "DMA.SETPLAIN", "sbcl", key,
                      reinterpret_cast<const char*>(view.bytes.data()), view.bytes.size(), "CRC",
                      static_cast<long long>(view.crc));
}

std::size_t value_memory(const void* value) { return store::Block::view(value).footprint; }

void value_free(void* value) { (void)store::Block::adopt(value); }

// COPY shares the block: values never change once stored.
void* value_copy(RedisModuleString* /*from*/, RedisModuleString* /*to*/, const void* value) {
  return store::Block::share(const_cast<void*>(value)).release_to_opaque();
}

// The shared object a signal handler's code lives in ("" for SIG_DFL/SIG_IGN or unknown).
std::string object_of(const struct sigaction& action) {
  const void* code = (action.sa_flags & SA_SIGINFO)
                         ? reinterpret_cast<const void*>(action.sa_sigaction)
                         : reinterpret_cast<const void*>(action.sa_handler);
  if (code == reinterpret_cast<const void*>(SIG_DFL) ||
      code == reinterpret_cast<const void*>(SIG_IGN)) {
    return {};
  }
  Dl_info info{};
  if (::dladdr(code, &info) == 0 || info.dli_fname == nullptr) return {};
  return info.dli_fname;
}

// Measured on Debian 12: libfabric 1.17 links the psm provider's libinfinipath.so.4, whose
// library constructor (run when the server dlopens this module, before RedisModule_OnLoad)
// replaces the SIGINT and SIGTERM handlers with one that calls exit(1). SIGTERM then ends
// redis-server with status 1, skipping its graceful shutdown and the shutdown event that stops
// the fabric workers. The server's own handler is gone by the time we run, so the module can
// only say so; IPATH_NO_BACKTRACE=1 in the server's environment stops the library installing it.
void warn_if_sigterm_taken(RedisModuleCtx* ctx) {
  Dl_info server{};
  struct sigaction terminate {};
  if (::dladdr(reinterpret_cast<const void*>(RedisModule_GetApi), &server) == 0 ||
      server.dli_fname == nullptr || ::sigaction(SIGTERM, nullptr, &terminate) != 0) {
    return;
  }
  const std::string owner = object_of(terminate);
  if (owner.empty() || owner == server.dli_fname) return;
  RedisModule_Log(ctx, "warning",
                  "dma: SIGTERM's handler belongs to %s, not the server: SIGTERM will end the "
                  "server without its graceful shutdown; start it with IPATH_NO_BACKTRACE=1 "
                  "(libinfinipath) or stop it with SHUTDOWN",
                  owner.c_str());
}

struct CommandSpec {
  const char* name;
  RedisModuleCmdFunc function;
  const char* flags;
  int first_key, last_key, key_step;
};

// Every command the module adds. Replies (README, "The Redis/Valkey module"):
//   DMA.HELLO <client-address-hex>      [<nonce-hex>, [<endpoint-address-hex>...]]; opens an
//                                       unproven session, once per connection
//   DMA.PROVE <rkey> <addr> <len>       OK after reading the nonce (len = 32) back from the
//                                       advertised address; else an error, session closed
//   DMA.GET <key> <rkey> <addr> <len>.. [length, crc32c] | nil; proven sessions only
//   DMA.SET <key> <length> [CRC <c>] <rkey> <addr> <len>..  [length, crc32c]; proven only
//   DMA.GETPLAIN <key>                  the value's bytes | nil; no session needed
//   DMA.SETPLAIN <key> <value> [CRC <c>]  [length, crc32c]; no session needed
//   DMA.INFO                            counters and one entry per endpoint
constexpr CommandSpec kCommands[] = {
    {"dma.hello", hello_command, "deny-script", 0, 0, 0},
    {"dma.prove", prove_command, "deny-script", 0, 0, 0},
    {"dma.get", get_command, "readonly deny-script", 1, 1, 1},
    {"dma.set", set_command, "write deny-oom deny-script", 1, 1, 1},
    {"dma.getplain", getplain_command, "readonly", 1, 1, 1},
    {"dma.setplain", setplain_command, "write deny-oom", 1, 1, 1},
    {"dma.info", info_command, "readonly fast", 0, 0, 0},
};

}  // namespace
}  // namespace dma::module

extern "C" __attribute__((visibility("default"))) int RedisModule_OnLoad(RedisModuleCtx* ctx,
                                                                         RedisModuleString** argv,
                                                                         int argc) {
  using namespace dma::module;
  if (redis_module_init(ctx, "dma", 1, REDISMODULE_APIVER_1) != REDISMODULE_OK) {
    return REDISMODULE_ERR;
  }
  if (state != nullptr) {
    RedisModule_Log(ctx, "warning", "dma: the module is already loaded");
    return REDISMODULE_ERR;
  }
  std::vector<std::string> arguments;
  for (int index = 0; index < argc; ++index) arguments.emplace_back(view_of(argv[index]));
  auto options = parse_module_arguments(arguments);
  if (!options) {
    RedisModule_Log(ctx, "warning", "dma: %s", options.error().describe().c_str());
    return REDISMODULE_ERR;
  }
  auto fresh = std::make_unique<State>();
  fresh->options = std::move(*options);
  state = fresh.get();
  warn_if_sigterm_taken(ctx);
  auto services = dma::ServiceSet::start(fresh->options.configuration, complete_batch,
                                         fresh->options.services_per_domain);
  if (!services) {
    RedisModule_Log(ctx, "warning", "dma: cannot open the fabric: %s",
                    services.error().describe().c_str());
    state = nullptr;
    return REDISMODULE_ERR;
  }
  fresh->services = std::move(*services);
  auto arena = dma::store::Arena::create(fresh->options.arena_bytes);
  if (!arena) {
    RedisModule_Log(ctx, "warning", "dma: %s", arena.error().describe().c_str());
    state = nullptr;
    return REDISMODULE_ERR;
  }
  fresh->arena = std::move(*arena);
  if (dma::Status pinned = fresh->services->pin(fresh->arena->base(), fresh->arena->capacity());
      !pinned) {
    RedisModule_Log(ctx, "warning", "dma: cannot register arena-bytes %zu for the value store: %s",
                    fresh->arena->capacity(), pinned.error().describe().c_str());
    state = nullptr;
    return REDISMODULE_ERR;
  }
  fresh->registrations_at_load = dma::registrations_made();
  RedisModuleTypeMethods methods{};
  methods.version = REDISMODULE_TYPE_METHOD_VERSION_3;
  methods.rdb_load = value_load;
  methods.rdb_save = value_save;
  methods.aof_rewrite = value_rewrite;
  methods.mem_usage = value_memory;
  methods.free = value_free;
  methods.copy = value_copy;
  fresh->value_type = RedisModule_CreateDataType(ctx, "dma-value", kValueEncoding, &methods);
  if (fresh->value_type == nullptr) {
    RedisModule_Log(ctx, "warning", "dma: cannot create the dma-value data type");
    state = nullptr;
    return REDISMODULE_ERR;
  }
  for (const CommandSpec& command : kCommands) {
    if (RedisModule_CreateCommand(ctx, command.name, command.function, command.flags,
                                  command.first_key, command.last_key,
                                  command.key_step) != REDISMODULE_OK) {
      RedisModule_Log(ctx, "warning", "dma: cannot register %s", command.name);
      state = nullptr;
      return REDISMODULE_ERR;
    }
  }
  RedisModule_SubscribeToServerEvent(ctx, RedisModuleEvent{REDISMODULE_EVENT_CLIENT_CHANGE, 1},
                                     on_client_change);
  RedisModule_SubscribeToServerEvent(ctx, RedisModuleEvent{REDISMODULE_EVENT_SHUTDOWN, 1},
                                     on_shutdown);
  RedisModule_RegisterInfoFunc(ctx, on_info);
  for (std::size_t index = 0; index < fresh->services->size(); ++index) {
    RedisModule_Log(ctx, "notice", "dma: endpoint %zu: %s", index,
                    fresh->services->at(index).describe().to_string().c_str());
  }
  (void)fresh.release();  // owned by `state` from now on
  return REDISMODULE_OK;
}

extern "C" __attribute__((visibility("default"))) int RedisModule_OnUnload(RedisModuleCtx* ctx) {
  using namespace dma::module;
  if (state == nullptr) return REDISMODULE_OK;
  if (state->sessions.size() != 0 || state->counters.in_flight.load() != 0) {
    RedisModule_Log(ctx, "warning", "dma: refusing to unload with sessions or transfers open");
    return REDISMODULE_ERR;
  }
  delete state;  // stops the workers; nothing is in flight, so no completion can arrive
  state = nullptr;
  return REDISMODULE_OK;
}
