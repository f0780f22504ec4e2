// Error and Result: the one way every fallible dma function reports failure.
//
// Result<T> is shaped like std::expected<T, Error> (value(), error(), has_value(), operator bool,
// operator*, operator->) so it can be swapped for it once the toolchains allow. It never throws;
// calling value() on an error, or error() on a value, is a programming error and aborts.
//
// Thread-safety: plain value types.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include "dma/export.hpp"

namespace dma {

// What kind of failure, for callers that branch on it; the message says exactly what happened.
enum class ErrorCode : std::uint8_t {
  kInvalidArgument,   // the caller's input is malformed or out of range
  kConfiguration,     // a configuration file or option is wrong
  kFabric,            // libfabric refused or failed an operation
  kUnreachable,       // the peer never accepted the operation before the progress deadline
  kTimedOut,          // a wait (or a posted operation) passed its deadline
  kWorkerGone,        // the service's worker thread has exited
  kNotFound,          // no such provider, domain, peer or key
  kResourceExhausted, // a queue, address vector or memory limit is full
  kCorrupted,         // a checksum did not match
};

DMA_EXPORT std::string_view to_string(ErrorCode code) noexcept;

class DMA_EXPORT Error {
 public:
  Error(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}

  ErrorCode code() const noexcept { return code_; }
  const std::string& message() const noexcept { return message_; }
  // "<kind>: <message>", for logs and error replies.
  std::string describe() const;

 private:
  ErrorCode code_;
  std::string message_;
};

// Carries an Error into a Result, like std::unexpected.
struct Unexpected {
  Error error;
};
inline Unexpected fail(ErrorCode code, std::string message) {
  return Unexpected{Error(code, std::move(message))};
}
inline Unexpected fail(Error error) { return Unexpected{std::move(error)}; }

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : state_(std::in_place_index<0>, std::move(value)) {}  // NOLINT: implicit like expected
  Result(Unexpected unexpected) : state_(std::in_place_index<1>, std::move(unexpected.error)) {}  // NOLINT

  bool has_value() const noexcept { return state_.index() == 0; }
  explicit operator bool() const noexcept { return has_value(); }

  T& value() & { check(true); return std::get<0>(state_); }
  const T& value() const& { check(true); return std::get<0>(state_); }
  T&& value() && { check(true); return std::get<0>(std::move(state_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  const Error& error() const& { check(false); return std::get<1>(state_); }
  Error&& error() && { check(false); return std::get<1>(std::move(state_)); }

 private:
  void check(bool want_value) const {
    if (has_value() != want_value) std::abort();
  }
  std::variant<T, Error> state_;
};

template <>
class [[nodiscard]] Result<void> {
 public:
  Result() = default;
  Result(Unexpected unexpected) : error_(std::move(unexpected.error)), failed_(true) {}  // NOLINT

  bool has_value() const noexcept { return !failed_; }
  explicit operator bool() const noexcept { return has_value(); }
  void value() const {
    if (failed_) std::abort();
  }
  const Error& error() const& {
    if (!failed_) std::abort();
    return error_;
  }
  Error&& error() && {
    if (!failed_) std::abort();
    return std::move(error_);
  }

 private:
  Error error_{ErrorCode::kInvalidArgument, {}};
  bool failed_ = false;
};

using Status = Result<void>;

}  // namespace dma

// Propagating an error: the one way a fallible function hands a callee's failure up unchanged.
// Both work in any function returning a Result<T> (Status included).
//
//   DMA_TRY(endpoint->bind(queue));                 // returns its error, or carries on
//   DMA_TRY_ASSIGN(InfoPtr info, query(hints));     // declares `info` from the value, or returns
//   DMA_TRY_ASSIGN(existing, reopen());             // or assigns to an existing variable
#define DMA_TRY(expression)                                                   \
  do {                                                                        \
    if (auto dma_try_status_ = (expression); !dma_try_status_) {              \
      return ::dma::fail(std::move(dma_try_status_).error());                 \
    }                                                                         \
  } while (false)
#define DMA_TRY_ASSIGN(target, expression) \
  DMA_TRY_ASSIGN_IMPL_(DMA_TRY_JOIN_(dma_try_result_, __LINE__), target, expression)
#define DMA_TRY_JOIN_(a, b) DMA_TRY_JOIN2_(a, b)
#define DMA_TRY_JOIN2_(a, b) a##b
#define DMA_TRY_ASSIGN_IMPL_(temporary, target, expression)               \
  auto temporary = (expression);                                          \
  if (!temporary) return ::dma::fail(std::move(temporary).error());       \
  target = std::move(temporary).value()
