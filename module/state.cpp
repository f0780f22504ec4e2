// The module's state and shared helpers (state.hpp).
#include "state.hpp"

namespace dma::module {

State* state = nullptr;

std::string_view view_of(RedisModuleString* string) {
  std::size_t length = 0;
  const char* data = RedisModule_StringPtrLen(string, &length);
  return {data, length};
}

int reply_rehello(RedisModuleCtx* ctx, std::uint64_t client_id, std::string_view why) {
  if (state->sessions.close(client_id)) {
    publish_session_count();
    if (state->services) state->services->remove_peer(client_id);
  }
  state->counters.rehellos.fetch_add(1, std::memory_order_relaxed);
  const std::string text = std::string(kRehello) + " the server's fabric endpoint was replaced (" +
                           std::string(why) + "); say DMA.HELLO again";
  return RedisModule_ReplyWithError(ctx, text.c_str());
}

bool rehello_if_stale(RedisModuleCtx* ctx, std::uint64_t client_id) {
  if (!state->services || !state->sessions.stale(client_id, state->services->generation())) {
    return false;
  }
  reply_rehello(ctx, client_id, "since this session's DMA.HELLO");
  return true;
}

int reply_error(RedisModuleCtx* ctx, const Error& error) {
  // A transfer failed because its endpoint was replaced under it: the session's peer and proof
  // belong to the old endpoint, so it is told to say hello again.
  if (error.code() == ErrorCode::kFabric && error.message().starts_with("endpoint replaced: ")) {
    const std::uint64_t client_id = RedisModule_GetClientId(ctx);
    if (client_id != 0) return reply_rehello(ctx, client_id, error.message());
  }
  const std::string text = error_reply(error);
  return RedisModule_ReplyWithError(ctx, text.c_str());
}

int reply_error(RedisModuleCtx* ctx, ErrorCode code, std::string message) {
  return reply_error(ctx, Error(code, std::move(message)));
}

void publish_session_count() {
  state->counters.sessions.store(state->sessions.size(), std::memory_order_relaxed);
}

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

bool ready_to_transfer(RedisModuleCtx* ctx, std::uint64_t client_id) {
  if (rehello_if_stale(ctx, client_id)) return false;
  if (Status proven = state->sessions.check_proven(client_id); !proven) {
    reply_error(ctx, proven.error());
    return false;
  }
  return may_block(ctx);
}

void refuse_session(std::uint64_t client_id) {
  state->sessions.close(client_id);
  publish_session_count();
  state->counters.proofs_refused.fetch_add(1, std::memory_order_relaxed);
  if (state->services) state->services->remove_peer(client_id);
}

std::span<const std::string_view> fields_of(RedisModuleString** argv, int from, int argc) {
  static std::vector<std::string_view> fields;
  fields.clear();
  for (int index = from; index < argc; ++index) fields.push_back(view_of(argv[index]));
  return fields;
}

int reply_length_and_crc(RedisModuleCtx* ctx, std::size_t length, std::uint32_t crc) {
  RedisModule_ReplyWithArray(ctx, 2);
  RedisModule_ReplyWithLongLong(ctx, static_cast<long long>(length));
  RedisModule_ReplyWithLongLong(ctx, static_cast<long long>(crc));
  return REDISMODULE_OK;
}

}  // namespace dma::module
