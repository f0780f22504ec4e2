#include "support/redis_connection.hpp"

#include <hiredis/hiredis.h>

#include <cstdlib>

namespace dma::support {

Result<std::unique_ptr<RedisConnection>> RedisConnection::open(const std::string& host, int port,
                                                               std::chrono::milliseconds timeout) {
  const timeval limit{static_cast<time_t>(timeout.count() / 1000),
                      static_cast<suseconds_t>((timeout.count() % 1000) * 1000)};
  redisContext* context = redisConnectWithTimeout(host.c_str(), port, limit);
  if (context == nullptr) return fail(ErrorCode::kResourceExhausted, "cannot allocate hiredis");
  if (context->err != 0) {
    std::string message =
        "cannot connect to " + host + ":" + std::to_string(port) + ": " + context->errstr;
    redisFree(context);
    return fail(ErrorCode::kUnreachable, std::move(message));
  }
  redisSetTimeout(context, limit);
  return std::unique_ptr<RedisConnection>(new RedisConnection(context));
}

RedisConnection::~RedisConnection() { redisFree(context_); }

Result<Reply> RedisConnection::command(std::span<const std::string_view> arguments) {
  return redis::command(context_, arguments);
}

Result<Reply> RedisConnection::command(std::initializer_list<std::string_view> arguments) {
  return redis::command(context_, arguments);
}

Result<Reply> RedisConnection::round_trip(std::span<const std::string_view> arguments) {
  DMA_TRY(redis::send(context_, arguments));
  return redis::receive(context_);
}

Status RedisConnection::send(std::span<const std::string_view> arguments) {
  return redis::send(context_, arguments);
}

Result<Reply> RedisConnection::receive() { return redis::receive(context_); }

std::optional<long long> RedisConnection::info_field(std::string_view section,
                                                     std::string_view name) {
  const auto text = info_text(section, name);
  if (!text) return std::nullopt;
  return std::strtoll(text->c_str(), nullptr, 10);
}

std::optional<std::string> RedisConnection::info_text(std::string_view section,
                                                      std::string_view name) {
  auto reply = command({"INFO", section});
  if (!reply || (*reply)->type != REDIS_REPLY_STRING) return std::nullopt;
  const std::string text = "\n" + std::string((*reply)->str, (*reply)->len);
  const std::string label = "\n" + std::string(name) + ":";
  const std::size_t at = text.find(label);
  if (at == std::string::npos) return std::nullopt;
  const std::size_t start = at + label.size();
  const std::size_t end = text.find_first_of("\r\n", start);
  return text.substr(start, end == std::string::npos ? std::string::npos : end - start);
}

std::string error_text(const Reply& reply) {
  if (!reply) return "<no reply>";
  if (reply->type != REDIS_REPLY_ERROR) {
    return "<not an error, type " + std::to_string(reply->type) + ">";
  }
  return std::string(reply->str, reply->len);
}

std::string_view reply_text(const Reply& reply) {
  if (!reply || reply->type != REDIS_REPLY_STRING) return {};
  return {reply->str, reply->len};
}

}  // namespace dma::support
