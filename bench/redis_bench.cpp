// `dma-bench redis`: see redis_bench.hpp. How a case runs:
//
// - Clients: one thread per client, each with its own dma::Client (own hiredis connection and
//   Target, hello said once per run) and its own plain hiredis connection. The same clients
//   serve every case of the run; a case uses the first N.
// - Working set: each client owns its own keys (so the bytes a SET leaves behind are known), up
//   to 64 MiB per side over all clients and at most 64 keys per client and side. Key j of client
//   c holds one of the client's two pattern values. Each side has its own keys, holding what
//   that side's SET would store: the plain side's are strings seeded with SET, the DMA side's
//   module values seeded with DMA.SETPLAIN (so a DMA.GET sends from a stored block, as it does
//   for values DMA.SET stored). Every key is deleted after the case.
// - Interleaving: the per-side duration is cut into rounds of about half a second (at least
//   five); each round runs DMA then plain (alternating which goes first), so noise on the shared
//   machine hits both. The case's ratio is the median of the rounds' ratios (report.hpp).
// - Verification: a GET's bytes are CRC32C-checked against the value stored (dma::Client also
//   checks them against the server's CRC32C); after each SET round every key of the working set
//   is read back with plain GET and checked against the value written last. A failure is a
//   mismatch of the side that wrote or read it.
#include "redis_bench.hpp"
#include "redis_clients.hpp"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <cstdio>
#include <iostream>
#include <latch>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "commands.hpp"
#include "dma/client.hpp"
#include "dma/memory.hpp"
#include "dma/protocol.hpp"
#include "support/command_line.hpp"
#include "support/pattern.hpp"
#include "support/redis_connection.hpp"
#include "support/redis_server.hpp"

namespace dma::bench {
namespace redis {

constexpr std::chrono::milliseconds kRoundLength{500};
constexpr std::size_t kMinRounds = 5;  // the median and spread of the round ratios need a few
constexpr std::chrono::milliseconds kReplyTimeout{60000};
constexpr std::size_t kSamplesPerThread = std::size_t{1} << 18;

using support::as_text;

// One side of a case accumulated over its rounds.
struct Side {
  Measurement measurement;
  LatencySamples samples;
  std::string first_problem;
  void add(Tally& tally) {
    measurement.operations += tally.operations;
    measurement.bytes += tally.bytes;
    measurement.errors += tally.errors;
    measurement.mismatches += tally.mismatches;
    samples.merge(tally.samples);
    if (first_problem.empty()) first_problem = tally.first_problem;
  }
};

bool one_operation(Kind kind, bool get, Peer& peer, Share& share, Tally& tally) {
  Keys& keys = share.keys(kind);
  const std::size_t index = keys.next++ % keys.names.size();
  const std::string& key = keys.names[index];
  const std::size_t size = share.landing.size();
  const auto started = Clock::now();
  if (get) {
    const std::uint32_t expected = share.value_crcs[keys.holds[index]];
    std::optional<std::uint32_t> landed;
    std::size_t length = 0;
    if (kind == Kind::kDma) {
      auto got = peer.expose_once ? peer.dma->get(key, *share.landing_exposed)
                                  : peer.dma->get(key, share.landing.bytes());
      if (!got) {
        if (got.error().code() == ErrorCode::kCorrupted) {
          ++tally.mismatches;
          tally.problem("DMA.GET " + key + ": " + got.error().describe());
          return true;
        }
        ++tally.errors;
        tally.problem("DMA.GET " + key + ": " + got.error().describe());
        return false;
      }
      if (*got) {
        // dma::Client checked the landed bytes against the CRC32C recorded at SET; comparing
        // that CRC with the pattern's (below) verifies every byte with one pass over them, as
        // the plain side's one crc32c does (reading them twice cost ~60 us per 1 MiB GET).
        length = **got;
        landed = peer.dma->last_checksum();
      }
    } else {
      auto reply = peer.plain->command({"GET", key});
      if (!reply) {
        ++tally.errors;
        tally.problem("GET " + key + ": " + reply.error().describe());
        return false;
      }
      if ((*reply)->type == REDIS_REPLY_STRING) {
        length = (*reply)->len;
        landed = crc32c(std::as_bytes(std::span<const char>((*reply)->str, length)));
      }
    }
    tally.samples.record(Clock::now() - started);
    ++tally.operations;
    tally.bytes += length;
    if (!landed || length != size || *landed != expected) {
      ++tally.mismatches;
      tally.problem((kind == Kind::kDma ? "DMA.GET " : "GET ") + key + ": " +
                    (landed ? std::to_string(length) + " bytes with CRC32C " +
                                  std::to_string(*landed) + ", stored " +
                                  std::to_string(expected)
                            : std::string("no value")));
    }
    return true;
  }
  // A SET writes the value the key does not hold, so every SET changes the key.
  const std::size_t value = 1 - keys.holds[index];
  const std::span<const std::byte> bytes = share.values[value].bytes();
  if (kind == Kind::kDma) {
    Status stored = peer.expose_once
                        ? peer.dma->set(key, share.values_exposed[value], bytes.size())
                        : peer.dma->set(key, bytes);
    if (!stored) {
      const bool corrupted = stored.error().code() == ErrorCode::kCorrupted;
      ++(corrupted ? tally.mismatches : tally.errors);
      tally.problem("DMA.SET " + key + ": " + stored.error().describe());
      if (!corrupted) return false;
    }
  } else {
    auto reply = peer.plain->command({"SET", key, as_text(bytes)});
    if (!reply) {
      ++tally.errors;
      tally.problem("SET " + key + ": " + reply.error().describe());
      return false;
    }
  }
  // What the key holds is known only after an accepted write; a refused one leaves it unchanged.
  tally.samples.record(Clock::now() - started);
  ++tally.operations;
  tally.bytes += bytes.size();
  keys.holds[index] = value;
  return true;
}

// Reads every key of `share` back with plain GET and counts the ones that do not hold the value
// last written.
void verify_share(Peer& peer, Keys& keys, Share& share, Tally& tally) {
  for (std::size_t index = 0; index < keys.names.size(); ++index) {
    auto reply = peer.plain->command({"DMA.GETPLAIN", keys.names[index]});
    if (!reply) {
      ++tally.errors;
      tally.problem("read-back GET " + keys.names[index] + ": " + reply.error().describe());
      return;
    }
    const std::uint32_t expected = share.value_crcs[keys.holds[index]];
    const bool ok = (*reply)->type == REDIS_REPLY_STRING &&
                    (*reply)->len == share.landing.size() &&
                    crc32c(std::as_bytes(std::span<const char>((*reply)->str, (*reply)->len))) ==
                        expected;
    if (!ok) {
      ++tally.mismatches;
      tally.problem("read-back of " + keys.names[index] + " after SET: not the value written");
    }
  }
}

// Runs `kind` on every client at once for `slice` (each client at least one operation); returns
// the seconds from the common start to the slowest client's last operation. With `probe` (a
// connection no client uses meanwhile) the side is charged the server's CPU and this process's
// over the same window: from the start to the last client's last operation, before the SET
// read-back.
double run_phase(Kind kind, bool get, std::span<Peer> peers, std::span<Share> shares,
                 std::chrono::nanoseconds slice, Side& side, RedisConnection* probe = nullptr) {
  const std::size_t count = shares.size();
  std::vector<Tally> tallies(count);
  for (auto& tally : tallies) tally.samples.reserve(kSamplesPerThread);
  std::vector<Clock::time_point> last_done(count);
  std::latch ready(static_cast<std::ptrdiff_t>(count + 1));
  std::latch looped(static_cast<std::ptrdiff_t>(count));  // every client's loop is over
  std::latch resume(1);                                   // the CPU has been read after it
  std::atomic<Clock::rep> start_ticks{0};
  std::vector<std::thread> threads;
  threads.reserve(count);
  for (std::size_t client = 0; client < count; ++client) {
    threads.emplace_back([&, client] {
      ready.arrive_and_wait();
      const auto deadline = Clock::time_point(Clock::duration(start_ticks.load())) + slice;
      // At least one operation, so a zero slice is a warm-up.
      do {
        if (!one_operation(kind, get, peers[client], shares[client], tallies[client])) break;
      } while (Clock::now() < deadline);
      last_done[client] = Clock::now();
      looped.count_down();
      resume.wait();
      if (!get) {
        verify_share(peers[client], shares[client].keys(kind), shares[client], tallies[client]);
      }
    });
  }
  std::optional<double> server_before;
  double client_before = 0;
  if (probe != nullptr) {
    auto read = server_cpu_seconds(*probe);
    if (read) server_before = *read;
    client_before = process_cpu_seconds();
  }
  const auto started = Clock::now();
  start_ticks.store(started.time_since_epoch().count());
  ready.arrive_and_wait();
  looped.wait();
  if (probe != nullptr) {
    const double client_after = process_cpu_seconds();
    auto server_after = server_cpu_seconds(*probe);
    Measurement& m = side.measurement;
    m.client_cpu_seconds = m.client_cpu_seconds.value_or(0) + (client_after - client_before);
    if (server_before && server_after) {
      m.cpu_seconds = m.cpu_seconds.value_or(0) + (*server_after - *server_before);
    }
  }
  resume.count_down();
  for (auto& thread : threads) thread.join();
  // The window ends with the slowest client's last operation; the SET read-back is outside it.
  const auto ended = *std::max_element(last_done.begin(), last_done.end());
  const double seconds = std::chrono::duration<double>(ended - started).count();
  for (auto& tally : tallies) side.add(tally);
  return seconds;
}

std::string key_prefix(std::size_t size, std::size_t client) {
  return "dma-bench:" + format_size(size) + ":" + std::to_string(client) + ":";
}

Result<Share> make_share(Peer& peer, std::size_t size, std::size_t keys, std::size_t client,
                         std::uint32_t seed) {
  Share share;
  DMA_TRY_ASSIGN(share.landing, ValueMemory::make(size, peer.heap_memory));
  for (std::uint32_t value = 0; value < 2; ++value) {
    DMA_TRY_ASSIGN(ValueMemory memory, ValueMemory::make(size, peer.heap_memory));
    const std::vector<std::byte> pattern = support::make_pattern(size, seed + value);
    std::copy(pattern.begin(), pattern.end(), memory.bytes().begin());
    share.value_crcs.push_back(crc32c(memory.bytes()));
    share.values.push_back(std::move(memory));
  }
  for (std::size_t index = 0; index < keys; ++index) {
    const auto value = share.values[index % 2].bytes();
    share.plain_keys.names.push_back(key_prefix(size, client) + "plain:" + std::to_string(index));
    share.plain_keys.holds.push_back(index % 2);
    DMA_TRY(peer.plain->command({"SET", share.plain_keys.names.back(), as_text(value)}));
    share.dma_keys.names.push_back(key_prefix(size, client) + "dma:" + std::to_string(index));
    share.dma_keys.holds.push_back(index % 2);
    auto stored = peer.plain->command({"DMA.SETPLAIN", share.dma_keys.names.back(), as_text(value)});
    if (!stored && stored.error().message().find("unknown command") != std::string::npos) {
      // A module from before the value store (comparisons with earlier builds): strings.
      stored = peer.plain->command({"SET", share.dma_keys.names.back(), as_text(value)});
    }
    if (!stored) return fail(std::move(stored).error());
  }
  if (peer.expose_once) {
    DMA_TRY_ASSIGN(share.landing_exposed,
                   peer.dma->target().expose(share.landing.bytes().data(), share.landing.size()));
    for (auto& value : share.values) {
      DMA_TRY_ASSIGN(Exposed exposed,
                     peer.dma->target().expose(value.bytes().data(), value.size()));
      share.values_exposed.push_back(std::move(exposed));
    }
  }
  return share;
}

Status delete_share(Peer& peer, const Share& share) {
  for (const Keys* keys : {&share.plain_keys, &share.dma_keys}) {
    for (const std::string& key : keys->names) DMA_TRY(peer.plain->command({"DEL", key}));
  }
  return {};
}

// The server's CPU seconds so far, user + system over all its threads (INFO cpu: getrusage).
Result<double> server_cpu_seconds(RedisConnection& connection) {
  DMA_TRY_ASSIGN(auto reply, connection.command({"INFO", "cpu"}));
  const std::string text((*reply).str, (*reply).len);
  double total = 0;
  int found = 0;
  for (const char* field : {"used_cpu_sys:", "used_cpu_user:"}) {
    const std::size_t at = text.find(field);
    if (at == std::string::npos) continue;
    total += std::strtod(text.c_str() + at + std::strlen(field), nullptr);
    ++found;
  }
  if (found != 2) return fail(ErrorCode::kInvalidArgument, "INFO cpu has no used_cpu_sys/user");
  return total;
}

Measurement finish(Side& side, double seconds) {
  Measurement result = side.measurement;
  result.seconds = seconds;
  result.p50_us = side.samples.quantile_us(0.50);
  result.p99_us = side.samples.quantile_us(0.99);
  return result;
}

// One (op, size, clients) case: DMA against plain, interleaved in rounds.
Result<Case> run_case(const RedisOptions& options, const std::string& op, std::size_t size,
                      std::size_t clients, std::span<Peer> all_peers, RedisConnection& probe,
                      Progress& progress) {
  const bool get = op == "get";
  Case row;
  row.mode = "redis";
  row.provider = options.provider;
  row.op = op;
  row.size = size;
  row.clients = clients;
  row.label = get ? "DMA.GET" : "DMA.SET";
  row.baseline_label = get ? "GET" : "SET";
  progress.start_case("redis " + options.provider + " " + op + " " + format_size(size) + " x" +
                      std::to_string(clients) + " clients");

  const std::span<Peer> peers = all_peers.first(clients);
  const std::size_t keys =
      std::clamp<std::size_t>(kWorkingSetBytes / (size * clients), 1, kMaxKeysPerClient);
  std::vector<Share> shares;
  for (std::size_t client = 0; client < clients; ++client) {
    DMA_TRY_ASSIGN(Share share, make_share(peers[client], size, keys, client,
                                           static_cast<std::uint32_t>(size * 7 + client * 131)));
    shares.push_back(std::move(share));
  }

  // Unmeasured: one op of each kind per client (a fabric connection is set up on first use).
  Side warm;
  run_phase(Kind::kDma, get, peers, shares, std::chrono::nanoseconds(0), warm);
  run_phase(Kind::kPlain, get, peers, shares, std::chrono::nanoseconds(0), warm);

  const std::size_t rounds = std::max<std::size_t>(
      kMinRounds, static_cast<std::size_t>(options.duration / kRoundLength));
  const auto slice = std::chrono::duration_cast<std::chrono::nanoseconds>(options.duration) /
                     static_cast<long>(rounds);
  Side dma_side;
  Side plain_side;
  double dma_seconds = 0;
  double plain_seconds = 0;
  for (std::size_t round = 0; round < rounds; ++round) {
    const bool dma_first = round % 2 == 0;
    Measurement dma_round, plain_round;
    for (const Kind kind : {dma_first ? Kind::kDma : Kind::kPlain,
                            dma_first ? Kind::kPlain : Kind::kDma}) {
      Side& side = kind == Kind::kDma ? dma_side : plain_side;
      Measurement& this_round = kind == Kind::kDma ? dma_round : plain_round;
      const std::uint64_t operations = side.measurement.operations;
      const std::uint64_t bytes = side.measurement.bytes;
      this_round.seconds = run_phase(kind, get, peers, shares, slice, side, &probe);
      this_round.operations = side.measurement.operations - operations;
      this_round.bytes = side.measurement.bytes - bytes;
      (kind == Kind::kDma ? dma_seconds : plain_seconds) += this_round.seconds;
    }
    row.rounds.push_back(round_of(dma_round, plain_round, size));
  }
  // The warm-up's problems count too: a value that fails to verify fails the run.
  dma_side.measurement.mismatches += warm.measurement.mismatches;
  dma_side.measurement.errors += warm.measurement.errors;
  if (dma_side.first_problem.empty()) dma_side.first_problem = warm.first_problem;
  for (const Side* side : {&dma_side, &plain_side}) {
    if (!side->first_problem.empty()) {
      progress.note("dma-bench redis: " + side->first_problem);
    }
  }
  for (std::size_t client = 0; client < clients; ++client) {
    DMA_TRY(delete_share(peers[client], shares[client]));
  }
  row.ours = finish(dma_side, dma_seconds);
  row.baseline = finish(plain_side, plain_seconds);
  progress.finish_case();
  return row;
}

Configuration client_configuration(const std::string& provider) {
  Configuration configuration;
  configuration.providers = {provider};
  configuration.bind = "127.0.0.1";
  return configuration;
}

Result<std::unique_ptr<RedisServer>> start_server(const RedisOptions& options) {
  RedisServer::Options server_options;
  server_options.module_arguments = {"providers", options.provider, "bind", "127.0.0.1"};
  if (options.inline_max) {
    server_options.module_arguments.insert(server_options.module_arguments.end(),
                                           {"inline-max", std::to_string(*options.inline_max)});
  }
  server_options.module_arguments.insert(server_options.module_arguments.end(),
                                         options.module_arguments.begin(),
                                         options.module_arguments.end());
  return RedisServer::start(server_options);
}

Result<std::vector<Peer>> connect_peers(const std::string& host, int port,
                                        const RedisOptions& options, std::size_t count) {
  std::vector<Peer> peers;
  Client::Options client_options;
  client_options.timeout = kReplyTimeout;
  if (options.inline_max) client_options.inline_max = *options.inline_max;
  client_options.busy_poll = options.busy_poll;
  if (options.expect_window_us) {
    client_options.expect_window = std::chrono::microseconds(*options.expect_window_us);
  }
  for (std::size_t index = 0; index < count; ++index) {
    Peer peer;
    DMA_TRY_ASSIGN(peer.dma, Client::connect(host, port, client_configuration(options.provider),
                                             client_options));
    DMA_TRY(peer.dma->hello());
    peer.expose_once = options.expose_once;
    peer.heap_memory = options.heap_memory;
    DMA_TRY_ASSIGN(peer.plain, RedisConnection::open(host, port, kReplyTimeout));
    peers.push_back(std::move(peer));
  }
  return peers;
}

Result<Connected> connect_run(const RedisOptions& options, std::size_t count) {
  Connected connected;
  std::string host = options.host;
  int port = options.port;
  if (host.empty()) {
    DMA_TRY_ASSIGN(connected.server, start_server(options));
    host = connected.server->host();
    port = connected.server->port();
  }
  DMA_TRY_ASSIGN(connected.peers,
                 connect_peers(host, port, options, count));
  DMA_TRY_ASSIGN(connected.probe, RedisConnection::open(host, port, kReplyTimeout));
  return connected;
}

}  // namespace redis

Result<std::vector<Case>> run_redis(const RedisOptions& options, Progress& progress) {
  using namespace redis;
  if (options.sizes.empty() || options.clients.empty() || options.ops.empty()) {
    return fail(ErrorCode::kInvalidArgument, "nothing to run: sizes, clients and ops are needed");
  }
  for (const std::string& op : options.ops) {
    if (op != "get" && op != "set") {
      return fail(ErrorCode::kInvalidArgument, "op '" + op + "' is neither get nor set");
    }
  }
  const std::size_t most = *std::max_element(options.clients.begin(), options.clients.end());
  DMA_TRY_ASSIGN(Connected connected, connect_run(options, most));

  std::vector<Case> rows;
  for (const std::string& op : options.ops) {
    for (const std::size_t size : options.sizes) {
      for (const std::size_t clients : options.clients) {
        DMA_TRY_ASSIGN(Case row,
                       run_case(options, op, size, clients, connected.peers, *connected.probe,
                                progress));
        rows.push_back(std::move(row));
      }
    }
  }
  return rows;
}

}  // namespace dma::bench
