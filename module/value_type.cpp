// The `dma-value` data type: a reference on a value-store block (store/arena.hpp). Callbacks run
// on the main thread, rdb_save also in a BGSAVE child (which only reads: store::Block::view
// touches no reference count, so the child copies no page for it).
#include <memory>
#include <span>

#include "commands.hpp"
#include "dma/protocol.hpp"
#include "state.hpp"

namespace dma::module {
namespace {

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

}  // namespace

RedisModuleType* create_value_type(RedisModuleCtx* ctx) {
  RedisModuleTypeMethods methods{};
  methods.version = REDISMODULE_TYPE_METHOD_VERSION_3;
  methods.rdb_load = value_load;
  methods.rdb_save = value_save;
  methods.aof_rewrite = value_rewrite;
  methods.mem_usage = value_memory;
  methods.free = value_free;
  methods.copy = value_copy;
  return RedisModule_CreateDataType(ctx, "dma-value", kValueEncoding, &methods);
}

}  // namespace dma::module
