// The redis:: helpers of include/dma/client.hpp: one binary-safe hiredis command as an argv,
// cluster key slots and redirections. dma::Client speaks through them, and so do the tests',
// tools' and benchmark's plain connections.
#include <hiredis/hiredis.h>

#include <charconv>
#include <cstdint>
#include <string>
#include <vector>

#include "dma/client.hpp"

namespace dma {
namespace redis {

void ReplyDeleter::operator()(redisReply* reply) const noexcept { freeReplyObject(reply); }

Status send(redisContext* connection, std::span<const std::string_view> arguments) {
  // hiredis wants two parallel arrays: on the stack for every command we send, on the heap only
  // past kOnStack arguments.
  constexpr std::size_t kOnStack = 16;
  const char* pointers_here[kOnStack];
  std::size_t lengths_here[kOnStack];
  std::vector<const char*> pointers_heap;
  std::vector<std::size_t> lengths_heap;
  const char** pointers = pointers_here;
  std::size_t* lengths = lengths_here;
  if (arguments.size() > kOnStack) {
    pointers_heap.resize(arguments.size());
    lengths_heap.resize(arguments.size());
    pointers = pointers_heap.data();
    lengths = lengths_heap.data();
  }
  for (std::size_t index = 0; index < arguments.size(); ++index) {
    pointers[index] = arguments[index].data();
    lengths[index] = arguments[index].size();
  }
  if (redisAppendCommandArgv(connection, static_cast<int>(arguments.size()), pointers,
                             lengths) != REDIS_OK) {
    return fail(ErrorCode::kResourceExhausted, "cannot queue a redis command");
  }
  int done = 0;
  while (done == 0) {
    if (redisBufferWrite(connection, &done) != REDIS_OK) {
      return fail(ErrorCode::kUnreachable,
                  std::string("redis connection failed: ") + connection->errstr);
    }
  }
  return {};
}

Result<Reply> receive(redisContext* connection) {
  void* reply = nullptr;
  if (redisGetReply(connection, &reply) != REDIS_OK || reply == nullptr) {
    return fail(ErrorCode::kUnreachable,
                std::string("redis connection failed: ") + connection->errstr);
  }
  return Reply(static_cast<redisReply*>(reply));
}

Result<Reply> command(redisContext* connection, std::span<const std::string_view> arguments) {
  DMA_TRY(send(connection, arguments));
  DMA_TRY_ASSIGN(Reply reply, receive(connection));
  if (reply->type == REDIS_REPLY_ERROR) {
    return fail(ErrorCode::kInvalidArgument, std::string(arguments.empty() ? "" : arguments[0]) +
                                                 " failed: " + std::string(reply->str, reply->len));
  }
  return reply;
}

Result<Reply> command(redisContext* connection, std::initializer_list<std::string_view> arguments) {
  return command(connection, std::span<const std::string_view>(arguments.begin(), arguments.size()));
}

int key_slot(std::string_view key) noexcept {
  // Redis Cluster's key hash tag: the part between the first '{' and the next '}', if any.
  if (const std::size_t open = key.find('{'); open != std::string_view::npos) {
    const std::size_t close = key.find('}', open + 1);
    if (close != std::string_view::npos && close != open + 1) {
      key = key.substr(open + 1, close - open - 1);
    }
  }
  // CRC16/XMODEM (polynomial 0x1021, initial 0), as the cluster specification defines it.
  std::uint16_t crc = 0;
  for (const char c : key) {
    crc ^= static_cast<std::uint16_t>(static_cast<unsigned char>(c) << 8);
    for (int bit = 0; bit < 8; ++bit) {
      crc = (crc & 0x8000) ? static_cast<std::uint16_t>((crc << 1) ^ 0x1021)
                           : static_cast<std::uint16_t>(crc << 1);
    }
  }
  return crc & 16383;
}

std::optional<Redirection> parse_redirection(std::string_view error) {
  Redirection out;
  if (error.starts_with("MOVED ")) {
    error.remove_prefix(6);
  } else if (error.starts_with("ASK ")) {
    out.ask = true;
    error.remove_prefix(4);
  } else {
    return std::nullopt;
  }
  const std::size_t space = error.find(' ');
  if (space == std::string_view::npos) return std::nullopt;
  const std::string_view slot = error.substr(0, space);
  const std::string_view address = error.substr(space + 1);
  const std::size_t colon = address.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return std::nullopt;
  const std::string_view port = address.substr(colon + 1);
  const auto slot_parsed = std::from_chars(slot.data(), slot.data() + slot.size(), out.slot);
  const auto port_parsed = std::from_chars(port.data(), port.data() + port.size(), out.port);
  if (slot_parsed.ec != std::errc() || slot_parsed.ptr != slot.data() + slot.size() ||
      port_parsed.ec != std::errc() || port_parsed.ptr != port.data() + port.size() ||
      out.slot < 0 || out.slot >= 16384 || out.port <= 0 || out.port > 65535) {
    return std::nullopt;
  }
  out.host = std::string(address.substr(0, colon));
  return out;
}

}  // namespace redis

}  // namespace dma
