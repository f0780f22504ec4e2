// DMA.HELLO and DMA.PROVE: a connection's session, proven before it may transfer (core.hpp,
// Sessions, says why). Nothing is ever written to an address before its session is proven.
#include <string>

#include "blocking.hpp"
#include "commands.hpp"
#include "dma/protocol.hpp"
#include "state.hpp"

namespace dma::module {
namespace {

// DMA.PROVE's reply: the read landed (or failed); only the nonce, byte for byte, proves.
int reply_proof(RedisModuleCtx* ctx, RedisModuleString** /*argv*/, int /*argc*/) {
  auto* context = static_cast<TransferContext*>(RedisModule_GetBlockedClientPrivateData(ctx));
  const Outcome& outcome = *context->outcome;
  const std::uint64_t client_id = context->client_id();
  if (!outcome) {
    refuse_session(client_id);
    return reply_error(ctx, ErrorCode::kInvalidArgument,
                       "proof refused: could not read the nonce from the advertised address (" +
                           outcome.error().describe() +
                           "); the session is closed (say DMA.HELLO again)");
  }
  if (Status proven = state->sessions.finish_proof(client_id, context->bytes()); !proven) {
    refuse_session(client_id);
    return reply_error(ctx, proven.error());
  }
  return RedisModule_ReplyWithSimpleString(ctx, "OK");
}

}  // namespace

// DMA.HELLO <client-address-hex>  ->  [<nonce-hex>, [<server-endpoint-address-hex>, ...],
//                                      <inline-max>]
// Opens an unproven session for this connection and adds the address as its peer. inline-max
// tells the client the largest value a DMA.GET ... INLINE answers in its reply.
int hello_command(RedisModuleCtx* ctx, RedisModuleString** argv, int argc) {
  if (argc != 2) return RedisModule_WrongArity(ctx);
  const std::uint64_t client_id = RedisModule_GetClientId(ctx);
  if (state->sessions.contains(client_id)) {
    return reply_error(ctx, ErrorCode::kInvalidArgument,
                       "this connection already has a session (one DMA.HELLO per connection)");
  }
  auto address = hex_decode(view_of(argv[1]));
  if (!address) return reply_error(ctx, address.error());
  if (address->empty()) return reply_error(ctx, ErrorCode::kInvalidArgument, "empty address");
  if (!state->services) return reply_error(ctx, ErrorCode::kWorkerGone, "the server is shutting down");
  auto nonce = make_nonce();
  if (!nonce) return reply_error(ctx, nonce.error());
  if (Status added = state->services->add_peer(client_id, *address); !added) {
    return reply_error(ctx, added.error());
  }
  if (Status opened = state->sessions.open(client_id, *nonce, state->services->generation());
      !opened) {
    state->services->remove_peer(client_id);
    return reply_error(ctx, opened.error());
  }
  publish_session_count();
  const std::string nonce_hex = hex_encode(*nonce);
  const auto addresses = state->services->local_addresses();
  RedisModule_ReplyWithArray(ctx, 3);
  RedisModule_ReplyWithStringBuffer(ctx, nonce_hex.data(), nonce_hex.size());
  RedisModule_ReplyWithArray(ctx, static_cast<long>(addresses.size()));
  for (const auto& bytes : addresses) {
    const std::string hex = hex_encode(bytes);
    RedisModule_ReplyWithStringBuffer(ctx, hex.data(), hex.size());
  }
  RedisModule_ReplyWithLongLong(ctx, static_cast<long long>(state->options.inline_max));
  return REDISMODULE_OK;
}

// DMA.PROVE <rkey> <addr> <len>  ->  OK once the server has read the nonce back from there.
// One attempt per hello: any failure after the session is found ends the session and removes
// the peer; the connection may then say DMA.HELLO again (and gets a new nonce).
int prove_command(RedisModuleCtx* ctx, RedisModuleString** argv, int argc) {
  if (argc != 4) return RedisModule_WrongArity(ctx);
  const std::uint64_t client_id = RedisModule_GetClientId(ctx);
  if (!may_block(ctx)) return REDISMODULE_OK;
  if (rehello_if_stale(ctx, client_id)) return REDISMODULE_OK;
  if (auto started = state->sessions.begin_proof(client_id); !started) {
    return reply_error(ctx, started.error());
  }
  const auto fields = fields_of(argv, 1, argc);
  auto regions = parse_regions(fields);
  if (!regions || regions->capacity != kNonceBytes) {
    refuse_session(client_id);
    return reply_error(ctx, ErrorCode::kInvalidArgument,
                       "proof refused: " +
                           (regions ? "the proof is the nonce's " + std::to_string(kNonceBytes) +
                                          " bytes, not " + std::to_string(regions->capacity)
                                    : regions.error().message()) +
                           "; the session is closed (say DMA.HELLO again)");
  }
  auto landing = state->arena->allocate(kNonceBytes);
  if (!landing) {
    refuse_session(client_id);
    return reply_error(ctx, landing.error());
  }
  TransferRequest request;
  request.client_id = client_id;
  request.regions = std::move(regions->regions);
  request.direction = Direction::kFromPeer;
  request.length = kNonceBytes;
  return block_and_submit(ctx, TransferContext::for_proof(client_id, std::move(*landing)),
                          std::move(request), reply_proof);
}

}  // namespace dma::module
