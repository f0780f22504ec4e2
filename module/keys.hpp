// RAII over the server's key and string handles, and what a key holds for the value commands.
//
// Ownership: an OpenedKey closes its key, an OwnedString frees its string with the context it
// was made in. Thread-safety: main thread only (the server's handles are).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include "core.hpp"
#include "dma/result.hpp"
#include "redis_module_api.h"
#include "store/arena.hpp"

namespace dma::module {

struct KeyCloser {
  void operator()(RedisModuleKey* key) const noexcept { RedisModule_CloseKey(key); }
};
using OpenedKey = std::unique_ptr<RedisModuleKey, KeyCloser>;

inline OpenedKey open_key(RedisModuleCtx* ctx, RedisModuleString* name, int mode) {
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
HeldValue held_by(RedisModuleKey* key);

// Whether `name` holds anything now (an expired key is gone: opening it expires it).
bool key_exists(RedisModuleCtx* ctx, RedisModuleString* name);
// Whether NX/XX (`condition`) holds for `name` now; the key is opened only if one was given.
bool condition_holds_now(RedisModuleCtx* ctx, Condition condition, RedisModuleString* name);

// Makes `block` the value of `key`, opened for writing (a new reference for the key; whatever
// it held goes, its expiry with it). write.hpp's write_value is the write a command makes; this
// is only its last step. A stored value is replaced in place (the key's entry and its expiry
// stay, the expiry then removed here), which spares the server deleting and re-adding the key:
// ~0.2 us of a 4 KiB DMA.SETPLAIN.
Status set_stored_value(RedisModuleKey* key, const store::Block& block);

}  // namespace dma::module
