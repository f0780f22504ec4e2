// A transfer's life as a blocked client: the command blocks its client and submits the
// transfer; the batch completer (worker or pool thread) hands each finished transfer back with
// RedisModule_UnblockClient (documented thread-safe); the command's reply callback then runs on
// the main thread with the context as the blocked client's private data.
//
// Ownership: a TransferContext is owned by the service while the transfer runs, then by the
// server as the blocked client's private data; free_context (the free-privdata callback)
// deletes it whether the client is still there, timed out or disconnected. A transfer that
// expires is answered at once through a bodiless copy (transfer.hpp, answer_early) while its
// own context stays with the service until the provider lets go of its bytes.
#pragma once

#include <memory>
#include <span>

#include "dma/service.hpp"
#include "redis_module_api.h"
#include "transfer.hpp"

namespace dma::module {

// Blocks the client and submits; `reply` (on the main thread) answers once the transfer is
// done. A submission the service refuses is answered through `reply` too, with its error.
int block_and_submit(RedisModuleCtx* ctx, std::unique_ptr<TransferContext> context,
                     TransferRequest request, RedisModuleCmdFunc reply);

// The services' batch completer: runs on a worker or pool thread.
void complete_batch(std::span<Completion> batch);

}  // namespace dma::module
