// The module's server-independent logic: load arguments, DMA.GET/DMA.SET argument parsing, the
// per-transfer contexts and the counters. Nothing here includes the Redis module API, so tests
// can link it (dma_module_core) without a server.
//
// Thread-safety: parsing functions are pure. A TransferContext is touched by one thread at a
// time, handed over through the service (main thread -> worker -> main thread). Counters are
// relaxed atomics, updated from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dma/configuration.hpp"
#include "dma/result.hpp"
#include "dma/service.hpp"

namespace dma::module {

inline constexpr std::size_t kDefaultMaxValueSize = std::size_t{512} << 20;

// What `--loadmodule dma.so [name value]...` configures.
struct ModuleOptions {
  Configuration configuration;
  std::size_t services_per_domain = 1;
  std::size_t max_value_size = kDefaultMaxValueSize;
};

// Parses the load arguments as name/value pairs: providers and interfaces (comma lists),
// services-per-domain, max-in-flight, progress-deadline-ms, max-value-size, crc-threads, bind.
// An unknown name, a missing value or a bad number fails, naming the argument.
Result<ModuleOptions> parse_module_arguments(std::span<const std::string> arguments);

// The remote regions named by `fields` (a multiple of three: rkey addr len), with their total.
struct ParsedRegions {
  RemoteRegions regions;
  std::uint64_t capacity = 0;
};
Result<ParsedRegions> parse_regions(std::span<const std::string_view> fields);

// DMA.SET's arguments after the key: <length> [CRC <crc32c>] <rkey> <addr> <len> ...
struct SetArguments {
  std::uint64_t length = 0;
  std::optional<std::uint32_t> crc;
  ParsedRegions regions;
};
Result<SetArguments> parse_set_arguments(std::span<const std::string_view> fields,
                                         std::size_t max_value_size);

// One DMA.GET or DMA.SET in flight. It owns the bytes the transfer moves: for a GET a private
// copy of the value taken when the command ran (so an overwrite or DEL during the write cannot
// change or free what goes on the wire); for a SET the landing buffer the read fills. It outlives
// the client: whoever frees it (the server's free-privdata callback) frees the bytes.
class TransferContext : public Operands {
 public:
  enum class Kind : std::uint8_t { kGet, kSet };
  // A GET of `value` (copied).
  static std::unique_ptr<TransferContext> for_get(std::span<const std::byte> value);
  // A SET of `length` bytes into `key`, checked against `crc` when given.
  static std::unique_ptr<TransferContext> for_set(std::string key, std::size_t length,
                                                  std::optional<std::uint32_t> crc);

  std::span<const std::byte> source() override;
  std::span<std::byte> allocate(std::size_t length) override;

  Kind kind() const noexcept { return kind_; }
  const std::string& key() const noexcept { return key_; }
  std::optional<std::uint32_t> expected_crc() const noexcept { return expected_crc_; }
  std::span<const std::byte> bytes() const noexcept { return {bytes_.get(), length_}; }

  // The server's handle on the blocked client, opaque here.
  void* blocked = nullptr;
  // Set by the batch completer before the context goes back to the main thread.
  std::optional<Outcome> outcome;
  // When the command handed the transfer over, for the latency counters.
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();

 private:
  TransferContext(Kind kind, std::string key, std::size_t length,
                  std::optional<std::uint32_t> crc);
  Kind kind_;
  std::string key_;
  std::optional<std::uint32_t> expected_crc_;
  std::unique_ptr<std::byte[]> bytes_;
  std::size_t length_ = 0;
};

// What INFO dma and DMA.INFO report.
struct Counters {
  std::atomic<std::uint64_t> sessions{0};
  std::atomic<std::uint64_t> gets{0};
  std::atomic<std::uint64_t> sets{0};
  std::atomic<std::uint64_t> bytes_to_clients{0};
  std::atomic<std::uint64_t> bytes_from_clients{0};
  std::atomic<std::uint64_t> errors{0};
  std::atomic<std::uint64_t> in_flight{0};
  // Command-to-completion latency of finished transfers, in microseconds.
  std::atomic<std::uint64_t> latency_total_us{0};
  std::atomic<std::uint64_t> latency_count{0};
  std::atomic<std::uint64_t> latency_max_us{0};
  void record_latency(std::uint64_t microseconds) noexcept {
    latency_total_us.fetch_add(microseconds, std::memory_order_relaxed);
    latency_count.fetch_add(1, std::memory_order_relaxed);
    std::uint64_t seen = latency_max_us.load(std::memory_order_relaxed);
    while (microseconds > seen &&
           !latency_max_us.compare_exchange_weak(seen, microseconds, std::memory_order_relaxed)) {
    }
  }
  std::uint64_t latency_average_us() const noexcept {
    const std::uint64_t count = latency_count.load(std::memory_order_relaxed);
    return count == 0 ? 0 : latency_total_us.load(std::memory_order_relaxed) / count;
  }
};

// The error reply text for an Error: "ERR <kind>: <message>" on one line.
std::string error_reply(const Error& error);

}  // namespace dma::module
