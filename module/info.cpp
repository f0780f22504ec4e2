// DMA.INFO (counters and one entry per endpoint) and the `INFO dma` section.
#include <cstdio>
#include <cstring>
#include <string>

#include "commands.hpp"
#include "dma/memory.hpp"
#include "dma/protocol.hpp"
#include "state.hpp"
#include "transfer.hpp"

namespace dma::module {
namespace {

void reply_counter(RedisModuleCtx* ctx, const char* name, std::uint64_t value) {
  RedisModule_ReplyWithStringBuffer(ctx, name, std::strlen(name));
  RedisModule_ReplyWithLongLong(ctx, static_cast<long long>(value));
}

}  // namespace

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

void on_info(RedisModuleInfoCtx* ctx, int /*for_crash_report*/) {
  const Counters& counters = state->counters;
  RedisModule_InfoAddSection(ctx, "");
  RedisModule_InfoAddFieldULongLong(ctx, "sessions",
                                    counters.sessions.load(std::memory_order_relaxed));
  RedisModule_InfoAddFieldULongLong(ctx, "sessions_proven", state->sessions.proven());
  RedisModule_InfoAddFieldULongLong(ctx, "proofs_refused",
                                    counters.proofs_refused.load(std::memory_order_relaxed));
  RedisModule_InfoAddFieldULongLong(ctx, "rehellos",
                                    counters.rehellos.load(std::memory_order_relaxed));
  RedisModule_InfoAddFieldULongLong(ctx, "endpoints",
                                    state->services ? state->services->size() : 0);
  {
    // Endpoint replacements (asked, or a wedge the service noticed) and endpoints abandoned
    // because they could not drain; generation: ServiceSet::generation().
    std::uint64_t replacements = 0;
    std::uint64_t abandoned = 0;
    const std::size_t services = state->services ? state->services->size() : 0;
    for (std::size_t index = 0; index < services; ++index) {
      const ServiceCounters one = state->services->at(index).counters();
      replacements += one.replacements;
      abandoned += one.abandoned;
    }
    RedisModule_InfoAddFieldULongLong(ctx, "endpoint_replacements", replacements);
    RedisModule_InfoAddFieldULongLong(ctx, "endpoints_abandoned", abandoned);
    RedisModule_InfoAddFieldULongLong(ctx, "endpoint_generation",
                                      state->services ? state->services->generation() : 0);
  }
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
  // 1: the arena is advised onto transparent huge pages (load argument arena-huge-pages).
  RedisModule_InfoAddFieldULongLong(ctx, "arena_huge_pages", state->arena->huge_pages() ? 1 : 0);
  // What the arena adds to the server's used_memory (store/ballast.hpp).
  RedisModule_InfoAddFieldULongLong(ctx, "used_memory_charged", state->ballast->held());
  RedisModule_InfoAddFieldULongLong(ctx, "used_memory_charge_refused", state->ballast->refused());
  const std::string fork_safety(fork_safety_name(state->fork_safety));
  RedisModule_InfoAddFieldCString(ctx, "fork_safety", fork_safety.c_str());
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
  RedisModule_InfoAddFieldULongLong(ctx, "writes_replicated",
                                    counters.writes_replicated.load(std::memory_order_relaxed));
  RedisModule_InfoAddFieldULongLong(ctx, "writes_unpropagated",
                                    counters.writes_unpropagated.load(std::memory_order_relaxed));
  RedisModule_InfoAddFieldULongLong(ctx, "conditions_failed",
                                    counters.conditions_failed.load(std::memory_order_relaxed));
  RedisModule_InfoAddFieldULongLong(ctx, "writes_refused_late",
                                    counters.writes_refused_late.load(std::memory_order_relaxed));
  RedisModule_InfoAddFieldULongLong(ctx, "inline_gets",
                                    counters.inline_gets.load(std::memory_order_relaxed));
  RedisModule_InfoAddFieldULongLong(ctx, "inline_max", state->options.inline_max);
  // Transfer contexts taken from the heap (not the free list) since load: flat in steady state.
  RedisModule_InfoAddFieldULongLong(ctx, "context_allocations",
                                    TransferContext::context_allocations());
}

}  // namespace dma::module
