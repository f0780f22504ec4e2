// A DMA write is a Redis write: what storing a value does besides replacing the key's value, so
// that DMA.SET and DMA.SETPLAIN behave as SET does (issue 12).
//
// The failures it prevents: a value DMA.SET stored reached neither the replicas nor the AOF (it
// was lost on failover and on restart with appendonly), a WATCHed key changed under an EXEC that
// then ran, keyspace-notification listeners (cache invalidation) missed it, and an old TTL
// survived the overwrite (a fresh value expired with the old one's deadline).
//
// write_value does, in order: NX/XX checked against the key as it is now; the value replaces
// whatever the key held (any type), its TTL cleared unless KEEPTTL; EX/PX/EXAT/PXAT set;
// RedisModule_SignalModifiedKey (WATCH, client-side caching); the keyspace events SET fires,
// "set" in the string class ($) and, with a TTL option, "expire" in the generic class (g); and
// the write replicated to replicas and the AOF as
//   DMA.SETPLAIN <key> <bytes> CRC <crc32c> [PXAT <unix-ms>]
// that is the bytes and their CRC (so a replica or an AOF replay refuses damaged bytes), never a
// client's fabric addresses, and the deadline the key ends with as an absolute time (so a replica
// and a replayed AOF end with the same one whenever they apply it), KEEPTTL included.
//
// The cost: RedisModule_Replicate copies the bytes into a new string (for 16 MiB, about 12 ms
// of the main thread here, most of it page faults on the fresh allocation; docs/RELIABILITY.md,
// "Replication"), then the server copies them again into the replication buffer and the AOF.
// The first copy buys nothing when nobody receives the stream, so for a value of
// kReplicationCheckBytes or more the write first asks what Redis's own rule (server.c,
// shouldPropagate) would: appendonly on, or a master with a replication backlog or replicas.
// When neither holds only the key is handed over, marked for neither AOF nor replicas, which
// still counts the write as a change (server.dirty: save points fire) and propagates nothing;
// that answer is kept until a fork or a role change (forget_who_receives). A DMA.SETPLAIN hands
// over its own argument, which the server keeps by reference: no copy.
//
// Thread-safety: main thread only (the server's API). Nothing here blocks or throws.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "core.hpp"
#include "redis_module_api.h"
#include "store/arena.hpp"

namespace dma::module {

enum class Written : std::uint8_t {
  kStored,
  kSkipped,  // NX or XX did not hold: the key is untouched
};

inline constexpr std::size_t kReplicationCheckBytes = std::size_t{64} << 10;

// Stores `block` under `name` following `options` (its CRC already checked by the caller).
// `bytes`: the same bytes as a server string (DMA.SETPLAIN's argument), replicated by reference;
// null: replicated from the block (a copy). `as_sent`: the command being run is already
// `DMA.SETPLAIN <key> <bytes> CRC <crc32c>`, the form a write is replicated in, and goes on as it
// came (RedisModule_ReplicateVerbatim: no lookup of the command, no new strings; a 4 KiB
// DMA.SETPLAIN took 0.4 us less of the main thread). Fails only if the server refuses the key.
Result<Written> write_value(RedisModuleCtx* ctx, RedisModuleString* name,
                            const store::Block& block, const WriteOptions& options,
                            RedisModuleString* bytes = nullptr, bool as_sent = false);

// Called on every fork and replication role change: whether anyone receives propagated writes is
// asked of the server again at the next large write.
void forget_who_receives();

// Why a DMA.SET whose read has just completed must not write now, as a whole error reply
// ("READONLY ...", "TRYAGAIN ...", "CLUSTERDOWN ..."), or nothing. The read ran while the server
// kept serving, so by now the server may have become a replica (REPLICAOF; a write there would
// diverge from its master), or, in a cluster, the key's slot may have moved to another node
// (MIGRATE during the read; a write here would land on a node that no longer serves the key and
// be lost). The cluster check asks the server's own routing (RedisModule_Call refuses a command
// on a key this node does not serve now, with the client's ASKING flag), so it agrees with
// -MOVED/-ASK. The key is untouched either way; TRYAGAIN tells the client to send the DMA.SET
// again, which is then redirected.
std::optional<std::string> refusal_to_write_now(RedisModuleCtx* ctx, RedisModuleString* name);

}  // namespace dma::module
