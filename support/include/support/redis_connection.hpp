// RedisConnection: a plain hiredis connection owned by one object, for the tests (commands the
// Client never sends, malformed ones included), dma-demo's and the benchmark's plain GET/SET
// baseline, and their seeding and read-back. The argv handling is dma::redis's
// (dma/client.hpp), the one dma::Client uses.
//
// Ownership: owns its redisContext. Thread-safety: none; a hiredis context belongs to one
// thread at a time.
#pragma once

#include <chrono>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dma/client.hpp"
#include "dma/result.hpp"

struct redisContext;

namespace dma::support {

using redis::Reply;

class RedisConnection {
 public:
  // Connects to host:port; `timeout` bounds the connect and every later reply.
  static Result<std::unique_ptr<RedisConnection>> open(const std::string& host, int port,
                                                       std::chrono::milliseconds timeout);
  ~RedisConnection();
  RedisConnection(const RedisConnection&) = delete;
  RedisConnection& operator=(const RedisConnection&) = delete;

  // One command; a transport failure or an error reply is an Error ("<command> failed: ...").
  Result<Reply> command(std::span<const std::string_view> arguments);
  Result<Reply> command(std::initializer_list<std::string_view> arguments);
  // The same, but an error reply is returned as a reply (for callers checking its text).
  Result<Reply> round_trip(std::span<const std::string_view> arguments);
  // Pipelining: queue and write out a command now, read its reply later.
  Status send(std::span<const std::string_view> arguments);
  Result<Reply> receive();

  // A numeric field of `INFO <section>` (e.g. "used_memory_rss"), or nullopt if it is missing.
  std::optional<long long> info_field(std::string_view section, std::string_view name);
  // Any field of `INFO <section>` as text (e.g. "master_link_status"), or nullopt.
  std::optional<std::string> info_text(std::string_view section, std::string_view name);

 private:
  explicit RedisConnection(redisContext* context) : context_(context) {}
  redisContext* context_;
};

// The text of an error reply, or what the reply is instead ("<no reply>", "<not an error ...>").
std::string error_text(const Reply& reply);
// The bytes of a string reply as text; empty for any other reply.
std::string_view reply_text(const Reply& reply);
// `bytes` as a binary-safe command argument.
inline std::string_view as_text(std::span<const std::byte> bytes) {
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

}  // namespace dma::support
