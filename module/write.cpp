// Storing a value as a Redis write (write.hpp).
#include "write.hpp"

#include <cerrno>
#include <limits>

#include "keys.hpp"
#include "state.hpp"

namespace dma::module {
namespace {

// The absolute deadline the key ends with, if any. Relative TTLs count from now (the moment the
// value becomes visible); their overflow was refused when the command was parsed, so one that
// overflows by the time the read completes saturates.
std::optional<long long> deadline_of(RedisModuleKey* key, bool existed, const Expiry& expiry) {
  switch (expiry.kind) {
    case Expiry::Kind::kClear:
      return std::nullopt;
    case Expiry::Kind::kKeep: {
      if (!existed) return std::nullopt;
      const long long kept = RedisModule_GetAbsExpire(key);
      return kept == REDISMODULE_NO_EXPIRE ? std::nullopt : std::optional<long long>(kept);
    }
    case Expiry::Kind::kRelative:
    case Expiry::Kind::kAbsolute: {
      auto deadline = expiry_deadline(expiry, RedisModule_Milliseconds());
      return deadline ? *deadline : std::numeric_limits<long long>::max();
    }
  }
  return std::nullopt;
}

// Whether a propagated write would reach anyone now, by Redis 7.0's rule (server.c,
// shouldPropagate): the AOF when appendonly is on; replicas when this server is a master with a
// replication backlog or replicas attached (a replica feeds its own replicas the master's
// stream, not what it propagates). When in doubt, yes.
//
// A "nobody" found in INFO replication is kept until a fork or a role change (forget_who_receives),
// since building that section took ~9 us of the main thread per 1 MiB DMA.SET. A backlog appears
// when a replica syncs (or this server was a replica, then promoted: a role change), and every
// full sync forks for its RDB before the replica takes the stream; the writes before that fork
// are in the RDB. "Someone" is never kept: its copy costs more than the check.
bool someone_receives(RedisModuleCtx* ctx) {
  const int flags = RedisModule_GetContextFlags(ctx);
  if (flags & REDISMODULE_CTX_FLAGS_AOF) return true;
  if (flags & REDISMODULE_CTX_FLAGS_SLAVE) return false;
  if (state->nobody_receives) return false;
  RedisModuleServerInfoData* info = RedisModule_GetServerInfo(ctx, "replication");
  if (info == nullptr) return true;
  int backlog_error = 0;
  int replicas_error = 0;
  const unsigned long long backlog =
      RedisModule_ServerInfoGetFieldUnsigned(info, "repl_backlog_active", &backlog_error);
  const unsigned long long replicas =
      RedisModule_ServerInfoGetFieldUnsigned(info, "connected_slaves", &replicas_error);
  RedisModule_FreeServerInfo(ctx, info);
  const bool someone = backlog_error != 0 || replicas_error != 0 || backlog != 0 || replicas != 0;
  state->nobody_receives = !someone;
  return someone;
}

void replicate(RedisModuleCtx* ctx, RedisModuleString* name, const store::Block& block,
               RedisModuleString* value, std::optional<long long> deadline) {
  if (value == nullptr && block.length() >= kReplicationCheckBytes && !someone_receives(ctx)) {
    // "AR": neither the AOF nor replicas; the server still counts the change.
    (void)RedisModule_Replicate(ctx, "DMA.SETPLAIN", "sAR", name);
    state->counters.writes_unpropagated.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  const char* bytes = reinterpret_cast<const char*>(block.data());
  const auto crc = static_cast<long long>(block.crc());
  int replicated = REDISMODULE_ERR;
  if (value != nullptr) {
    replicated = deadline ? RedisModule_Replicate(ctx, "DMA.SETPLAIN", "ssclcl", name, value,
                                                  "CRC", crc, "PXAT", *deadline)
                          : RedisModule_Replicate(ctx, "DMA.SETPLAIN", "sscl", name, value, "CRC",
                                                  crc);
  } else {
    replicated = deadline ? RedisModule_Replicate(ctx, "DMA.SETPLAIN", "sbclcl", name, bytes,
                                                  block.length(), "CRC", crc, "PXAT", *deadline)
                          : RedisModule_Replicate(ctx, "DMA.SETPLAIN", "sbcl", name, bytes,
                                                  block.length(), "CRC", crc);
  }
  if (replicated == REDISMODULE_OK) {
    state->counters.writes_replicated.fetch_add(1, std::memory_order_relaxed);
  } else {
    // Only if DMA.SETPLAIN were not registered: the module's own table has it.
    RedisModule_Log(ctx, "warning", "dma: a write could not be replicated");
  }
}

}  // namespace

Result<Written> write_value(RedisModuleCtx* ctx, RedisModuleString* name,
                            const store::Block& block, const WriteOptions& options,
                            RedisModuleString* bytes, bool as_sent) {
  OpenedKey key = open_key(ctx, name, REDISMODULE_READ | REDISMODULE_WRITE);
  if (!key) return fail(ErrorCode::kInvalidArgument, "could not open the key for writing");
  const bool existed = RedisModule_KeyType(key.get()) != REDISMODULE_KEYTYPE_EMPTY;
  if (!condition_holds(options.condition, existed)) {
    state->counters.conditions_failed.fetch_add(1, std::memory_order_relaxed);
    return Written::kSkipped;
  }
  const std::optional<long long> deadline = deadline_of(key.get(), existed, options.expiry);
  DMA_TRY(set_stored_value(key.get(), block));
  if (deadline) (void)RedisModule_SetAbsExpire(key.get(), *deadline);
  key.reset();
  RedisModule_SignalModifiedKey(ctx, name);
  RedisModule_NotifyKeyspaceEvent(ctx, REDISMODULE_NOTIFY_STRING, "set", name);
  if (options.expiry.kind == Expiry::Kind::kRelative ||
      options.expiry.kind == Expiry::Kind::kAbsolute) {
    RedisModule_NotifyKeyspaceEvent(ctx, REDISMODULE_NOTIFY_GENERIC, "expire", name);
  }
  if (as_sent && RedisModule_ReplicateVerbatim(ctx) == REDISMODULE_OK) {
    state->counters.writes_replicated.fetch_add(1, std::memory_order_relaxed);
  } else {
    replicate(ctx, name, block, bytes, deadline);
  }
  return Written::kStored;
}

void forget_who_receives() { state->nobody_receives = false; }

std::optional<std::string> refusal_to_write_now(RedisModuleCtx* ctx, RedisModuleString* name) {
  const int flags = RedisModule_GetContextFlags(ctx);
  if (flags & REDISMODULE_CTX_FLAGS_SLAVE) {
    return "READONLY You can't write against a read only replica (this server became a replica "
           "while the DMA.SET read was in flight; the key is unchanged)";
  }
  if (!(flags & REDISMODULE_CTX_FLAGS_CLUSTER)) return std::nullopt;
  errno = 0;
  RedisModuleCallReply* probe = RedisModule_Call(ctx, "EXISTS", "s", name);
  if (probe != nullptr) {
    RedisModule_FreeCallReply(probe);
    return std::nullopt;
  }
  if (errno == ENETDOWN || errno == EROFS) {
    return "CLUSTERDOWN The cluster went down while the DMA.SET read was in flight; the key is "
           "unchanged";
  }
  return "TRYAGAIN This node stopped serving the key's slot while the DMA.SET read was in "
         "flight; the key is unchanged, send the DMA.SET again";
}

}  // namespace dma::module
