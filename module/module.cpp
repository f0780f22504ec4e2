// The Redis/Valkey module: DMA.HELLO, DMA.GET, DMA.SET, DMA.INFO and the `INFO dma` section.
//
// Threads: every command, reply callback and server event runs on the server's main thread,
// which owns the session set. The fabric workers (and CRC pool threads) only run the batch
// completer, which records the outcome in the transfer's context and hands it back with
// RedisModule_UnblockClient (documented thread-safe). The main thread never waits on a transfer:
// a DMA.GET/SET blocks only its own client. DMA.HELLO waits for the workers to insert the
// client's address (a local address-vector insert, no network round trip), so a bad address
// fails the hello instead of the first transfer.
//
// Lifetimes: a TransferContext is owned by the service while the transfer runs, then by the
// server as the blocked client's private data; free_context (the free-privdata callback) deletes
// it whether the client is still there, timed out or disconnected. The server never registers
// memory for remote access: GET sources and SET landing buffers are local operands only.
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "core.hpp"
#include "dma/protocol.hpp"
#include "dma/service.hpp"
#include "redis_module_api.h"

namespace dma::module {
namespace {

// The module's state, created at load. Deliberately never destroyed at process exit: the
// workers may still be running completions then, and the server is going away anyway. MODULE
// UNLOAD destroys it only when nothing is in flight and no session is open.
struct State {
  ModuleOptions options;
  Counters counters;
  std::unique_ptr<ServiceSet> services;
  std::unordered_set<std::uint64_t> sessions;  // client ids with a HELLO; main thread only
};
State* state = nullptr;

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

// Fails the command unless the connection said hello and may block.
bool ready_to_transfer(RedisModuleCtx* ctx, std::uint64_t client_id) {
  if (!state->sessions.contains(client_id)) {
    reply_error(ctx, ErrorCode::kNotFound,
                "no session on this connection: send DMA.HELLO <client-address-hex> first");
    return false;
  }
  if (RedisModule_GetContextFlags(ctx) & REDISMODULE_CTX_FLAGS_DENY_BLOCKING) {
    reply_error(ctx, ErrorCode::kInvalidArgument,
                "DMA transfers block their client; they cannot run inside MULTI or a script");
    return false;
  }
  return true;
}

// ---- blocked-client callbacks (main thread) ------------------------------------------------

int reply_transfer(RedisModuleCtx* ctx, RedisModuleString** /*argv*/, int /*argc*/) {
  auto* context = static_cast<TransferContext*>(RedisModule_GetBlockedClientPrivateData(ctx));
  const Outcome& outcome = *context->outcome;
  if (!outcome) return reply_error(ctx, outcome.error());
  const std::size_t length = context->bytes().size();
  const std::uint32_t crc = outcome->checksum ? *outcome->checksum : crc32c(context->bytes());
  if (context->kind() == TransferContext::Kind::kSet) {
    if (context->expected_crc() && *context->expected_crc() != crc) {
      state->counters.errors.fetch_add(1, std::memory_order_relaxed);
      return reply_error(ctx, ErrorCode::kCorrupted,
                         "CRC32C mismatch: the client said " +
                             std::to_string(*context->expected_crc()) + ", the bytes read have " +
                             std::to_string(crc) + "; the key is unchanged");
    }
    const std::string& name = context->key();
    RedisModuleString* key_name = RedisModule_CreateString(ctx, name.data(), name.size());
    auto* key = static_cast<RedisModuleKey*>(RedisModule_OpenKey(ctx, key_name, REDISMODULE_WRITE));
    RedisModuleString* value = RedisModule_CreateString(
        ctx, reinterpret_cast<const char*>(context->bytes().data()), length);
    const int stored = RedisModule_StringSet(key, value);
    RedisModule_FreeString(ctx, value);
    RedisModule_CloseKey(key);
    RedisModule_FreeString(ctx, key_name);
    if (stored != REDISMODULE_OK) {
      return reply_error(ctx, ErrorCode::kInvalidArgument, "could not store the value");
    }
  }
  RedisModule_ReplyWithArray(ctx, 2);
  RedisModule_ReplyWithLongLong(ctx, static_cast<long long>(length));
  RedisModule_ReplyWithLongLong(ctx, static_cast<long long>(crc));
  return REDISMODULE_OK;
}

int reply_timeout(RedisModuleCtx* ctx, RedisModuleString** /*argv*/, int /*argc*/) {
  state->counters.errors.fetch_add(1, std::memory_order_relaxed);
  return reply_error(ctx, ErrorCode::kTimedOut,
                     "the DMA transfer did not complete in time; for a SET the key is unchanged");
}

void free_context(RedisModuleCtx* /*ctx*/, void* privdata) {
  delete static_cast<TransferContext*>(privdata);
}

// Runs on a worker or pool thread: hand each finished transfer back to its blocked client.
void complete_batch(std::span<Completion> batch) {
  for (Completion& completion : batch) {
    auto* context = static_cast<TransferContext*>(completion.context.release());
    if (completion.outcome) {
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

// Blocks the client and submits; the reply comes from reply_transfer once the transfer is done.
int block_and_submit(RedisModuleCtx* ctx, std::unique_ptr<TransferContext> context,
                     TransferRequest request) {
  const Configuration& configuration = state->options.configuration;
  // A safety net only: the service fails every transfer by its own deadlines first.
  const long long timeout_ms = 30000 + configuration.progress_deadline.count() +
                               configuration.completion_deadline.count();
  RedisModuleBlockedClient* blocked =
      RedisModule_BlockClient(ctx, reply_transfer, reply_timeout, free_context, timeout_ms);
  context->blocked = blocked;
  TransferContext* raw = context.get();
  request.context = std::move(context);
  state->counters.in_flight.fetch_add(1, std::memory_order_relaxed);
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

// DMA.HELLO <client-address-hex>
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
  if (Status added = state->services->add_peer(client_id, *address); !added) {
    return reply_error(ctx, added.error());
  }
  state->sessions.insert(client_id);
  state->counters.sessions.store(state->sessions.size(), std::memory_order_relaxed);
  const auto addresses = state->services->local_addresses();
  RedisModule_ReplyWithArray(ctx, static_cast<long>(addresses.size()));
  for (const auto& bytes : addresses) {
    const std::string hex = hex_encode(bytes);
    RedisModule_ReplyWithStringBuffer(ctx, hex.data(), hex.size());
  }
  return REDISMODULE_OK;
}

// DMA.GET <key> <rkey> <addr> <len> [<rkey> <addr> <len> ...]
int get_command(RedisModuleCtx* ctx, RedisModuleString** argv, int argc) {
  if (argc < 5 || (argc - 2) % 3 != 0) return RedisModule_WrongArity(ctx);
  const std::uint64_t client_id = RedisModule_GetClientId(ctx);
  if (!ready_to_transfer(ctx, client_id)) return REDISMODULE_OK;
  const auto fields = fields_of(argv, 2, argc);
  auto regions = parse_regions(fields);
  if (!regions) return reply_error(ctx, regions.error());

  auto* key = static_cast<RedisModuleKey*>(RedisModule_OpenKey(ctx, argv[1], REDISMODULE_READ));
  if (key == nullptr || RedisModule_KeyType(key) == REDISMODULE_KEYTYPE_EMPTY) {
    if (key != nullptr) RedisModule_CloseKey(key);
    return RedisModule_ReplyWithNull(ctx);
  }
  if (RedisModule_KeyType(key) != REDISMODULE_KEYTYPE_STRING) {
    RedisModule_CloseKey(key);
    return RedisModule_ReplyWithError(ctx, REDISMODULE_ERRORMSG_WRONGTYPE);
  }
  std::size_t length = 0;
  const char* value = RedisModule_StringDMA(key, &length, REDISMODULE_READ);
  if (length > regions->capacity) {
    RedisModule_CloseKey(key);
    return reply_error(ctx, ErrorCode::kInvalidArgument,
                       "regions hold " + std::to_string(regions->capacity) +
                           " bytes, fewer than the value's " + std::to_string(length));
  }
  // The private copy is what goes on the wire: the key may change or vanish meanwhile.
  auto context = TransferContext::for_get(
      std::as_bytes(std::span<const char>(value == nullptr ? "" : value, length)));
  RedisModule_CloseKey(key);

  TransferRequest request;
  request.client_id = client_id;
  request.regions = std::move(regions->regions);
  request.direction = Direction::kToPeer;
  request.want_checksum = true;
  return block_and_submit(ctx, std::move(context), std::move(request));
}

// DMA.SET <key> <length> [CRC <crc32c>] <rkey> <addr> <len> [...]
int set_command(RedisModuleCtx* ctx, RedisModuleString** argv, int argc) {
  if (argc < 6) return RedisModule_WrongArity(ctx);
  const std::uint64_t client_id = RedisModule_GetClientId(ctx);
  if (!ready_to_transfer(ctx, client_id)) return REDISMODULE_OK;
  const auto fields = fields_of(argv, 2, argc);
  auto arguments = parse_set_arguments(fields, state->options.max_value_size);
  if (!arguments) return reply_error(ctx, arguments.error());

  auto context = TransferContext::for_set(std::string(view_of(argv[1])), arguments->length,
                                          arguments->crc);
  TransferRequest request;
  request.client_id = client_id;
  request.regions = std::move(arguments->regions.regions);
  request.direction = Direction::kFromPeer;
  request.length = arguments->length;
  request.want_checksum = true;
  return block_and_submit(ctx, std::move(context), std::move(request));
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
  RedisModule_ReplyWithArray(ctx, static_cast<long>(state->services->size()));
  for (std::size_t index = 0; index < state->services->size(); ++index) {
    FabricService& service = state->services->at(index);
    const ServiceCounters totals = service.counters();
    const std::string address = hex_encode(service.local_address());
    const std::string description = service.describe().to_string();
    RedisModule_ReplyWithArray(ctx, 18);
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
  }
  return REDISMODULE_OK;
}

// ---- server hooks (main thread) ----------------------------------------------------------------

void on_client_change(RedisModuleCtx* /*ctx*/, RedisModuleEvent /*event*/, std::uint64_t subevent,
                      void* data) {
  if (subevent != REDISMODULE_SUBEVENT_CLIENT_CHANGE_DISCONNECTED || data == nullptr) return;
  const std::uint64_t client_id = static_cast<RedisModuleClientInfo*>(data)->id;
  if (state->sessions.erase(client_id) == 0) return;
  state->counters.sessions.store(state->sessions.size(), std::memory_order_relaxed);
  // The service releases the peer only after the transfers it already has for it finish.
  state->services->remove_peer(client_id);
}

void on_info(RedisModuleInfoCtx* ctx, int /*for_crash_report*/) {
  const Counters& counters = state->counters;
  RedisModule_InfoAddSection(ctx, "");
  RedisModule_InfoAddFieldULongLong(ctx, "sessions",
                                    counters.sessions.load(std::memory_order_relaxed));
  RedisModule_InfoAddFieldULongLong(ctx, "endpoints", state->services->size());
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
}

struct CommandSpec {
  const char* name;
  RedisModuleCmdFunc function;
  const char* flags;
  int first_key, last_key, key_step;
};

// Every command the module adds.
constexpr CommandSpec kCommands[] = {
    {"dma.hello", hello_command, "deny-script", 0, 0, 0},
    {"dma.get", get_command, "readonly deny-script", 1, 1, 1},
    {"dma.set", set_command, "write deny-oom deny-script", 1, 1, 1},
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
  auto services = dma::ServiceSet::start(fresh->options.configuration, complete_batch,
                                         fresh->options.services_per_domain);
  if (!services) {
    RedisModule_Log(ctx, "warning", "dma: cannot open the fabric: %s",
                    services.error().describe().c_str());
    state = nullptr;
    return REDISMODULE_ERR;
  }
  fresh->services = std::move(*services);
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
  if (!state->sessions.empty() || state->counters.in_flight.load() != 0) {
    RedisModule_Log(ctx, "warning", "dma: refusing to unload with sessions or transfers open");
    return REDISMODULE_ERR;
  }
  delete state;  // stops the workers; nothing is in flight, so no completion can arrive
  state = nullptr;
  return REDISMODULE_OK;
}
