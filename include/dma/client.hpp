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

  // DMA.GET into `buffer`: the value's length, or nullopt if the key does not exist. Fails if
  // the buffer is too small, and with kCorrupted if the bytes that landed do not match the
  // server's CRC32C.
  Result<std::optional<std::size_t>> get(std::string_view key, std::span<std::byte> buffer);
  // DMA.SET of `value`, with its CRC32C so the server refuses bytes that arrive damaged.
  Status set(std::string_view key, std::span<const std::byte> value);

  // The same with buffers the caller exposed on target() and keeps exposed across calls: the
  // calls above register their buffer every time, which costs more than a small transfer
  // (docs/PERFORMANCE.md). get() lands in all of `landing`; set() sends its first `length`
  // bytes. The caller must not touch the buffer while a call is in progress, and may once it
  // returns (both calls synchronize with the target's progress, Target::synchronize()).
  Result<std::optional<std::size_t>> get(std::string_view key, const Exposed& landing);
  Status set(std::string_view key, const Exposed& value, std::size_t length);

  // The server's endpoint addresses from hello(), and this client's target.
  const std::vector<std::vector<std::uint8_t>>& server_addresses() const noexcept {
    return server_addresses_;
  }
  Target& target() noexcept { return *target_; }

 private:
  Client(redisContext* connection, std::unique_ptr<Target> target, bool busy_poll);
  // A Busy token when busy_poll is on, else an empty one.
  Target::Busy busy();
  redisContext* connection_;
  bool busy_poll_;
  std::unique_ptr<Target> target_;
  std::vector<std::vector<std::uint8_t>> server_addresses_;
};

}  // namespace dma
