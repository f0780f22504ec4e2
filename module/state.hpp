// The module's one piece of process-wide state, and the small helpers every command shares.
//
// Ownership: RedisModule_OnLoad creates the State and `state` points at it from then on; it is
// deliberately never destroyed at process exit (the workers may still be running completions
// then, and the server is going away anyway). MODULE UNLOAD destroys it only when nothing is in
// flight and no session is open. Thread-safety: main thread only, except `counters`,
// `transfers` and the services' own thread-safe calls, which the batch completer also uses.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core.hpp"
#include "dma/service.hpp"
#include "redis_module_api.h"
#include "store/arena.hpp"
#include "store/ballast.hpp"

namespace dma::module {

struct State {
  ModuleOptions options;
  Counters counters;
  // The arena's blocks counted in the server's used_memory (maxmemory, eviction). Declared
  // before the arena, which tells it of every block it frees.
  std::unique_ptr<store::Ballast> ballast;
  // Declared before the services: their endpoints close (and drop the arena's registrations)
  // before the arena unmaps.
  std::unique_ptr<store::Arena> arena;
  std::unique_ptr<ServiceSet> services;  // null once the server is shutting down
  Sessions sessions;                     // main thread only
  RedisModuleType* value_type = nullptr;
  // registrations_made() once the arena was registered: what transfers add is counted after.
  std::uint64_t registrations_at_load = 0;
  std::atomic<std::uint64_t> transfers{0};  // submitted DMA.GET/SET/PROVE transfers
  // What a fork (BGSAVE, AOF rewrite, full resync) means for the arena's registration, found at
  // load (core.hpp, ForkSafety).
  ForkSafety fork_safety = ForkSafety::kNotPinned;
  // Found that neither replicas nor the AOF would receive a propagated write, and nothing has
  // happened since that could change it (write.cpp, someone_receives). Main thread only.
  bool nobody_receives = false;
};
extern State* state;

// The `dma-value` type's RDB encoding: <length> <crc32c> <bytes>.
inline constexpr int kValueEncoding = 1;

std::string_view view_of(RedisModuleString* string);
// argv[from, argc) as views, valid while the command runs and until the next call (one vector
// reused for every command, so parsing a transfer's arguments allocates nothing once it has
// grown; main thread only).
std::span<const std::string_view> fields_of(RedisModuleString** argv, int from, int argc);

// The one adapter from an Error to an error reply ("ERR <kind>: <message>").
int reply_error(RedisModuleCtx* ctx, const Error& error);
int reply_error(RedisModuleCtx* ctx, ErrorCode code, std::string message);
// DMA.SET's, DMA.SETPLAIN's and a DMA.GET's reply: [length, crc32c].
int reply_length_and_crc(RedisModuleCtx* ctx, std::size_t length, std::uint32_t crc);

void publish_session_count();
// The first word of the error a session gets once a server endpoint it said hello to was
// replaced (dma::Client says DMA.HELLO again on it).
inline constexpr std::string_view kRehello = "REHELLO";
// Replies REHELLO and resets `client_id`'s session (peer removed, DMA.HELLO accepted again).
int reply_rehello(RedisModuleCtx* ctx, std::uint64_t client_id, std::string_view why);
// If `client_id`'s session said hello before the current generation: replies REHELLO (as
// above) and returns true.
bool rehello_if_stale(RedisModuleCtx* ctx, std::uint64_t client_id);

// Refuses a blocking command inside MULTI or a script (it would never get its reply), and any
// transfer once the services have stopped for shutdown; false once it has replied.
bool may_block(RedisModuleCtx* ctx);
// Fails the command unless the connection has a proven session and may block; false once it
// has replied.
bool ready_to_transfer(RedisModuleCtx* ctx, std::uint64_t client_id);
// Ends a session whose proof failed: the peer goes (once its transfers drain) and the
// connection may say DMA.HELLO again.
void refuse_session(std::uint64_t client_id);

}  // namespace dma::module
