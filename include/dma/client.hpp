// dma::Client: the client side of the Redis/Valkey module. One hiredis connection and one
// dma::Target; values move over the fabric (the server writes GETs into and reads SETs out of
// this process's exposed buffers) while the connection carries only the small commands.
//
// Ownership: the Client owns its connection and its Target. Thread-safety: none. A hiredis
// context must not be shared between threads, and each session is bound to its connection,
// so use one Client per thread (each opens its own Target and says its own hello).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dma/export.hpp"
#include "dma/configuration.hpp"
#include "dma/result.hpp"
#include "dma/target.hpp"

struct redisContext;
struct redisReply;

namespace dma {

// One hiredis command as an argv (binary-safe: values may hold any byte). dma::Client speaks
// through these, and so do the tests', tools' and benchmark's plain connections
// (support/redis_connection.hpp), so the argv handling exists once. The caller owns the
// context; these only use it (blocking, with the context's timeout).
namespace redis {
struct DMA_EXPORT ReplyDeleter {
  void operator()(redisReply* reply) const noexcept;
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

// Queues `arguments` as one command and writes it out without waiting for the reply
// (pipelining). kUnreachable if the connection failed.
DMA_EXPORT Status send(redisContext* connection, std::span<const std::string_view> arguments);
// The next reply, error replies included. kUnreachable if the connection failed or timed out.
DMA_EXPORT Result<Reply> receive(redisContext* connection);
// send() then receive(); an error reply is a kInvalidArgument "<command> failed: <reply>".
DMA_EXPORT Result<Reply> command(redisContext* connection, std::span<const std::string_view> arguments);
DMA_EXPORT Result<Reply> command(redisContext* connection, std::initializer_list<std::string_view> arguments);
}  // namespace redis

class DMA_EXPORT Client {
 public:
  struct Options {
    // Bounds every round trip, the transfer included.
    std::chrono::milliseconds timeout{60000};
    // Hold a Target::Busy from each DMA command to its reply, so the target polls without
    // sleeping while the server transfers: the lowest latency for a client with a core to
    // spare. Off by default: with more waiting clients than cores, their polling takes the CPU
    // from the server they wait for (4 clients on 2 cores: DMA.GET 4 KiB over shm fell from
    // 0.40x to 0.03x of GET; docs/PERFORMANCE.md).
    bool busy_poll = false;
    // Values of at most this many bytes travel in the command or its reply instead of over the
    // fabric (DMA.GET ... INLINE, DMA.SETPLAIN): below it a round trip on the socket is cheaper
    // than exposing a buffer and a one-sided transfer (docs/PERFORMANCE.md, "Inline values").
    // The smaller of this and the server's inline-max (from DMA.HELLO) applies; 0: never.
    std::size_t inline_max = kDefaultInlineMax;
  };
  // Connects to host:port and opens a Target with `configuration` (the providers must match the
  // server's). Does not say hello: call hello() before get() or set().
  static Result<std::unique_ptr<Client>> connect(const std::string& host, int port,
                                                 const Configuration& configuration);
  static Result<std::unique_ptr<Client>> connect(const std::string& host, int port,
                                                 const Configuration& configuration,
                                                 Options options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // DMA.HELLO then DMA.PROVE: registers this target's address with the server, inserts every
  // server endpoint's address into the target (efa-direct requires it), then proves the address
  // is ours by exposing the server's nonce on the target for the server to read back. Once per
  // connection; after a failure the connection may try again.
  Status hello();

  // DMA.GET into `buffer`: the value's length, or nullopt if the key does not exist. Fails
  // (kInvalidArgument, naming both sizes, nothing written) if the buffer is too small, and with
  // kCorrupted if the bytes that landed do not match the server's CRC32C. A buffer of at most
  // inline_max bytes is never exposed: the value comes in the reply.
  Result<std::optional<std::size_t>> get(std::string_view key, std::span<std::byte> buffer);
  // The whole value in memory this call allocates, or nullopt if the key does not exist: one
  // round trip for a value of at most inline_max bytes, else one to learn the length and one
  // to transfer (retried if the value changed size in between, up to three times).
  Result<std::optional<std::vector<std::byte>>> get(std::string_view key);
  // The value's length, or nullopt if the key does not exist; nothing is transferred.
  Result<std::optional<std::size_t>> length(std::string_view key);
  // DMA.SET of `value`, with its CRC32C so the server refuses bytes that arrive damaged (a value
  // of at most inline_max bytes goes in the command, DMA.SETPLAIN, with the same check).
  Status set(std::string_view key, std::span<const std::byte> value);

  // The same with buffers the caller exposed on target() and keeps exposed across calls: the
  // calls above register their buffer every time, which costs more than a small transfer
  // (docs/PERFORMANCE.md). get() lands in all of `landing`; set() sends its first `length`
  // bytes. The caller must not touch the buffer while a call is in progress, and may once it
  // returns (both calls synchronize with the target's progress, Target::synchronize()). Values
  // of at most inline_max bytes still travel inline, copied into or out of the buffer.
  Result<std::optional<std::size_t>> get(std::string_view key, const Exposed& landing);
  Status set(std::string_view key, const Exposed& value, std::size_t length);

  // The largest value that travels inline: Options::inline_max capped by the server's
  // inline-max, known after hello() (0 before).
  std::size_t inline_max() const noexcept { return inline_max_; }
  // The server's endpoint addresses from hello(), and this client's target.
  const std::vector<std::vector<std::uint8_t>>& server_addresses() const noexcept {
    return server_addresses_;
  }
  Target& target() noexcept { return *target_; }

 private:
  Client(redisContext* connection, std::unique_ptr<Target> target, Options options);
  // DMA.GET <key> INLINE <most> [the whole of `landing`]: the reply, checked.
  struct Answer {
    std::uint64_t length = 0;
    std::uint32_t crc = 0;
    std::optional<std::span<const std::byte>> bytes;  // inline: in `reply`
    redis::Reply reply;
  };
  Result<std::optional<Answer>> get_inline(std::string_view key, std::size_t most,
                                           const Exposed* landing);
  Status set_inline(std::string_view key, std::span<const std::byte> value);
  // After a DMA.GET's write into `landing`: waits for it and checks its CRC32C.
  Result<std::optional<std::size_t>> check_landed(const Exposed& landing, std::uint64_t length,
                                                  std::uint32_t crc);
  // A Busy token when busy_poll is on, else an empty one.
  Target::Busy busy();
  redisContext* connection_;
  bool busy_poll_;
  std::size_t inline_wanted_;  // Options::inline_max
  std::size_t inline_max_ = 0;
  std::unique_ptr<Target> target_;
  std::vector<std::vector<std::uint8_t>> server_addresses_;
};

}  // namespace dma
