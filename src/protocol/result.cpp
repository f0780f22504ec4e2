#include "dma/result.hpp"

namespace dma {

std::string_view to_string(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::kInvalidArgument:
      return "invalid argument";
    case ErrorCode::kConfiguration:
      return "configuration";
    case ErrorCode::kFabric:
      return "fabric";
    case ErrorCode::kUnreachable:
      return "unreachable";
    case ErrorCode::kTimedOut:
      return "timed out";
    case ErrorCode::kWorkerGone:
      return "worker gone";
    case ErrorCode::kNotFound:
      return "not found";
    case ErrorCode::kResourceExhausted:
      return "resource exhausted";
    case ErrorCode::kCorrupted:
      return "corrupted";
  }
  // Only reachable through a cast of an out-of-range integer.
  return "unknown error";
}

std::string Error::describe() const {
  std::string_view kind = to_string(code_);
  std::string text;
  text.reserve(kind.size() + 2 + message_.size());
  text.append(kind);
  text.append(": ");
  text.append(message_);
  return text;
}

}  // namespace dma
