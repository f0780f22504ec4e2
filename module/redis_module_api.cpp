// The module API pointers and their lookup by name (see redis_module_api.h).
#include "redis_module_api.h"

int (*RedisModule_GetApi)(const char*, void*) = nullptr;
void (*RedisModule_SetModuleAttribs)(RedisModuleCtx*, const char*, int, int) = nullptr;
int (*RedisModule_IsModuleNameBusy)(const char*) = nullptr;
int (*RedisModule_CreateCommand)(RedisModuleCtx*, const char*, RedisModuleCmdFunc, const char*,
                                 int, int, int) = nullptr;
int (*RedisModule_WrongArity)(RedisModuleCtx*) = nullptr;
int (*RedisModule_ReplyWithLongLong)(RedisModuleCtx*, long long) = nullptr;
int (*RedisModule_ReplyWithError)(RedisModuleCtx*, const char*) = nullptr;
int (*RedisModule_ReplyWithSimpleString)(RedisModuleCtx*, const char*) = nullptr;
int (*RedisModule_ReplyWithArray)(RedisModuleCtx*, long) = nullptr;
int (*RedisModule_ReplyWithStringBuffer)(RedisModuleCtx*, const char*, size_t) = nullptr;
int (*RedisModule_ReplyWithNull)(RedisModuleCtx*) = nullptr;
void* (*RedisModule_OpenKey)(RedisModuleCtx*, RedisModuleString*, int) = nullptr;
void (*RedisModule_CloseKey)(RedisModuleKey*) = nullptr;
int (*RedisModule_KeyType)(RedisModuleKey*) = nullptr;
size_t (*RedisModule_ValueLength)(RedisModuleKey*) = nullptr;
RedisModuleString* (*RedisModule_CreateString)(RedisModuleCtx*, const char*, size_t) = nullptr;
void (*RedisModule_FreeString)(RedisModuleCtx*, RedisModuleString*) = nullptr;
const char* (*RedisModule_StringPtrLen)(const RedisModuleString*, size_t*) = nullptr;
int (*RedisModule_StringSet)(RedisModuleKey*, RedisModuleString*) = nullptr;
char* (*RedisModule_StringDMA)(RedisModuleKey*, size_t*, int) = nullptr;
int (*RedisModule_GetContextFlags)(RedisModuleCtx*) = nullptr;
unsigned long long (*RedisModule_GetClientId)(RedisModuleCtx*) = nullptr;
void (*RedisModule_Log)(RedisModuleCtx*, const char*, const char*, ...) = nullptr;
RedisModuleBlockedClient* (*RedisModule_BlockClient)(RedisModuleCtx*, RedisModuleCmdFunc,
                                                     RedisModuleCmdFunc,
                                                     RedisModuleFreePrivdataFunc,
                                                     long long) = nullptr;
int (*RedisModule_UnblockClient)(RedisModuleBlockedClient*, void*) = nullptr;
void* (*RedisModule_GetBlockedClientPrivateData)(RedisModuleCtx*) = nullptr;
int (*RedisModule_SubscribeToServerEvent)(RedisModuleCtx*, RedisModuleEvent,
                                          RedisModuleEventCallback) = nullptr;
int (*RedisModule_RegisterInfoFunc)(RedisModuleCtx*, RedisModuleInfoFunc) = nullptr;
int (*RedisModule_InfoAddSection)(RedisModuleInfoCtx*, const char*) = nullptr;
int (*RedisModule_InfoAddFieldULongLong)(RedisModuleInfoCtx*, const char*,
                                         unsigned long long) = nullptr;
int (*RedisModule_InfoAddFieldCString)(RedisModuleInfoCtx*, const char*, const char*) = nullptr;
RedisModuleType* (*RedisModule_CreateDataType)(RedisModuleCtx*, const char*, int,
                                               RedisModuleTypeMethods*) = nullptr;
int (*RedisModule_ModuleTypeSetValue)(RedisModuleKey*, RedisModuleType*, void*) = nullptr;
int (*RedisModule_ModuleTypeReplaceValue)(RedisModuleKey*, RedisModuleType*, void*, void**) =
    nullptr;
RedisModuleType* (*RedisModule_ModuleTypeGetType)(RedisModuleKey*) = nullptr;
void* (*RedisModule_ModuleTypeGetValue)(RedisModuleKey*) = nullptr;
void (*RedisModule_SaveUnsigned)(RedisModuleIO*, uint64_t) = nullptr;
uint64_t (*RedisModule_LoadUnsigned)(RedisModuleIO*) = nullptr;
void (*RedisModule_SaveStringBuffer)(RedisModuleIO*, const char*, size_t) = nullptr;
char* (*RedisModule_LoadStringBuffer)(RedisModuleIO*, size_t*) = nullptr;
int (*RedisModule_IsIOError)(RedisModuleIO*) = nullptr;
void (*RedisModule_EmitAOF)(RedisModuleIO*, const char*, const char*, ...) = nullptr;
void (*RedisModule_LogIOError)(RedisModuleIO*, const char*, const char*, ...) = nullptr;
void (*RedisModule_Free)(void*) = nullptr;
void* (*RedisModule_TryAlloc)(size_t) = nullptr;
int (*RedisModule_Replicate)(RedisModuleCtx*, const char*, const char*, ...) = nullptr;
int (*RedisModule_ReplicateVerbatim)(RedisModuleCtx*) = nullptr;
int (*RedisModule_SignalModifiedKey)(RedisModuleCtx*, RedisModuleString*) = nullptr;
int (*RedisModule_NotifyKeyspaceEvent)(RedisModuleCtx*, int, const char*,
                                       RedisModuleString*) = nullptr;
long long (*RedisModule_GetAbsExpire)(RedisModuleKey*) = nullptr;
int (*RedisModule_SetAbsExpire)(RedisModuleKey*, long long) = nullptr;
long long (*RedisModule_Milliseconds)(void) = nullptr;
void (*RedisModule_SetModuleOptions)(RedisModuleCtx*, int) = nullptr;
RedisModuleCallReply* (*RedisModule_Call)(RedisModuleCtx*, const char*, const char*, ...) = nullptr;
void (*RedisModule_FreeCallReply)(RedisModuleCallReply*) = nullptr;
RedisModuleServerInfoData* (*RedisModule_GetServerInfo)(RedisModuleCtx*, const char*) = nullptr;
void (*RedisModule_FreeServerInfo)(RedisModuleCtx*, RedisModuleServerInfoData*) = nullptr;
unsigned long long (*RedisModule_ServerInfoGetFieldUnsigned)(RedisModuleServerInfoData*,
                                                             const char*, int*) = nullptr;

#define DMA_GET_API(name) \
  (RedisModule_GetApi("RedisModule_" #name, reinterpret_cast<void*>(&RedisModule_##name)) == \
   REDISMODULE_OK)

int redis_module_init(RedisModuleCtx* ctx, const char* name, int version, int api_version) {
  void* get_api = reinterpret_cast<void**>(ctx)[0];
  RedisModule_GetApi = reinterpret_cast<int (*)(const char*, void*)>(get_api);
  const bool resolved =
      DMA_GET_API(SetModuleAttribs) && DMA_GET_API(IsModuleNameBusy) &&
      DMA_GET_API(CreateCommand) && DMA_GET_API(WrongArity) && DMA_GET_API(ReplyWithLongLong) &&
      DMA_GET_API(ReplyWithError) && DMA_GET_API(ReplyWithSimpleString) &&
      DMA_GET_API(ReplyWithArray) && DMA_GET_API(ReplyWithStringBuffer) &&
      DMA_GET_API(ReplyWithNull) && DMA_GET_API(OpenKey) && DMA_GET_API(CloseKey) &&
      DMA_GET_API(KeyType) && DMA_GET_API(ValueLength) && DMA_GET_API(CreateString) &&
      DMA_GET_API(FreeString) && DMA_GET_API(StringPtrLen) && DMA_GET_API(StringSet) &&
      DMA_GET_API(StringDMA) && DMA_GET_API(GetContextFlags) && DMA_GET_API(GetClientId) &&
      DMA_GET_API(Log) && DMA_GET_API(BlockClient) && DMA_GET_API(UnblockClient) &&
      DMA_GET_API(GetBlockedClientPrivateData) && DMA_GET_API(SubscribeToServerEvent) &&
      DMA_GET_API(RegisterInfoFunc) && DMA_GET_API(InfoAddSection) &&
      DMA_GET_API(InfoAddFieldULongLong) && DMA_GET_API(InfoAddFieldCString) &&
      DMA_GET_API(CreateDataType) && DMA_GET_API(ModuleTypeSetValue) &&
      DMA_GET_API(ModuleTypeReplaceValue) && DMA_GET_API(ModuleTypeGetType) &&
      DMA_GET_API(ModuleTypeGetValue) &&
      DMA_GET_API(SaveUnsigned) && DMA_GET_API(LoadUnsigned) && DMA_GET_API(SaveStringBuffer) &&
      DMA_GET_API(LoadStringBuffer) && DMA_GET_API(IsIOError) && DMA_GET_API(EmitAOF) &&
      DMA_GET_API(LogIOError) && DMA_GET_API(Free) && DMA_GET_API(TryAlloc) &&
      DMA_GET_API(Replicate) && DMA_GET_API(ReplicateVerbatim) && DMA_GET_API(SignalModifiedKey) &&
      DMA_GET_API(NotifyKeyspaceEvent) && DMA_GET_API(GetAbsExpire) &&
      DMA_GET_API(SetAbsExpire) && DMA_GET_API(Milliseconds) && DMA_GET_API(SetModuleOptions) &&
      DMA_GET_API(Call) && DMA_GET_API(FreeCallReply) && DMA_GET_API(GetServerInfo) &&
      DMA_GET_API(FreeServerInfo) && DMA_GET_API(ServerInfoGetFieldUnsigned);
  if (!resolved) return REDISMODULE_ERR;
  if (RedisModule_IsModuleNameBusy(name)) return REDISMODULE_ERR;
  RedisModule_SetModuleAttribs(ctx, name, version, api_version);
  return REDISMODULE_OK;
}
