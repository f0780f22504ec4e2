// `dma-bench redis`: DMA.GET/DMA.SET through the module against plain GET/SET of the same sizes,
// clients and working set, on a redis-server started here on loopback (or one given by
// host/port). Every value is verified by CRC32C.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "report.hpp"

namespace dma::bench {

struct RedisOptions {
  std::string provider = "tcp";
  std::string host;  // empty: start redis-server with the module on loopback
  int port = 0;
  std::vector<std::size_t> sizes{4096, std::size_t{1} << 20, std::size_t{16} << 20};
  std::vector<std::size_t> clients{1};
  std::vector<std::string> ops{"get", "set"};
  std::chrono::milliseconds duration{2000};  // per side per case
  // false: DMA through dma::Client, which exposes (registers) the buffer on every call; true:
  // the same commands with every buffer exposed once per case.
  bool expose_once = false;
  // false: the clients' values and GET landings are dma::Buffers (huge pages from 1 MiB, what
  // the library recommends); true: std::vectors (malloc), to measure what page size costs.
  bool heap_memory = false;
  // The module's inline-max and the clients' Options::inline_max; unset: the defaults.
  std::optional<std::size_t> inline_max;
  // More module load arguments, name and value in turn (an A/B of a setting).
  std::vector<std::string> module_arguments;
  // Client::Options::busy_poll: each client's target polls without sleeping during a command.
  bool busy_poll = false;
  // Client::Options::expect_window in microseconds; unset: the Client's default.
  std::optional<std::int64_t> expect_window_us;
};

Result<std::vector<Case>> run_redis(const RedisOptions& options, Progress& progress);

// Instead of the cases, on one client: the server's CPU time per DMA.GET of the first size over
// `count` GETs (INFO cpu), and its RSS across `count` 4 KiB DMA.GETs (a leak grows with the
// count). Each prints its one line and fails on a mismatch.
Status cpu_check(const RedisOptions& options, std::uint64_t count, Progress& progress);
Status memory_check(const RedisOptions& options, std::uint64_t count, Progress& progress);

}  // namespace dma::bench
