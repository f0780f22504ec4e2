// The module's commands, its INFO section and its data type, one file per concern:
//   session_commands.cpp  DMA.HELLO, DMA.PROVE (the session's proof)
//   value_commands.cpp    DMA.GET, DMA.SET, DMA.GETPLAIN, DMA.SETPLAIN
//   info.cpp              DMA.INFO and the `INFO dma` section
//   value_type.cpp        the `dma-value` data type's callbacks
// module.cpp lists them in one table and registers them. Every command runs on the server's
// main thread and replies (or blocks its client) before returning; none throws.
#pragma once

#include "redis_module_api.h"

namespace dma::module {

int hello_command(RedisModuleCtx* ctx, RedisModuleString** argv, int argc);
int prove_command(RedisModuleCtx* ctx, RedisModuleString** argv, int argc);
int get_command(RedisModuleCtx* ctx, RedisModuleString** argv, int argc);
int set_command(RedisModuleCtx* ctx, RedisModuleString** argv, int argc);
int getplain_command(RedisModuleCtx* ctx, RedisModuleString** argv, int argc);
int setplain_command(RedisModuleCtx* ctx, RedisModuleString** argv, int argc);
int info_command(RedisModuleCtx* ctx, RedisModuleString** argv, int argc);

void on_info(RedisModuleInfoCtx* ctx, int for_crash_report);

// Creates the `dma-value` data type (RDB save/load, AOF rewrite, memory usage, free, copy);
// null if the server refuses.
RedisModuleType* create_value_type(RedisModuleCtx* ctx);

}  // namespace dma::module
