// Private to dma-bench's redis part: the benchmark clients and their shares of a case, shared
// by the cases (redis_bench.cpp) and the server checks (redis_checks.cpp). See redis_bench.cpp
// for how a case runs.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "dma/client.hpp"
#include "dma/memory.hpp"
#include "redis_bench.hpp"
#include "report.hpp"
#include "support/redis_connection.hpp"
#include "support/redis_server.hpp"

namespace dma::bench::redis {

using Clock = std::chrono::steady_clock;
constexpr std::size_t kWorkingSetBytes = std::size_t{64} << 20;
constexpr std::size_t kMaxKeysPerClient = 64;

using support::RedisConnection;
using support::RedisServer;

// One benchmark client: a dma::Client and a plain connection, used by one thread per phase.
// With `--registration once` the client's buffers are exposed once per case and it uses
// Client's exposed-buffer calls, to measure what the per-call registration of get/set costs.
// With `--client-memory heap` its values and landing are malloc's (ValueMemory).
struct Peer {
  std::unique_ptr<Client> dma;
  bool expose_once = false;
  bool heap_memory = false;
  std::unique_ptr<RedisConnection> plain;  // the baseline's client, seeding and read-back
};

// A client's memory for one value (a pattern, or the landing of GETs): a dma::Buffer, what the
// library recommends for values (huge pages from 1 MiB, include/dma/memory.hpp), or with
// `--client-memory heap` a std::vector (malloc's pages), to measure what that costs. Both sides
// of a case use the same memory.
class ValueMemory {
 public:
  static Result<ValueMemory> make(std::size_t size, bool heap) {
    ValueMemory memory;
    if (heap || size == 0) {
      memory.heap_.resize(size);
    } else {
      DMA_TRY_ASSIGN(memory.buffer_, Buffer::allocate(size));
    }
    return memory;
  }
  std::span<std::byte> bytes() {
    return buffer_.data() != nullptr ? buffer_.bytes() : std::span<std::byte>(heap_);
  }
  std::span<const std::byte> bytes() const {
    return buffer_.data() != nullptr ? buffer_.bytes() : std::span<const std::byte>(heap_);
  }
  std::size_t size() const { return bytes().size(); }

 private:
  Buffer buffer_;
  std::vector<std::byte> heap_;
};

// A client's share of one case: its keys, its two pattern values, which value each key holds,
// and the landing buffer for GETs.
struct Keys {
  std::vector<std::string> names;
  std::vector<std::size_t> holds;  // per key: index into Share::values
  std::size_t next = 0;            // the next key to use
};
enum class Kind { kDma, kPlain };
struct Share {
  Keys dma_keys;    // module values
  Keys plain_keys;  // strings
  std::vector<ValueMemory> values;        // two
  std::vector<std::uint32_t> value_crcs;  // two
  ValueMemory landing;
  Keys& keys(Kind kind) { return kind == Kind::kDma ? dma_keys : plain_keys; }
  // With --registration once: landing and values exposed for the whole case. Declared after
  // the buffers so they are closed first.
  std::optional<Exposed> landing_exposed;
  std::vector<Exposed> values_exposed;
};

// What one thread counted in one phase.
struct Tally {
  std::uint64_t operations = 0;
  std::uint64_t bytes = 0;
  std::uint64_t errors = 0;
  std::uint64_t mismatches = 0;
  LatencySamples samples;
  std::string first_problem;
  void problem(std::string text) {
    if (first_problem.empty()) first_problem = std::move(text);
  }
};

// One operation of `kind` (a GET if `get`, else a SET) by one client; the result goes to
// `tally`. Returns false if the connection can no longer be trusted (the phase ends for this
// client).
bool one_operation(Kind kind, bool get, Peer& peer, Share& share, Tally& tally);
// Builds the client's share of a case and seeds its keys: plain SET for the plain side's,
// DMA.SETPLAIN for the DMA side's.
Result<Share> make_share(Peer& peer, std::size_t size, std::size_t keys, std::size_t client,
                         std::uint32_t seed);
Status delete_share(Peer& peer, const Share& share);
// The server's CPU seconds so far, user + system over all its threads (INFO cpu: getrusage).
Result<double> server_cpu_seconds(RedisConnection& connection);

// What a run talks to: the server started here (none with --host) and `count` peers connected
// to it. Declaration order: the peers disconnect before the server stops.
struct Connected {
  std::unique_ptr<RedisServer> server;
  std::vector<Peer> peers;
  std::unique_ptr<RedisConnection> probe;  // asks for the server's CPU between phases
};
// Starts the server (unless options.host names one) and connects `count` peers to it.
Result<Connected> connect_run(const RedisOptions& options, std::size_t count);

}  // namespace dma::bench::redis
