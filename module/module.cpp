// The Redis/Valkey module's loader: RedisModule_OnLoad/OnUnload, the one table of commands,
// and the server events it follows. The commands live in session_commands.cpp,
// value_commands.cpp and info.cpp, the data type in value_type.cpp (commands.hpp), the
// blocked-client machinery in blocking.cpp, the state they share in state.hpp; the logic they
// call is in libraries the tests link (core.hpp, store/arena.hpp, transfer.hpp, the dma library).
//
// Values (store/arena.hpp, transfer.hpp): DMA.SET and DMA.SETPLAIN store a `dma-value`, a
// reference on a block of the value store's arena, which is registered once on every service
// at load. DMA.GET sends straight from that block (its transfer holds a reference, so DEL,
// overwrite or expiry meanwhile frees the block only after the write); DMA.SET reads into a
// fresh block that replaces the key's value only after the read completed and its CRC32C
// matched. Each value records its length and CRC32C; RDB save/load and AOF rewrite keep both.
//
// Writes (write.hpp): a DMA.SET or DMA.SETPLAIN is a Redis write: SET's TTL and NX/XX rules,
// WATCH, keyspace events, and replication to replicas and the AOF as DMA.SETPLAIN carrying the
// bytes and their CRC. The arena's blocks count in used_memory (store/ballast.hpp), so
// maxmemory, eviction and deny-oom see them.
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
// Lifetimes (blocking.hpp): a TransferContext is owned by the service while the transfer runs,
// then by the server as the blocked client's private data. The server never registers memory
// for remote access: the arena is registered for local access only.
//
// Shutdown: on the server's shutdown event the services are stopped (in-flight transfers finish
// or fail, workers joined) before the server exits, so no worker is inside libfabric while the
// process runs its exit-time destructors (libfabric's fi_fini among them).
#include <dlfcn.h>
#include <signal.h>

#include <charconv>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "blocking.hpp"
#include "commands.hpp"
#include "dma/memory.hpp"
#include "dma/service.hpp"
#include "redis_module_api.h"
#include "state.hpp"
#include "write.hpp"

namespace dma::module {
namespace {

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

// Every service's counters summed (replacements and abandoned are what shutdown reports).
ServiceCounters total_counters() {
  ServiceCounters sum;
  for (std::size_t index = 0; index < state->services->size(); ++index) {
    const ServiceCounters one = state->services->at(index).counters();
    sum.replacements += one.replacements;
    sum.abandoned += one.abandoned;
  }
  return sum;
}

// DMA.DEBUG REPLACE-ENDPOINT [index]: replaces service `index`'s endpoint (default 0) now, as
// the service does itself when one wedges. Only with the load argument `enable-debug true`.
int debug_command(RedisModuleCtx* ctx, RedisModuleString** argv, int argc) {
  if (!state->options.enable_debug) {
    return reply_error(ctx, ErrorCode::kInvalidArgument,
                       "DMA.DEBUG is disabled: load the module with `enable-debug true`");
  }
  if (argc < 2 || argc > 3) return RedisModule_WrongArity(ctx);
  if (!equals_ignoring_case(view_of(argv[1]), "REPLACE-ENDPOINT")) {
    return reply_error(ctx, ErrorCode::kInvalidArgument,
                       "unknown DMA.DEBUG subcommand (known: REPLACE-ENDPOINT [index])");
  }
  if (!state->services) return reply_error(ctx, ErrorCode::kWorkerGone, "the server is shutting down");
  std::size_t index = 0;
  if (argc == 3) {
    const std::string_view field = view_of(argv[2]);
    const auto [end, error] = std::from_chars(field.data(), field.data() + field.size(), index);
    if (error != std::errc{} || end != field.data() + field.size()) index = state->services->size();
  }
  if (index >= state->services->size()) {
    return reply_error(ctx, ErrorCode::kInvalidArgument,
                       "the endpoint index must be 0 to " +
                           std::to_string(state->services->size() - 1));
  }
  if (Status replaced = state->services->at(index)
                            .replace_endpoint("DMA.DEBUG REPLACE-ENDPOINT");
      !replaced) {
    return reply_error(ctx, replaced.error());
  }
  return RedisModule_ReplyWithLongLong(ctx, static_cast<long long>(state->services->generation()));
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
  // Bounded (shutdown-deadline-ms): an endpoint wedged in the provider or a worker stuck inside
  // it is abandoned (its memory is never freed under the provider) and the server still exits.
  const bool drained = state->services->shutdown(state->options.configuration.shutdown_deadline);
  const ServiceCounters abandoned_before = total_counters();
  state->services.reset();
  if (drained) {
    RedisModule_Log(ctx, "notice", "dma: fabric services stopped");
  } else {
    RedisModule_Log(ctx, "warning",
                    "dma: fabric services stopped; %llu endpoint(s) did not drain within "
                    "shutdown-deadline-ms %lld and were abandoned",
                    static_cast<unsigned long long>(abandoned_before.abandoned),
                    static_cast<long long>(state->options.configuration.shutdown_deadline.count()));
  }
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

// What a fork means for the arena's registration (core.hpp, ForkSafety), logged at load. On a
// provider that pins, libibverbs (loaded by libfabric for verbs and efa) says whether the kernel
// copies pinned pages into a child; it is looked up by name since the module does not link it.
ForkSafety check_fork_safety(RedisModuleCtx* ctx, ServiceSet& services) {
  bool pins = false;
  for (std::size_t index = 0; index < services.size(); ++index) {
    pins = pins || provider_pins_memory(services.at(index).describe().provider);
  }
  std::optional<int> ibv_status;
  if (pins) {
    if (void* found = ::dlsym(RTLD_DEFAULT, "ibv_is_fork_initialized")) {
      ibv_status = reinterpret_cast<int (*)()>(found)();
    }
  }
  const ForkSafety safety = fork_safety(pins, ibv_status);
  const bool fine = safety == ForkSafety::kNotPinned || safety == ForkSafety::kKernelCopies;
  RedisModule_Log(ctx, fine ? "notice" : "warning", "dma: %s",
                  fork_safety_advice(safety).c_str());
  return safety;
}

struct CommandSpec {
  const char* name;
  RedisModuleCmdFunc function;
  const char* flags;
  int first_key, last_key, key_step;
};

// Every command the module adds. Replies (README, "The Redis/Valkey module"):
//   DMA.HELLO <client-address-hex>      [<nonce-hex>, [<endpoint-address-hex>...], inline-max];
//                                       opens an unproven session, once per connection
//   DMA.PROVE <rkey> <addr> <len>       OK after reading the nonce (len = 32) back from the
//                                       advertised address; else an error, session closed
//   DMA.GET <key> [INLINE <max>] <rkey> <addr> <len>..  [length, crc32c] | [length, crc32c,
//                                       bytes] (INLINE, value <= max) | nil; proven only
//   DMA.SET <key> <length> [CRC <c>] [EX|PX|EXAT|PXAT <n> | KEEPTTL] [NX|XX]
//           <rkey> <addr> <len>..   [length, crc32c] | nil (NX/XX); proven only
//   DMA.GETPLAIN <key>                  the value's bytes | nil; no session needed
//   DMA.SETPLAIN <key> <value> [CRC <c>] [EX|PX|EXAT|PXAT <n> | KEEPTTL] [NX|XX] [GET]
//                                       [length, crc32c] | nil | the old value (GET); no session
// Every key is declared (first key 1), so cluster routing answers -MOVED/-ASK for it. DMA.GET
// and DMA.GETPLAIN are readonly, so replicas serve them; the writes are replicated as
// DMA.SETPLAIN (write.hpp).
//   DMA.INFO                            counters and one entry per endpoint
constexpr CommandSpec kCommands[] = {
    {"dma.hello", hello_command, "deny-script", 0, 0, 0},
    {"dma.prove", prove_command, "deny-script", 0, 0, 0},
    {"dma.get", get_command, "readonly deny-script", 1, 1, 1},
    {"dma.set", set_command, "write deny-oom deny-script", 1, 1, 1},
    {"dma.getplain", getplain_command, "readonly", 1, 1, 1},
    {"dma.setplain", setplain_command, "write deny-oom", 1, 1, 1},
    {"dma.info", info_command, "readonly fast", 0, 0, 0},
    {"dma.debug", debug_command, "admin deny-script", 0, 0, 0},
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
  // RedisModule_TryAlloc/Free are zmalloc, thread-safe, and what used_memory counts.
  fresh->ballast = std::make_unique<dma::store::Ballast>(
      dma::store::Ballast::Allocator{RedisModule_TryAlloc, RedisModule_Free});
  dma::store::Ballast* ballast = fresh->ballast.get();
  auto arena = dma::store::Arena::create(
      fresh->options.arena_bytes, [ballast](std::size_t in_use) { ballast->follow(in_use); },
      fresh->options.arena_huge_pages);
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
  fresh->fork_safety = check_fork_safety(ctx, *fresh->services);
  fresh->value_type = create_value_type(ctx);
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
  // The module signals WATCH itself, for each key it really changed (write.hpp).
  RedisModule_SetModuleOptions(ctx, REDISMODULE_OPTION_NO_IMPLICIT_SIGNAL_MODIFIED);
  RedisModule_SubscribeToServerEvent(ctx, RedisModuleEvent{REDISMODULE_EVENT_CLIENT_CHANGE, 1},
                                     on_client_change);
  RedisModule_SubscribeToServerEvent(ctx, RedisModuleEvent{REDISMODULE_EVENT_SHUTDOWN, 1},
                                     on_shutdown);
  // A full sync's fork or a promotion may give the writes from now on a receiver (write.hpp).
  for (const std::uint64_t event :
       {std::uint64_t{REDISMODULE_EVENT_FORK_CHILD},
        std::uint64_t{REDISMODULE_EVENT_REPLICATION_ROLE_CHANGED}}) {
    RedisModule_SubscribeToServerEvent(
        ctx, RedisModuleEvent{event, 1},
        [](RedisModuleCtx*, RedisModuleEvent, std::uint64_t, void*) { forget_who_receives(); });
  }
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
