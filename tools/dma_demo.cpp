// dma-demo: the Redis module end to end, in well under a minute. Starts redis-server with
// build/lib/dma.so on loopback (support/redis_server.hpp), then for each size stores and fetches
// values through DMA.SET/DMA.GET (dma::Client: the bytes move over the fabric) and through plain
// SET/GET (hiredis: the bytes go through the socket), the two sides in alternating bursts so
// machine noise hits both alike. Every byte is verified: each GET's bytes are compared
// with the value stored, and after the SETs each key is read back and compared with the value
// written last. Prints a side-by-side table on stdout and progress on stderr, stops the server,
// and exits 0 only if every byte verified (1 otherwise, 2 for bad arguments).
//
// The client's values and landing are dma::Buffers, the memory the library recommends for values
// (huge pages from 1 MiB; README, "Client memory"); the plain side uses the same memory.
//
// This is a demonstration, half a second per side per row by default, not a benchmark:
// `dma-bench redis` measures.
#include <CLI/CLI.hpp>
#include <hiredis/hiredis.h>
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dma/client.hpp"
#include "dma/memory.hpp"
#include "dma/protocol.hpp"
#include "support/command_line.hpp"
#include "support/pattern.hpp"
#include "support/redis_connection.hpp"
#include "support/redis_server.hpp"

namespace {

using Clock = std::chrono::steady_clock;
constexpr std::chrono::milliseconds kReplyTimeout{30000};

using dma::support::as_text;
using dma::support::RedisConnection;

std::string human(std::size_t bytes) {
  if (bytes % (std::size_t{1} << 20) == 0) return std::to_string(bytes >> 20) + " MiB";
  if (bytes % (std::size_t{1} << 10) == 0) return std::to_string(bytes >> 10) + " KiB";
  return std::to_string(bytes) + " B";
}

// One side (DMA or plain) of one row: its latencies.
struct Side {
  std::vector<double> seconds;
  double total() const {
    double sum = 0;
    for (double each : seconds) sum += each;
    return sum;
  }
  double ops_per_s() const { return total() > 0 ? seconds.size() / total() : 0; }
  double gbps(std::size_t size) const {
    return total() > 0 ? static_cast<double>(size) * seconds.size() / total() / 1e9 : 0;
  }
  double p50_us() const {
    if (seconds.empty()) return 0;
    std::vector<double> sorted = seconds;
    std::nth_element(sorted.begin(), sorted.begin() + sorted.size() / 2, sorted.end());
    return sorted[sorted.size() / 2] * 1e6;
  }
};

struct Row {
  std::size_t size = 0;
  const char* op = "";
  Side dma;
  Side plain;
  std::size_t bad = 0;  // operations whose bytes did not verify
};

void print_header() {
  std::printf("%8s  %-3s | %9s %7s %9s | %9s %7s %9s | %6s  %s\n", "size", "op", "DMA op/s",
              "GB/s", "p50 us", "plain op/s", "GB/s", "p50 us", "ratio", "check");
}

void print_row(const Row& row) {
  // The ratio the goals name: GB/s from 1 MiB up, ops/s below (equal here: same sizes).
  const double base = row.plain.gbps(row.size);
  const double ratio = base > 0 ? row.dma.gbps(row.size) / base : 0;
  std::printf("%8s  %-3s | %9.0f %7.3f %9.1f | %10.0f %7.3f %9.1f | %5.2fx  %s\n",
              human(row.size).c_str(), row.op, row.dma.ops_per_s(), row.dma.gbps(row.size),
              row.dma.p50_us(), row.plain.ops_per_s(), row.plain.gbps(row.size),
              row.plain.p50_us(), ratio, row.bad == 0 ? "every byte verified" : "MISMATCH");
  std::fflush(stdout);
}

// Progress on stderr: one rewritten line on a terminal, one line per size otherwise.
class Progress {
 public:
  Progress() : terminal_(::isatty(STDERR_FILENO) == 1) {}
  void show(const std::string& what, std::size_t done, std::size_t total) {
    if (terminal_) {
      std::fprintf(stderr, "\r\033[Kdma-demo: %s, round %zu of %zu", what.c_str(), done + 1,
                   total);
    } else if (done == 0) {
      std::fprintf(stderr, "dma-demo: %s, %zu rounds\n", what.c_str(), total);
    }
    std::fflush(stderr);
  }
  void clear() {
    if (terminal_) std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
  }

 private:
  bool terminal_;
};

// Each row runs the two sides in alternating bursts (DMA then plain, plain then DMA, ...), each
// side for about `seconds` in all, so that a drift in machine load hits both alike and each side
// runs operations back to back, as an application does on its own connection. (One DMA
// operation between two plain ones leaves the fabric's threads asleep each time: a 1 MiB DMA.GET
// over tcp took 808 us that way, against ~310 us back to back.)
constexpr std::size_t kRounds = 4;
// An unmeasured first operation of each kind and size: the arena's first block of the size, the
// landing buffer's first registration.
constexpr std::size_t kWarmUp = 1;

struct Session {
  dma::Client& client;
  RedisConnection& plain;
  Progress& progress;
  double seconds;  // per side per row
};

// Times `operation` (which returns false on a mismatch, an Error on a failure) into `side`.
template <typename Operation>
dma::Status timed(Side& side, std::size_t& bad, Operation&& operation) {
  const auto started = Clock::now();
  DMA_TRY_ASSIGN(const bool verified, operation());
  side.seconds.push_back(std::chrono::duration<double>(Clock::now() - started).count());
  if (!verified) ++bad;
  return {};
}

// Runs `dma_op(index)` and `plain_op(index)` (each returns a Result<bool>: false on a mismatch)
// in kRounds alternating bursts of session.seconds / kRounds per side, at least one operation
// each, after kWarmUp of each that are verified but not timed. `index` counts each side's
// operations from 0, warm-up included. `prepare()` runs, untimed, before every operation.
template <typename Prepare, typename DmaOp, typename PlainOp>
dma::Status run_bursts(Session& session, Row& row, Prepare&& prepare, DmaOp&& dma_op,
                       PlainOp&& plain_op, std::size_t& dma_count, std::size_t& plain_count) {
  Side unmeasured;
  for (std::size_t index = 0; index < kWarmUp; ++index) {
    prepare();
    DMA_TRY(timed(unmeasured, row.bad, [&] { return dma_op(dma_count++); }));
    prepare();
    DMA_TRY(timed(unmeasured, row.bad, [&] { return plain_op(plain_count++); }));
  }
  const auto burst = std::chrono::duration<double>(session.seconds / kRounds);
  const std::string what = human(row.size) + " " + row.op;
  for (std::size_t round = 0; round < kRounds; ++round) {
    session.progress.show(what, round, kRounds);
    const bool dma_first = round % 2 == 0;
    for (int turn = 0; turn < 2; ++turn) {
      const bool dma_turn = (turn == 0) == dma_first;
      const auto until = Clock::now() + burst;
      do {
        prepare();
        DMA_TRY(dma_turn ? timed(row.dma, row.bad, [&] { return dma_op(dma_count++); })
                         : timed(row.plain, row.bad, [&] { return plain_op(plain_count++); }));
      } while (Clock::now() < until);
    }
  }
  return {};
}

// Reads `key` back with plain DMA.GETPLAIN and compares it with `expected`.
dma::Status read_back(Session& session, const std::string& key,
                      std::span<const std::byte> expected, std::size_t& bad) {
  DMA_TRY_ASSIGN(const dma::support::Reply reply, session.plain.command({"DMA.GETPLAIN", key}));
  const bool same = reply->type == REDIS_REPLY_STRING &&
                    dma::support::reply_text(reply) == as_text(expected);
  if (!same) {
    std::cerr << "dma-demo: " << key << " does not hold the value written last\n";
    ++bad;
  }
  return {};
}

// The two keys of a size: one written through DMA, one through plain SET.
struct Keys {
  std::string dma;
  std::string plain;
  explicit Keys(std::size_t size)
      : dma("dma-demo:dma:" + std::to_string(size)),
        plain("dma-demo:plain:" + std::to_string(size)) {}
};

// What the SETs left in each key: the index into `values` each side wrote last.
struct Stored {
  std::size_t dma = 0;
  std::size_t plain = 0;
};

// SETs: each DMA.SET and each plain SET writes one of two patterns (alternating, so every write
// changes the key); afterwards both keys are read back and compared with what was written last.
dma::Result<Row> run_sets(Session& session, std::size_t size,
                          const std::vector<dma::Buffer>& values, Stored& stored) {
  Row row;
  row.size = size;
  row.op = "SET";
  const Keys keys(size);
  std::size_t dma_count = 0;
  std::size_t plain_count = 0;
  const dma::Status ran = run_bursts(
      session, row, [] {},
      [&](std::size_t index) -> dma::Result<bool> {
        dma::Status written = session.client.set(keys.dma, values[index % 2].bytes());
        if (!written && written.error().code() == dma::ErrorCode::kCorrupted) return false;
        DMA_TRY(written);
        return true;
      },
      [&](std::size_t index) -> dma::Result<bool> {
        DMA_TRY(session.plain.command({"SET", keys.plain, as_text(values[index % 2].bytes())}));
        return true;
      },
      dma_count, plain_count);
  DMA_TRY(ran);
  stored.dma = (dma_count - 1) % 2;
  stored.plain = (plain_count - 1) % 2;
  DMA_TRY(read_back(session, keys.dma, values[stored.dma].bytes(), row.bad));
  DMA_TRY(read_back(session, keys.plain, values[stored.plain].bytes(), row.bad));
  return row;
}

// GETs of the values the SETs left behind, each compared byte for byte with its key's value.
dma::Result<Row> run_gets(Session& session, std::size_t size,
                          const std::vector<dma::Buffer>& values, const Stored& stored) {
  Row row;
  row.size = size;
  row.op = "GET";
  const Keys keys(size);
  DMA_TRY_ASSIGN(const dma::Buffer landing, dma::Buffer::allocate(size));
  const dma::Buffer& dma_value = values[stored.dma];
  const dma::Buffer& plain_value = values[stored.plain];
  std::size_t dma_count = 0;
  std::size_t plain_count = 0;
  const dma::Status ran = run_bursts(
      session, row,
      // Stale bytes must not pass: the landing is cleared before every GET (untimed).
      [&] { std::fill_n(landing.data(), size, std::byte{0}); },
      [&](std::size_t) -> dma::Result<bool> {
        auto got = session.client.get(keys.dma, landing.bytes());
        if (!got && got.error().code() == dma::ErrorCode::kCorrupted) return false;
        DMA_TRY(got);
        return *got && **got == size && std::memcmp(landing.data(), dma_value.data(), size) == 0;
      },
      [&](std::size_t) -> dma::Result<bool> {
        DMA_TRY_ASSIGN(const dma::support::Reply reply,
                       session.plain.command({"GET", keys.plain}));
        return reply->type == REDIS_REPLY_STRING &&
               dma::support::reply_text(reply) == as_text(plain_value.bytes());
      },
      dma_count, plain_count);
  DMA_TRY(ran);
  return row;
}

int run(const std::string& provider, const std::vector<std::size_t>& sizes, double seconds) {
  Progress progress;
  dma::support::RedisServer::Options options;
  options.module_arguments = {"providers", provider, "bind", "127.0.0.1"};
  std::cerr << "dma-demo: starting redis-server with the module (provider " << provider << ")\n";
  auto server = dma::support::RedisServer::start(options);
  if (!server) {
    std::cerr << "dma-demo: " << server.error().describe() << "\n";
    return 1;
  }
  dma::Configuration configuration;
  configuration.providers = {provider};
  configuration.bind = "127.0.0.1";
  auto client = dma::Client::connect((*server)->host(), (*server)->port(), configuration,
                                     dma::Client::Options{kReplyTimeout});
  if (!client) {
    std::cerr << "dma-demo: " << client.error().describe() << "\n";
    return 1;
  }
  if (dma::Status said = (*client)->hello(); !said) {
    std::cerr << "dma-demo: DMA.HELLO: " << said.error().describe() << "\n";
    return 1;
  }
  std::cerr << "dma-demo: client endpoint " << (*client)->target().describe().to_string()
            << "\n";
  auto plain = RedisConnection::open((*server)->host(), (*server)->port(), kReplyTimeout);
  if (!plain) {
    std::cerr << "dma-demo: " << plain.error().describe() << "\n";
    return 1;
  }
  Session session{**client, **plain, progress, seconds};

  // Unmeasured: tcp and net connect on the first transfer.
  {
    const std::vector<std::byte> one{std::byte{42}};
    std::vector<std::byte> back(1);
    dma::Status warm = (*client)->set("dma-demo:warm", one);
    auto got = warm ? (*client)->get("dma-demo:warm", back)
                    : dma::Result<std::optional<std::size_t>>(dma::fail(warm.error()));
    if (!got || !*got || back != one) {
      std::cerr << "dma-demo: the first transfer failed: "
                << (got ? std::string("wrong bytes") : got.error().describe()) << "\n";
      return 1;
    }
  }

  std::vector<Row> rows;
  bool failed = false;
  for (const std::size_t size : sizes) {
    std::vector<dma::Buffer> values;
    for (const std::uint32_t seed : {0u, 1u}) {
      auto value = dma::Buffer::allocate(size);
      if (!value) {
        std::cerr << "dma-demo: " << value.error().describe() << "\n";
        return 1;
      }
      const std::vector<std::byte> pattern =
          dma::support::make_pattern(size, static_cast<std::uint32_t>(size) + seed);
      std::copy(pattern.begin(), pattern.end(), value->data());
      values.push_back(std::move(*value));
    }
    Stored stored;
    auto sets = run_sets(session, size, values, stored);
    if (!sets) {
      progress.clear();
      std::cerr << "dma-demo: " << human(size) << " SET: " << sets.error().describe() << "\n";
      failed = true;
      break;
    }
    rows.push_back(std::move(*sets));
    auto gets = run_gets(session, size, values, stored);
    if (!gets) {
      progress.clear();
      std::cerr << "dma-demo: " << human(size) << " GET: " << gets.error().describe() << "\n";
      failed = true;
      break;
    }
    rows.push_back(std::move(*gets));
  }
  progress.clear();

  std::printf("redis-server + dma.so over %s: DMA.SET/DMA.GET (bytes over the fabric) against "
              "SET/GET (bytes through the socket), one client\n",
              provider.c_str());
  print_header();
  std::size_t bad = 0;
  for (const Row& row : rows) {
    print_row(row);
    bad += row.bad;
  }
  client->reset();  // say goodbye before the server goes
  plain->reset();
  const int status = (*server)->stop();
  if (status != 0) {
    std::cerr << "dma-demo: redis-server exited with status " << status << ":\n"
              << (*server)->log() << "\n";
    failed = true;
  }
  if (bad != 0) std::cerr << "dma-demo: " << bad << " operations did not verify\n";
  return failed || bad != 0 ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  // The plain side's hiredis builds each command, and reads each reply, in a buffer the size of
  // the value. On the main thread glibc's malloc takes such a buffer from the top of its heap and
  // gives the heap back after each free (brk up 4 MiB and down again per 1 MiB SET), so every
  // plain SET and GET faulted its pages in afresh: 1,000 1 MiB SETs a second here against 1,600-
  // 1,900 in `dma-bench redis`, whose clients run on threads of their own. Keep freed memory
  // for reuse, as a long-running client's allocator does; the DMA side makes no such buffers.
  (void)mallopt(M_MMAP_THRESHOLD, 32 << 20);
  (void)mallopt(M_TRIM_THRESHOLD, 256 << 20);
  CLI::App app{"dma-demo: DMA.SET/DMA.GET against SET/GET on a redis-server started here"};
  std::string provider = "tcp";
  double seconds = 0.5;
  std::vector<std::size_t> sizes{std::size_t{4} << 10, std::size_t{1} << 20, std::size_t{16} << 20};
  app.add_option("--provider", provider, "libfabric provider (tcp, net, shm, ...)")
      ->capture_default_str();
  dma::support::add_size_list(app, "--sizes", sizes, "value sizes, at most 1 GiB",
                              std::size_t{1} << 30);
  app.add_option("--seconds", seconds,
                 "per side per row, in alternating bursts (at least one operation each)")
      ->check(CLI::Range(0.001, 3600.0))
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    const int code = app.exit(error);
    return code == 0 ? 0 : 2;
  }
  return run(provider, sizes, seconds);
}
