// Blocking a client on a transfer and handing the transfer back (blocking.hpp).
#include "blocking.hpp"

#include <chrono>
#include <utility>

#include "state.hpp"

namespace dma::module {
namespace {

int reply_timeout(RedisModuleCtx* ctx, RedisModuleString** /*argv*/, int /*argc*/) {
  state->counters.errors.fetch_add(1, std::memory_order_relaxed);
  return reply_error(ctx, ErrorCode::kTimedOut,
                     "the DMA transfer did not complete in time; for a SET the key is unchanged");
}

void free_context(RedisModuleCtx* /*ctx*/, void* privdata) {
  delete static_cast<TransferContext*>(privdata);
}

// Runs on the worker thread when a transfer expires: the client gets its error now; the
// transfer's own context stays with the service until the provider lets go of its bytes.
void answer_expired(std::unique_ptr<TransferContext> answer) {
  state->counters.errors.fetch_add(1, std::memory_order_relaxed);
  state->counters.in_flight.fetch_sub(1, std::memory_order_relaxed);
  auto* blocked = static_cast<RedisModuleBlockedClient*>(answer->blocked);
  RedisModule_UnblockClient(blocked, answer.release());
}

}  // namespace

// Hands each finished transfer back to its blocked client.
void complete_batch(std::span<Completion> batch) {
  for (Completion& completion : batch) {
    auto* context = static_cast<TransferContext*>(completion.context.release());
    if (context->blocked == nullptr) {
      // Expired and already answered (answer_expired); the provider has let go of its bytes.
      delete context;
      continue;
    }
    if (context->kind() == TransferContext::Kind::kProve) {
      // Counted by reply_proof (a refused proof), not as traffic.
    } else if (completion.outcome) {
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

int block_and_submit(RedisModuleCtx* ctx, std::unique_ptr<TransferContext> context,
                     TransferRequest request, RedisModuleCmdFunc reply) {
  const Configuration& configuration = state->options.configuration;
  // A safety net only: the service fails every transfer by its own deadlines first.
  const long long timeout_ms = 30000 + configuration.progress_deadline.count() +
                               configuration.completion_deadline.count();
  RedisModuleBlockedClient* blocked =
      RedisModule_BlockClient(ctx, reply, reply_timeout, free_context, timeout_ms);
  context->blocked = blocked;
  context->answer_early = answer_expired;
  TransferContext* raw = context.get();
  request.context = std::move(context);
  state->counters.in_flight.fetch_add(1, std::memory_order_relaxed);
  state->transfers.fetch_add(1, std::memory_order_relaxed);
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

}  // namespace dma::module
