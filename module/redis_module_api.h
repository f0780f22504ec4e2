// The part of the Redis/Valkey module API this module uses, declared by hand because the server's
// redismodule.h is not packaged. Layout and values follow Redis 7.0's redismodule.h: every API
// function is a pointer the server fills in by name through RedisModule_GetApi, which the server
// passes as the first word of the context given to RedisModule_OnLoad (see redis_init below).
//
// Only what dma's module calls is here; add a declaration (and its lookup in
// redis_module_api.cpp) before calling anything else. Thread-safety is the server's: only
// RedisModule_UnblockClient may be called off the main thread here.
#pragma once

#include <cstddef>
#include <cstdint>

extern "C" {

#define REDISMODULE_OK 0
#define REDISMODULE_ERR 1
#define REDISMODULE_APIVER_1 1

#define REDISMODULE_READ (1 << 0)
#define REDISMODULE_WRITE (1 << 1)

#define REDISMODULE_KEYTYPE_EMPTY 0
#define REDISMODULE_KEYTYPE_STRING 1
#define REDISMODULE_KEYTYPE_MODULE 6

// RedisModuleTypeMethods up to `defrag` (version 3, Redis 6.2 and later).
#define REDISMODULE_TYPE_METHOD_VERSION_3 3

#define REDISMODULE_ERRORMSG_WRONGTYPE "WRONGTYPE Operation against a key holding the wrong kind of value"

// RedisModule_GetContextFlags: this server is a replica; appendonly is on; cluster mode is on;
// the command came over the replication link; the server is loading (RDB or AOF).
#define REDISMODULE_CTX_FLAGS_SLAVE (1 << 3)
#define REDISMODULE_CTX_FLAGS_AOF (1 << 6)
#define REDISMODULE_CTX_FLAGS_CLUSTER (1 << 5)
#define REDISMODULE_CTX_FLAGS_REPLICATED (1 << 12)
#define REDISMODULE_CTX_FLAGS_LOADING (1 << 13)
// The current client may not block: inside MULTI, Lua, or RM_Call from another module.
#define REDISMODULE_CTX_FLAGS_DENY_BLOCKING (1 << 21)

// RedisModule_GetAbsExpire: the key has no TTL.
#define REDISMODULE_NO_EXPIRE -1

// Keyspace notification classes (notify-keyspace-events "g" and "$").
#define REDISMODULE_NOTIFY_GENERIC (1 << 2)
#define REDISMODULE_NOTIFY_STRING (1 << 3)

// RedisModule_SetModuleOptions: closing a key opened for writing does not signal it as modified
// (WATCH, client-side caching); the module signals each real change itself.
#define REDISMODULE_OPTION_NO_IMPLICIT_SIGNAL_MODIFIED (1 << 1)

#define REDISMODULE_EVENT_REPLICATION_ROLE_CHANGED 0
#define REDISMODULE_EVENT_CLIENT_CHANGE 4
#define REDISMODULE_EVENT_SHUTDOWN 5
#define REDISMODULE_EVENT_FORK_CHILD 13
#define REDISMODULE_SUBEVENT_CLIENT_CHANGE_CONNECTED 0
#define REDISMODULE_SUBEVENT_CLIENT_CHANGE_DISCONNECTED 1

typedef struct RedisModuleCtx RedisModuleCtx;
typedef struct RedisModuleKey RedisModuleKey;
typedef struct RedisModuleString RedisModuleString;
typedef struct RedisModuleBlockedClient RedisModuleBlockedClient;
typedef struct RedisModuleInfoCtx RedisModuleInfoCtx;
typedef struct RedisModuleType RedisModuleType;
typedef struct RedisModuleIO RedisModuleIO;
typedef struct RedisModuleDigest RedisModuleDigest;
typedef struct RedisModuleDefragCtx RedisModuleDefragCtx;
typedef struct RedisModuleCallReply RedisModuleCallReply;
typedef struct RedisModuleServerInfoData RedisModuleServerInfoData;

typedef struct RedisModuleEvent {
  uint64_t id;       // REDISMODULE_EVENT_*
  uint64_t dataver;  // version of the structure passed as the callback's data
} RedisModuleEvent;

// What the ClientChange event passes as `data` (version 1).
typedef struct RedisModuleClientInfo {
  uint64_t version;
  uint64_t flags;
  uint64_t id;
  char addr[46];
  uint16_t port;
  uint16_t db;
} RedisModuleClientInfo;

typedef int (*RedisModuleCmdFunc)(RedisModuleCtx* ctx, RedisModuleString** argv, int argc);
typedef void (*RedisModuleEventCallback)(RedisModuleCtx* ctx, RedisModuleEvent eid,
                                         uint64_t subevent, void* data);
typedef void (*RedisModuleInfoFunc)(RedisModuleInfoCtx* ctx, int for_crash_report);
typedef void (*RedisModuleFreePrivdataFunc)(RedisModuleCtx* ctx, void* privdata);

typedef void* (*RedisModuleTypeLoadFunc)(RedisModuleIO* rdb, int encver);
typedef void (*RedisModuleTypeSaveFunc)(RedisModuleIO* rdb, void* value);
typedef int (*RedisModuleTypeAuxLoadFunc)(RedisModuleIO* rdb, int encver, int when);
typedef void (*RedisModuleTypeAuxSaveFunc)(RedisModuleIO* rdb, int when);
typedef void (*RedisModuleTypeRewriteFunc)(RedisModuleIO* aof, RedisModuleString* key, void* value);
typedef size_t (*RedisModuleTypeMemUsageFunc)(const void* value);
typedef void (*RedisModuleTypeDigestFunc)(RedisModuleDigest* digest, void* value);
typedef void (*RedisModuleTypeFreeFunc)(void* value);
typedef size_t (*RedisModuleTypeFreeEffortFunc)(RedisModuleString* key, const void* value);
typedef void (*RedisModuleTypeUnlinkFunc)(RedisModuleString* key, const void* value);
typedef void* (*RedisModuleTypeCopyFunc)(RedisModuleString* fromkey, RedisModuleString* tokey,
                                         const void* value);
typedef int (*RedisModuleTypeDefragFunc)(RedisModuleDefragCtx* ctx, RedisModuleString* key,
                                         void** value);

// The data type's callbacks, in redismodule.h's order (fields past `defrag` need version 4).
typedef struct RedisModuleTypeMethods {
  uint64_t version;
  RedisModuleTypeLoadFunc rdb_load;
  RedisModuleTypeSaveFunc rdb_save;
  RedisModuleTypeRewriteFunc aof_rewrite;
  RedisModuleTypeMemUsageFunc mem_usage;
  RedisModuleTypeDigestFunc digest;
  RedisModuleTypeFreeFunc free;
  RedisModuleTypeAuxLoadFunc aux_load;
  RedisModuleTypeAuxSaveFunc aux_save;
  int aux_save_triggers;
  RedisModuleTypeFreeEffortFunc free_effort;
  RedisModuleTypeUnlinkFunc unlink;
  RedisModuleTypeCopyFunc copy;
  RedisModuleTypeDefragFunc defrag;
} RedisModuleTypeMethods;

}  // extern "C"

// The pointers the server fills in (defined in redis_module_api.cpp).
extern int (*RedisModule_GetApi)(const char*, void*);
extern void (*RedisModule_SetModuleAttribs)(RedisModuleCtx*, const char*, int, int);
extern int (*RedisModule_IsModuleNameBusy)(const char*);
extern int (*RedisModule_CreateCommand)(RedisModuleCtx*, const char*, RedisModuleCmdFunc,
                                        const char*, int, int, int);
extern int (*RedisModule_WrongArity)(RedisModuleCtx*);
extern int (*RedisModule_ReplyWithLongLong)(RedisModuleCtx*, long long);
extern int (*RedisModule_ReplyWithError)(RedisModuleCtx*, const char*);
extern int (*RedisModule_ReplyWithSimpleString)(RedisModuleCtx*, const char*);
extern int (*RedisModule_ReplyWithArray)(RedisModuleCtx*, long);
extern int (*RedisModule_ReplyWithStringBuffer)(RedisModuleCtx*, const char*, size_t);
extern int (*RedisModule_ReplyWithNull)(RedisModuleCtx*);
extern void* (*RedisModule_OpenKey)(RedisModuleCtx*, RedisModuleString*, int);
extern void (*RedisModule_CloseKey)(RedisModuleKey*);
extern int (*RedisModule_KeyType)(RedisModuleKey*);
extern size_t (*RedisModule_ValueLength)(RedisModuleKey*);
extern RedisModuleString* (*RedisModule_CreateString)(RedisModuleCtx*, const char*, size_t);
extern void (*RedisModule_FreeString)(RedisModuleCtx*, RedisModuleString*);
extern const char* (*RedisModule_StringPtrLen)(const RedisModuleString*, size_t*);
extern int (*RedisModule_StringSet)(RedisModuleKey*, RedisModuleString*);
extern char* (*RedisModule_StringDMA)(RedisModuleKey*, size_t*, int);
extern int (*RedisModule_GetContextFlags)(RedisModuleCtx*);
extern unsigned long long (*RedisModule_GetClientId)(RedisModuleCtx*);
extern void (*RedisModule_Log)(RedisModuleCtx*, const char*, const char*, ...);
extern RedisModuleBlockedClient* (*RedisModule_BlockClient)(RedisModuleCtx*, RedisModuleCmdFunc,
                                                            RedisModuleCmdFunc,
                                                            RedisModuleFreePrivdataFunc, long long);
extern int (*RedisModule_UnblockClient)(RedisModuleBlockedClient*, void*);
extern void* (*RedisModule_GetBlockedClientPrivateData)(RedisModuleCtx*);
extern int (*RedisModule_SubscribeToServerEvent)(RedisModuleCtx*, RedisModuleEvent,
                                                 RedisModuleEventCallback);
extern int (*RedisModule_RegisterInfoFunc)(RedisModuleCtx*, RedisModuleInfoFunc);
extern int (*RedisModule_InfoAddSection)(RedisModuleInfoCtx*, const char*);
extern int (*RedisModule_InfoAddFieldULongLong)(RedisModuleInfoCtx*, const char*,
                                                unsigned long long);
extern int (*RedisModule_InfoAddFieldCString)(RedisModuleInfoCtx*, const char*, const char*);
extern RedisModuleType* (*RedisModule_CreateDataType)(RedisModuleCtx*, const char*, int,
                                                      RedisModuleTypeMethods*);
extern int (*RedisModule_ModuleTypeSetValue)(RedisModuleKey*, RedisModuleType*, void*);
extern int (*RedisModule_ModuleTypeReplaceValue)(RedisModuleKey*, RedisModuleType*, void*, void**);
extern RedisModuleType* (*RedisModule_ModuleTypeGetType)(RedisModuleKey*);
extern void* (*RedisModule_ModuleTypeGetValue)(RedisModuleKey*);
extern void (*RedisModule_SaveUnsigned)(RedisModuleIO*, uint64_t);
extern uint64_t (*RedisModule_LoadUnsigned)(RedisModuleIO*);
extern void (*RedisModule_SaveStringBuffer)(RedisModuleIO*, const char*, size_t);
extern char* (*RedisModule_LoadStringBuffer)(RedisModuleIO*, size_t*);
extern int (*RedisModule_IsIOError)(RedisModuleIO*);
extern void (*RedisModule_EmitAOF)(RedisModuleIO*, const char*, const char*, ...);
extern void (*RedisModule_LogIOError)(RedisModuleIO*, const char*, const char*, ...);
extern void (*RedisModule_Free)(void*);
// Counted in the server's used_memory (maxmemory, eviction); null when refused. Thread-safe.
extern void* (*RedisModule_TryAlloc)(size_t);
extern int (*RedisModule_Replicate)(RedisModuleCtx*, const char*, const char*, ...);
extern int (*RedisModule_ReplicateVerbatim)(RedisModuleCtx*);
extern int (*RedisModule_SignalModifiedKey)(RedisModuleCtx*, RedisModuleString*);
extern int (*RedisModule_NotifyKeyspaceEvent)(RedisModuleCtx*, int, const char*,
                                              RedisModuleString*);
extern long long (*RedisModule_GetAbsExpire)(RedisModuleKey*);
extern int (*RedisModule_SetAbsExpire)(RedisModuleKey*, long long);
extern long long (*RedisModule_Milliseconds)(void);
extern void (*RedisModule_SetModuleOptions)(RedisModuleCtx*, int);
extern RedisModuleCallReply* (*RedisModule_Call)(RedisModuleCtx*, const char*, const char*, ...);
extern void (*RedisModule_FreeCallReply)(RedisModuleCallReply*);
extern RedisModuleServerInfoData* (*RedisModule_GetServerInfo)(RedisModuleCtx*, const char*);
extern void (*RedisModule_FreeServerInfo)(RedisModuleCtx*, RedisModuleServerInfoData*);
extern unsigned long long (*RedisModule_ServerInfoGetFieldUnsigned)(RedisModuleServerInfoData*,
                                                                    const char*, int*);

// What RedisModule_Init does in redismodule.h: reads RedisModule_GetApi from the context's first
// word, resolves every pointer above by name, refuses a busy name, and sets the module's name and
// API version. REDISMODULE_ERR if any function is missing (a server too old for this module).
int redis_module_init(RedisModuleCtx* ctx, const char* name, int version, int api_version);
