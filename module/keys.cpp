// What a key holds and storing a value (keys.hpp).
#include "keys.hpp"

#include "state.hpp"

namespace dma::module {

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

bool key_exists(RedisModuleCtx* ctx, RedisModuleString* name) {
  OpenedKey key = open_key(ctx, name, REDISMODULE_READ);
  return key && RedisModule_KeyType(key.get()) != REDISMODULE_KEYTYPE_EMPTY;
}

bool condition_holds_now(RedisModuleCtx* ctx, Condition condition, RedisModuleString* name) {
  return condition == Condition::kAlways || condition_holds(condition, key_exists(ctx, name));
}

Status set_stored_value(RedisModuleKey* key, const store::Block& block) {
  store::Block for_key = block;
  void* opaque = for_key.release_to_opaque();
  if (key != nullptr && RedisModule_KeyType(key) == REDISMODULE_KEYTYPE_MODULE &&
      RedisModule_ModuleTypeGetType(key) == state->value_type) {
    void* old = nullptr;
    if (RedisModule_ModuleTypeReplaceValue(key, state->value_type, opaque, &old) ==
        REDISMODULE_OK) {
      (void)store::Block::adopt(old);  // the key's reference on the old block goes
      (void)RedisModule_SetAbsExpire(key, REDISMODULE_NO_EXPIRE);
      return {};
    }
  }
  if (key == nullptr ||
      RedisModule_ModuleTypeSetValue(key, state->value_type, opaque) != REDISMODULE_OK) {
    (void)store::Block::adopt(opaque);
    return fail(ErrorCode::kInvalidArgument, "could not store the value");
  }
  return {};
}

}  // namespace dma::module
