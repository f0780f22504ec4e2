// dma-soak: hammers a redis-server running the dma module with many clients for a while, kills
// clients or the server under them, and checks every byte that comes back.
//
//   dma-soak --provider tcp|net|shm --clients N --duration S [--max-size B]
//            [--kill-every S | --kill-server-every S] [--series FILE]
//
// The parent starts redis-server with the module on loopback (support/redis_server.hpp), then runs
// N client *processes* (`dma-soak client ...`, this same executable), so that a client can be
// SIGKILLed mid-transfer: a dead peer's transfers are exactly what the server has to survive.
// Each client owns the keys soak-<slot>-0..7 and does random DMA.SET/DMA.GET of random sizes
// (log-uniform in 1..max-size), one operation at a time. It remembers the CRC32C of what it last
// stored under each key; every GET is checked against it, and a difference is a *mismatch*. A
// SET that failed on the server must leave the old value (so the old CRC stays expected); only
// when the connection itself broke (kUnreachable) is the key's content unknown: the client then
// reconnects (DEL its keys, connect, DMA.HELLO, every 100 ms until all three work) and forgets
// what it expected, so a key it deleted, or one lost with a server, is never a mismatch.
//
// Modes:
//   --kill-every S         SIGKILL one client (round robin) every S seconds and start a
//                          replacement in its slot (which first deletes its predecessor's keys).
//   --kill-server-every S  SIGKILL the redis-server S seconds after each incarnation started (not
//                          on a fixed clock, so each restart's recovery window lies within the
//                          life of the server it judges) and start the next on the same port
//                          with the same module arguments. The clients keep running: their
//                          connections break and they reconnect to the new server, which is
//                          empty (--save '', no AOF).
//   neither                the clients run undisturbed (judged like --kill-every with 0 kills).
//
// Reports: clients print cumulative counters on stdout every 250 ms ("stats ..." lines); every
// 250 ms the parent records the total operation count (the live clients' last reports plus the
// killed clients' last ones) in a time series, prints a progress line on stderr once a second
// and at the end a report: operations, bytes, errors by cause, mismatches, the server's count of
// failed transfers (INFO dma, dma_errors), the throughput level and each kill's recovery, the
// server's RSS at start and end (with --kill-server-every: the last incarnation's), and PASS or
// FAIL with the rule that was applied (and, for a kill that did not recover, when it was;
// --series FILE writes the time series and the kill times for a closer look):
//   always                 0 mismatches, no client exited on its own, the server never died on
//                          its own and exits 0 when stopped, some work done, and every kill
//                          recovered: the rate over [t+1 s, t+2 s] after it (t: the SIGKILL of a
//                          client; the moment a new server answered PING) is at least 0.75 x the
//                          level, the median 1 s rate (see kRecovered).
//   clients killed         no error seen by a live client, in an operation or a reconnect (a
//                          killed client cannot report the operation it died in, so every
//                          reported error is a live client's),
//                          and at most kills x 1 (kInFlightPerClient) failed transfers counted
//                          by the server.
//   server killed          at most clients x server kills operation errors (each client loses at
//                          most its one operation in flight); failed reconnect attempts while
//                          the server was down are counted apart and allowed; every restarted
//                          server started.
// Exit status 0 on PASS, 1 on FAIL, 2 on a usage or startup error.
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "dma/client.hpp"
#include "dma/protocol.hpp"
#include "support/child_process.hpp"
#include "support/pattern.hpp"
#include "support/redis_connection.hpp"
#include "support/redis_server.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr int kKeysPerClient = 8;
// How often a client reports and the parent samples the total operation count: four samples in
// each 1 s window of the recovery rule. A report is one short line, so this costs nothing.
constexpr auto kReportInterval = 250ms;
constexpr double kReportSeconds = 0.25;
// Between a client's failed reconnect attempts (the server is down or still starting).
constexpr auto kReconnectBackoff = 100ms;
// A client process does one operation at a time (SoakClient::run), so when it is SIGKILLed at
// most one of its operations is in flight: the server can fail at most that one transfer per
// client kill, and when the server is killed each client loses at most that one operation.
constexpr std::uint64_t kInFlightPerClient = 1;

// Throughput recovery (issue 13). Every rate is taken over a kWindow-long window of the series.
// The level is the median rate of the windows stepping by kWindowStep (one sample) that start
// after the first kLevelSkipsStart seconds (clients starting, the server's arena warming) and
// end before the last kLevelSkipsEnd (clients being stopped). A kill at t has recovered if the
// rate over [t + kRecoveryFrom, t + kRecoveryTo] is at least kRecovered x the level: the first
// second leaves a replacement client (or every client, after a server restart) time to start,
// connect and say hello; a whole second of rate is steady enough to compare; 0.75 leaves room
// for the noise of a shared machine and still catches a server that stays slow after a kill.
// A window that runs past the end of the series is not judged.
constexpr double kWindow = 1.0;
constexpr double kWindowStep = kReportSeconds;
constexpr double kLevelSkipsStart = 2.0;
constexpr double kLevelSkipsEnd = 1.0;
constexpr double kRecoveryFrom = 1.0;
constexpr double kRecoveryTo = kRecoveryFrom + kWindow;
constexpr double kRecovered = 0.75;

// A restarted server binds the port its predecessor listened on, which can be busy for a moment
// after the SIGKILL; RedisServer::start does not retry on a port it was given, so we do (any
// failure: the last attempt's error, with the server's log, is what gets reported).
constexpr int kRestartAttempts = 5;
constexpr auto kRestartBackoff = 200ms;

using Counts = std::map<std::string, std::uint64_t>;  // cause -> count

std::uint64_t sum_of(const Counts& counts) {
  std::uint64_t total = 0;
  for (const auto& [cause, count] : counts) total += count;
  return total;
}

// Counters one client process reports; summed by the parent.
struct Tally {
  std::uint64_t gets = 0;
  std::uint64_t sets = 0;
  std::uint64_t bytes = 0;
  std::uint64_t mismatches = 0;
  Counts errors;      // failed DMA.GET/DMA.SET
  Counts reconnects;  // failed reconnect attempts: "<delete|connect|hello>/<cause>"

  // "stats gets sets bytes mismatches op:cause=count ... reconnect:cause=count ..." (causes
  // have no spaces, ':' or '=').
  std::string line() const {
    std::ostringstream out;
    out << "stats " << gets << ' ' << sets << ' ' << bytes << ' ' << mismatches;
    for (const auto& [cause, count] : errors) out << " op:" << cause << '=' << count;
    for (const auto& [cause, count] : reconnects) out << " reconnect:" << cause << '=' << count;
    return out.str();
  }
  static std::optional<Tally> parse(const std::string& text) {
    std::istringstream in(text);
    std::string word;
    Tally tally;
    if (!(in >> word) || word != "stats") return std::nullopt;
    if (!(in >> tally.gets >> tally.sets >> tally.bytes >> tally.mismatches)) return std::nullopt;
    while (in >> word) {
      const auto colon = word.find(':');
      const auto equals = word.rfind('=');
      if (colon == std::string::npos || equals == std::string::npos || equals < colon) continue;
      const std::string kind = word.substr(0, colon);
      Counts& counts = kind == "op" ? tally.errors : tally.reconnects;
      counts[word.substr(colon + 1, equals - colon - 1)] +=
          std::strtoull(word.c_str() + equals + 1, nullptr, 10);
    }
    return tally;
  }
  void add(const Tally& other) {
    gets += other.gets;
    sets += other.sets;
    bytes += other.bytes;
    mismatches += other.mismatches;
    for (const auto& [cause, count] : other.errors) errors[cause] += count;
    for (const auto& [cause, count] : other.reconnects) reconnects[cause] += count;
  }
  std::uint64_t operations() const { return gets + sets; }
  std::uint64_t error_count() const { return sum_of(errors); }
  std::uint64_t reconnect_failures() const { return sum_of(reconnects); }
};

// A short, space-free name for an error's cause: its kind plus the first words of the message.
std::string cause_of(const dma::Error& error) {
  std::string cause(dma::to_string(error.code()));
  std::string words;
  int taken = 0;
  for (char c : error.message()) {
    if (c == ' ') {
      if (++taken == 4) break;
      words += '_';
    } else if (c == ':' || c == '=' || c == '\n' || c == '\r') {
      break;
    } else {
      words += c;
    }
  }
  for (char& c : cause) c = c == ' ' ? '_' : c;
  return cause + "/" + words;
}

dma::Configuration configuration_for(const std::string& provider) {
  dma::Configuration configuration;
  configuration.providers = {provider};
  configuration.bind = "127.0.0.1";
  return configuration;
}

std::string key_name(int slot, int key) {
  return "soak-" + std::to_string(slot) + "-" + std::to_string(key);
}

// ---- the client process ------------------------------------------------------------------------

struct ClientOptions {
  std::string provider = "tcp";
  int port = 0;
  int slot = 0;
  std::size_t max_size = 1 << 20;
  std::uint64_t seed = 0;
};

// Deletes this slot's keys over a plain connection (a predecessor may have left them).
dma::Status delete_slot_keys(int port, int slot) {
  auto connection = dma::support::RedisConnection::open("127.0.0.1", port, 10s);
  if (!connection) return dma::fail(connection.error());
  for (int key = 0; key < kKeysPerClient; ++key) {
    if (auto deleted = (*connection)->command({"DEL", key_name(slot, key)}); !deleted) {
      return dma::fail(deleted.error());
    }
  }
  return {};
}

// One client's loop: one operation at a time against its own keys, every GET checked.
class SoakClient {
 public:
  explicit SoakClient(const ClientOptions& options)
      : options_(options),
        random_(options.seed),
        value_(options.max_size),
        landing_(options.max_size),
        log_max_(std::log(static_cast<double>(options.max_size))) {}

  // Runs until `stop`, reporting every kReportInterval and once more at the end.
  void run(const std::atomic<bool>& stop) {
    auto report_at = Clock::now() + kReportInterval;
    while (!stop.load()) {
      if (Clock::now() >= report_at) {
        std::cout << tally_.line() << std::endl;
        report_at = Clock::now() + kReportInterval;
      }
      if (!client_ && !reconnect()) continue;
      const int key = static_cast<int>(random_() % kKeysPerClient);
      if (random_() % 2 == 0) {
        set_one(key);
      } else {
        get_one(key);
      }
    }
    std::cout << tally_.line() << std::endl;
  }

 private:
  // Deletes the slot's keys, connects and says hello. A failure at any step (the server down or
  // still starting) is counted as a reconnect attempt, backed off, and tried again by the caller.
  bool reconnect() {
    auto failed = [this](const char* stage, const dma::Error& error) {
      tally_.reconnects[std::string(stage) + "/" + cause_of(error)]++;
      std::this_thread::sleep_for(kReconnectBackoff);
      return false;
    };
    if (dma::Status deleted = delete_slot_keys(options_.port, options_.slot); !deleted) {
      return failed("delete", deleted.error());
    }
    // The keys are gone (or the server is a new, empty one): nothing is expected any more.
    expected_.fill(std::nullopt);
    absent_.fill(true);
    auto made = dma::Client::connect("127.0.0.1", options_.port,
                                     configuration_for(options_.provider));
    if (!made) return failed("connect", made.error());
    if (dma::Status said = (*made)->hello(); !said) return failed("hello", said.error());
    client_ = std::move(*made);
    return true;
  }

  // A failed operation is counted; a broken connection is dropped, to be reconnected (the key's
  // content is then unknown, which reconnect() takes care of).
  void failed(const dma::Error& error) {
    tally_.errors[cause_of(error)]++;
    if (error.code() == dma::ErrorCode::kUnreachable) client_.reset();
  }

  void set_one(int key) {
    const double draw = std::uniform_real_distribution<double>(0, log_max_)(random_);
    const auto size = std::clamp<std::size_t>(static_cast<std::size_t>(std::exp(draw)), 1,
                                              options_.max_size);
    const auto seed = static_cast<std::uint32_t>(random_());
    auto bytes = std::span<std::byte>(value_).first(size);
    dma::support::fill_pattern(bytes, seed);
    if (dma::Status stored = client_->set(key_name(options_.slot, key), bytes); !stored) {
      // Refused or failed on the server, it must leave the old value: the old CRC stays expected.
      failed(stored.error());
      return;
    }
    ++tally_.sets;
    tally_.bytes += size;
    expected_[key] = std::pair{dma::crc32c(bytes), size};
    absent_[key] = false;
  }

  void get_one(int key) {
    const std::string name = key_name(options_.slot, key);
    auto read = client_->get(name, landing_);
    if (!read) {
      if (read.error().code() == dma::ErrorCode::kCorrupted) {
        mismatch(read.error().describe());
      }
      failed(read.error());
      return;
    }
    ++tally_.gets;
    const auto& want = expected_[key];
    if (!read->has_value()) {
      if (want) mismatch(name + " vanished");
      return;
    }
    const std::size_t length = **read;
    tally_.bytes += length;
    if (absent_[key] ||
        (want && (want->second != length ||
                  want->first != dma::crc32c(std::span(landing_).first(length))))) {
      mismatch(name + " does not hold what was last stored there (" + std::to_string(length) +
               " bytes)");
    }
  }

  void mismatch(const std::string& what) {
    ++tally_.mismatches;
    std::cerr << "dma-soak client " << options_.slot << ": " << what << "\n";
  }

  ClientOptions options_;
  Tally tally_;
  std::mt19937_64 random_;
  std::vector<std::byte> value_;
  std::vector<std::byte> landing_;
  // What each key should hold: its CRC32C and length; nullopt = unknown (or absent).
  std::array<std::optional<std::pair<std::uint32_t, std::size_t>>, kKeysPerClient> expected_{};
  std::array<bool, kKeysPerClient> absent_{};
  std::unique_ptr<dma::Client> client_;
  double log_max_;
};

int run_client(const ClientOptions& options) {
  std::atomic<bool> stop{false};
  // The parent closes our stdin to stop us; a thread waits for that so the loop never blocks.
  std::thread watcher([&stop] {
    char byte;
    while (::read(STDIN_FILENO, &byte, 1) > 0) {
    }
    stop.store(true);
  });
  watcher.detach();
  SoakClient(options).run(stop);
  std::cout << "done" << std::endl;
  return 0;
}

// ---- the parent: clients, server, time series --------------------------------------------------

struct Options {
  std::string provider = "tcp";
  int clients = 4;
  double duration = 60;
  std::size_t max_size = 1 << 20;
  double kill_every = 0;         // a client; 0: never
  double kill_server_every = 0;  // the server; 0: never
  std::string series_path;       // non-empty: write the time series there
  bool kills_server() const { return kill_server_every > 0; }
};

// One client process (support::ChildProcess, pipes on its stdin and stdout) and its last
// report. Killed and reaped on destruction.
class ClientProcess {
 public:
  static std::unique_ptr<ClientProcess> spawn(const Options& options, int port, int slot,
                                              std::uint64_t seed) {
    auto child = dma::support::ChildProcess::spawn(
        {"/proc/self/exe", "client", "--provider", options.provider, "--port",
         std::to_string(port), "--slot", std::to_string(slot), "--max-size",
         std::to_string(options.max_size), "--seed", std::to_string(seed)});
    if (!child) {
      std::cerr << "dma-soak: " << child.error().describe() << "\n";
      return nullptr;
    }
    auto process = std::make_unique<ClientProcess>();
    process->child_ = std::move(*child);
    return process;
  }
  int output() const { return child_->output_fd(); }
  const Tally& tally() const { return tally_; }
  bool done() const { return done_; }
  bool open() const { return open_; }

  // Reads what is available and takes its reports; false at EOF.
  bool drain() {
    if (open_) open_ = child_->read_available();
    while (auto line = child_->take_line()) {
      if (auto tally = Tally::parse(*line)) tally_ = *tally;
      if (*line == "done") done_ = true;
    }
    return open_;
  }
  // Asks the client to stop: EOF on its stdin.
  void stop() { child_->close_input(); }
  void kill() {
    child_->kill_now();
    drain();
  }
  void reap() { child_->wait_exit(std::chrono::seconds(10)); }

 private:
  std::unique_ptr<dma::support::ChildProcess> child_;
  bool open_ = true;
  bool done_ = false;
  Tally tally_;
};

// The client processes, one per slot, and the last reports of those killed.
class ClientPool {
 public:
  ClientPool(const Options& options, int port) : options_(options), port_(port) {}

  bool start() {
    for (int slot = 0; slot < options_.clients; ++slot) {
      clients_.push_back(ClientProcess::spawn(options_, port_, slot, next_seed_++));
      if (!clients_.back()) {
        std::cerr << "dma-soak: cannot start client " << slot << "\n";
        return false;
      }
    }
    return true;
  }
  // Waits at most `timeout` for reports and takes whatever arrived. A client whose output ends
  // without our killing it exited on its own (crashed); it is counted, not replaced.
  void collect(std::chrono::milliseconds timeout) {
    std::vector<pollfd> fds;
    for (const auto& client : clients_) {
      if (client->open()) fds.push_back(pollfd{client->output(), POLLIN, 0});
    }
    if (fds.empty()) {
      std::this_thread::sleep_for(timeout);
      return;
    }
    ::poll(fds.data(), fds.size(), static_cast<int>(timeout.count()));
    for (auto& client : clients_) {
      if (client->open() && !client->drain()) {
        ++crashed_;
        std::cerr << "\ndma-soak: a client exited on its own\n";
      }
    }
  }
  // SIGKILLs the client in `slot` and starts a replacement there; false if it cannot start.
  bool kill_and_replace(int slot) {
    clients_[slot]->kill();
    retired_.add(clients_[slot]->tally());
    clients_[slot] = ClientProcess::spawn(options_, port_, slot, next_seed_++);
    if (!clients_[slot]) {
      std::cerr << "\ndma-soak: cannot restart client " << slot << "\n";
      return false;
    }
    return true;
  }
  // Stops every client (EOF on its stdin) and takes its last report; one that does not stop
  // within a minute is killed.
  void stop() {
    for (auto& client : clients_) client->stop();
    const auto deadline = Clock::now() + 60s;
    for (auto& client : clients_) {
      while (!client->done() && client->open() && Clock::now() < deadline) {
        pollfd fd{client->output(), POLLIN, 0};
        ::poll(&fd, 1, 200);
        client->drain();
      }
      if (client->done()) {
        client->reap();
      } else {
        std::cerr << "dma-soak: a client did not stop in time; killed\n";
        client->kill();
      }
    }
  }
  Tally total() const {
    Tally sum = retired_;
    for (const auto& client : clients_) sum.add(client->tally());
    return sum;
  }
  std::uint64_t crashed() const { return crashed_; }

 private:
  const Options& options_;
  int port_;
  std::uint64_t next_seed_ = 1;
  std::vector<std::unique_ptr<ClientProcess>> clients_;
  Tally retired_;  // the killed clients' last reports
  std::uint64_t crashed_ = 0;
};

// The redis-server under test through its incarnations: --kill-server-every replaces it with a
// new one on the same port with the same module arguments.
class SoakServer {
 public:
  explicit SoakServer(const Options& options) {
    options_.module_arguments = {"providers", options.provider, "bind", "127.0.0.1",
                                 "max-value-size", std::to_string(options.max_size)};
  }

  // The first incarnation, on a free port.
  dma::Status start() {
    auto started = dma::support::RedisServer::start(options_);
    if (!started) return dma::fail(started.error());
    adopt(std::move(*started));
    options_.port = server_->port();
    return {};
  }
  // SIGKILLs the server, reaps it, and starts the next incarnation on the same port, returning
  // once it answers PING.
  dma::Status kill_and_restart() {
    ::kill(server_->pid(), SIGKILL);
    server_->wait_for_exit(10s);
    server_.reset();
    ++kills_;
    std::optional<dma::Error> last;
    for (int attempt = 0; attempt < kRestartAttempts; ++attempt) {
      if (attempt > 0) std::this_thread::sleep_for(kRestartBackoff);
      auto started = dma::support::RedisServer::start(options_);
      if (started) {
        adopt(std::move(*started));
        return {};
      }
      last = started.error();
    }
    return dma::fail(*last);
  }

  bool running() const { return server_ != nullptr; }
  // True if the current incarnation exited without our killing it.
  bool died() { return server_ && server_->exited(); }
  int port() const { return options_.port; }
  pid_t pid() const { return server_ ? server_->pid() : 0; }
  std::uint64_t kills() const { return kills_; }
  std::optional<std::size_t> rss_at_start() const { return rss_at_start_; }
  std::optional<std::size_t> rss() { return server_ ? server_->rss_bytes() : std::nullopt; }
  std::string log() const { return server_ ? server_->log() : std::string(); }
  // The server's own count of failed transfers (INFO dma, dma_errors), or nullopt.
  std::optional<long long> failed_transfers() {
    if (!server_ || server_->exited()) return std::nullopt;
    auto connection = dma::support::RedisConnection::open(server_->host(), server_->port(), 10s);
    if (!connection) return std::nullopt;
    return (*connection)->info_field("dma", "dma_errors");
  }
  // Stops the current incarnation: its exit status, or nullopt if there is none.
  std::optional<int> stop() {
    if (!server_) return std::nullopt;
    return server_->stop();
  }

 private:
  void adopt(std::unique_ptr<dma::support::RedisServer> server) {
    server_ = std::move(server);
    rss_at_start_ = server_->rss_bytes();
  }

  dma::support::RedisServer::Options options_;
  std::unique_ptr<dma::support::RedisServer> server_;
  std::optional<std::size_t> rss_at_start_;
  std::uint64_t kills_ = 0;
};

// The total operation count over time, and rates read from it.
class Series {
 public:
  void record(double at, std::uint64_t operations) {
    samples_.push_back(Sample{at, static_cast<double>(operations)});
  }
  double end() const { return samples_.empty() ? 0 : samples_.back().at; }
  // "seconds operations" a line, for --series.
  void write(std::ostream& out) const {
    for (const Sample& sample : samples_) out << sample.at << ' ' << sample.operations << '\n';
  }
  // Operations per second over [from, to].
  double rate(double from, double to) const { return (count_at(to) - count_at(from)) / (to - from); }

 private:
  struct Sample {
    double at;  // seconds since the clients started
    double operations;
  };
  // The count at `at`, interpolated between the samples around it (a server restart leaves a
  // gap in the samples while the parent waits for the new server).
  double count_at(double at) const {
    if (samples_.empty()) return 0;
    const auto after = std::lower_bound(samples_.begin(), samples_.end(), at,
                                        [](const Sample& sample, double t) { return sample.at < t; });
    if (after == samples_.begin()) return after->operations;
    if (after == samples_.end()) return samples_.back().operations;
    const Sample& before = *(after - 1);
    const double span = after->at - before.at;
    if (span <= 0) return after->operations;
    return before.operations + (after->operations - before.operations) * (at - before.at) / span;
  }

  std::vector<Sample> samples_;
};

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t middle = values.size() / 2;
  return values.size() % 2 == 1 ? values[middle] : (values[middle - 1] + values[middle]) / 2;
}

// The throughput level and, for each kill, the rate after it relative to the level.
struct Recovery {
  std::optional<double> level;  // ops/s; nullopt if the run is too short to have one
  std::vector<double> ratios;   // one per judged kill
  std::vector<std::pair<double, double>> slow;  // the kills not recovered: time, ratio
  std::size_t not_judged = 0;   // kills whose window runs past the end

  std::size_t not_recovered() const { return slow.size(); }
};

// `kills`: seconds since the start at which each kill happened (see kRecovered).
Recovery judge_recovery(const Series& series, const std::vector<double>& kills) {
  Recovery recovery;
  std::vector<double> rates;
  for (int step = 0;; ++step) {
    const double from = kLevelSkipsStart + step * kWindowStep;
    if (from + kWindow > series.end() - kLevelSkipsEnd) break;
    rates.push_back(series.rate(from, from + kWindow));
  }
  if (!rates.empty()) recovery.level = median(rates);
  for (const double at : kills) {
    if (at + kRecoveryTo > series.end()) {
      ++recovery.not_judged;
      continue;
    }
    if (!recovery.level || *recovery.level <= 0) {
      // No level to come back to: nothing ran for most of the run (or it was too short to tell),
      // which is no recovery.
      recovery.slow.emplace_back(at, 0.0);
      continue;
    }
    const double ratio = series.rate(at + kRecoveryFrom, at + kRecoveryTo) / *recovery.level;
    recovery.ratios.push_back(ratio);
    if (ratio < kRecovered) recovery.slow.emplace_back(at, ratio);
  }
  return recovery;
}

// ---- the report --------------------------------------------------------------------------------

std::string seconds(double value) {
  std::ostringstream out;
  out << value << " s";
  return out.str();
}

std::string megabytes(std::optional<std::size_t> bytes) {
  if (!bytes) return "?";
  char text[32];
  std::snprintf(text, sizeof text, "%.1f MiB", static_cast<double>(*bytes) / (1 << 20));
  return text;
}

std::string fixed(double value, int decimals) {
  char text[32];
  std::snprintf(text, sizeof text, "%.*f", decimals, value);
  return text;
}

std::string optional_number(std::optional<long long> value) {
  return value ? std::to_string(*value) : std::string("?");
}

// One labelled line of the report.
void print_line(const std::string& label, const std::string& value) {
  constexpr std::size_t kLabelWidth = 30;
  std::cout << label << std::string(label.size() < kLabelWidth ? kLabelWidth - label.size() : 1, ' ')
            << value << "\n";
}

void print_counts(const Counts& counts) {
  for (const auto& [cause, count] : counts) std::cout << "  " << cause << ": " << count << "\n";
}

// "level 6100 ops/s" and the kills' ratios: min / median / max, how many did not recover.
void print_recovery(const Recovery& recovery, const char* kill) {
  print_line("throughput level",
             recovery.level ? fixed(*recovery.level, 0) +
                                  " ops/s (median 1 s rate, first 2 s and last 1 s left out)"
                            : std::string("? (the run is too short for one)"));
  std::string after = std::to_string(recovery.ratios.size()) + " " + kill + "s judged";
  if (!recovery.ratios.empty()) {
    const auto [low, high] = std::minmax_element(recovery.ratios.begin(), recovery.ratios.end());
    after += ", rate over [t+1 s, t+2 s] / level: min " + fixed(*low, 2) + ", median " +
             fixed(median(recovery.ratios), 2) + ", max " + fixed(*high, 2) + "; " +
             std::to_string(recovery.not_recovered()) + " below " + fixed(kRecovered, 2);
    const char* separator = ": ";
    for (const auto& [at, ratio] : recovery.slow) {
      after += separator + std::string("at ") + fixed(at, 1) + " s (" + fixed(ratio, 2) + ")";
      separator = ", ";
    }
  }
  if (recovery.not_judged > 0) {
    after += "; " + std::to_string(recovery.not_judged) + " not judged (window past the end)";
  }
  print_line("recovery", after);
}

// One condition of the PASS rule.
struct Check {
  std::string rule;
  bool held;
};

// "PASS (rule: a, b)" or "FAIL (not held: b; rule: a, b)".
bool print_result(const std::vector<Check>& checks) {
  std::string rule;
  std::string broken;
  for (const Check& check : checks) {
    rule += (rule.empty() ? "" : ", ") + check.rule;
    if (!check.held) broken += (broken.empty() ? "" : ", ") + check.rule;
  }
  const bool passed = broken.empty();
  print_line("result", std::string(passed ? "PASS" : "FAIL") + " (" +
                           (passed ? "" : "not held: " + broken + "; ") + "rule: " + rule + ")");
  return passed;
}

// ---- the parent's run --------------------------------------------------------------------------

class Soak {
 public:
  explicit Soak(const Options& options) : options_(options), server_(options) {}

  int run() {
    ::signal(SIGPIPE, SIG_IGN);
    if (dma::Status started = server_.start(); !started) {
      std::cerr << "dma-soak: " << started.error().describe() << "\n";
      return 2;
    }
    print_banner();
    clients_ = std::make_unique<ClientPool>(options_, server_.port());
    if (!clients_->start()) return 2;
    start_ = Clock::now();
    sample();
    if (!run_until_the_end()) return 2;
    sample();  // the end of the series: the clients are stopped after it
    std::fprintf(stderr, "\n");
    clients_->stop();
    write_series();
    return report();
  }

 private:
  double elapsed() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }
  void sample() { series_.record(elapsed(), clients_->total().operations()); }

  void print_banner() {
    std::string mode;
    if (options_.kill_every > 0) mode = ", killing a client every " + seconds(options_.kill_every);
    if (options_.kills_server()) {
      mode = ", killing the server " + seconds(options_.kill_server_every) + " after each start";
    }
    std::cerr << "dma-soak: redis-server pid " << server_.pid() << " port " << server_.port()
              << ", provider " << options_.provider << ", " << options_.clients << " clients, "
              << options_.duration << " s, sizes 1.." << options_.max_size << " B" << mode << "\n";
  }

  // The main loop: samples, kills and progress until the duration has passed or the server died
  // or could not be restarted. False on a startup error (a client that cannot be started).
  bool run_until_the_end() {
    constexpr double kNever = std::numeric_limits<double>::infinity();
    double next_sample = kReportSeconds;
    double next_progress = 1;
    double next_client_kill = options_.kill_every > 0 ? options_.kill_every : kNever;
    double next_server_kill = options_.kills_server() ? options_.kill_server_every : kNever;
    int victim = 0;
    for (double now = elapsed(); now < options_.duration; now = elapsed()) {
      const double wake = std::min({next_sample, next_client_kill, next_server_kill,
                                    options_.duration});
      clients_->collect(
          std::chrono::milliseconds(static_cast<long>(std::ceil(std::max(0.0, wake - now) * 1000))));
      now = elapsed();
      if (now >= next_sample) {
        sample();
        next_sample += kReportSeconds;
        // Behind after a server restart (we waited for the new one): one interval from now.
        if (next_sample <= now) next_sample = now + kReportSeconds;
      }
      if (now >= next_client_kill) {
        // The count at the kill: the victim's operations since its last report are lost with it,
        // which this keeps out of the windows before the kill.
        sample();
        kills_at_.push_back(elapsed());
        if (!clients_->kill_and_replace(victim)) return false;
        victim = (victim + 1) % options_.clients;
        next_client_kill += options_.kill_every;
      }
      if (now >= next_server_kill) {
        if (!restart_server()) return true;
        next_server_kill = kills_at_.back() + options_.kill_server_every;
      }
      if (server_.died()) {
        server_died_ = true;
        return true;
      }
      if (now >= next_progress) {
        print_progress();
        next_progress += 1;
      }
    }
    return true;
  }

  // Kills the server and starts the next; the kill's time for the recovery rule is when the new
  // server answered PING. False (and restart_failed_) if it could not be started.
  bool restart_server() {
    sample();  // the count just before the kill, so the gap while restarting is interpolated
    if (dma::Status restarted = server_.kill_and_restart(); !restarted) {
      std::cerr << "\ndma-soak: cannot restart the server on port " << server_.port() << ": "
                << restarted.error().describe() << "\n";
      restart_failed_ = true;
      return false;
    }
    kills_at_.push_back(elapsed());
    sample();
    return true;
  }

  // --series: "<seconds> <operations>" per sample, then "kill <seconds>" per kill, to see what a
  // recovery the rule judged looked like.
  void write_series() const {
    if (options_.series_path.empty()) return;
    std::ofstream out(options_.series_path);
    series_.write(out);
    for (const double at : kills_at_) out << "kill " << at << '\n';
    if (!out) std::cerr << "dma-soak: cannot write " << options_.series_path << "\n";
  }

  // Must not touch a server that is not there (between incarnations).
  void print_progress() {
    const Tally sum = clients_->total();
    const double now = elapsed();
    const std::uint64_t kills = options_.kills_server() ? server_.kills() : kills_at_.size();
    std::fprintf(stderr,
                 "\r[%5.0f s] ops %" PRIu64 " (%.0f/s), %.1f MiB, errors %" PRIu64
                 ", reconnect failures %" PRIu64 ", mismatches %" PRIu64 ", %s %" PRIu64
                 ", server RSS %s   ",
                 now, sum.operations(), series_.rate(std::max(0.0, now - kWindow), now),
                 static_cast<double>(sum.bytes) / (1 << 20), sum.error_count(),
                 sum.reconnect_failures(), sum.mismatches,
                 options_.kills_server() ? "server kills" : "kills", kills,
                 megabytes(server_.rss()).c_str());
  }

  int report() {
    const Tally sum = clients_->total();
    const double elapsed_now = elapsed();
    const auto rss_end = server_.rss();
    server_died_ = server_died_ || server_.died();
    // Read before the server is stopped; after the clients stopped, so nothing is in flight.
    const std::optional<long long> failed_transfers = server_.failed_transfers();

    print_line("provider", options_.provider);
    print_line("clients", std::to_string(options_.clients) + " processes" + clients_mode());
    print_line("duration", seconds(elapsed_now));
    print_line("operations", std::to_string(sum.operations()) + " (" + std::to_string(sum.sets) +
                                 " DMA.SET, " + std::to_string(sum.gets) + " DMA.GET), " +
                                 fixed(sum.operations() / elapsed_now, 0) + " ops/s");
    print_line("bytes", std::to_string(sum.bytes) + " (" +
                            fixed(static_cast<double>(sum.bytes) / 1e6 / elapsed_now, 1) + " MB/s)");
    std::vector<Check> checks{{"0 mismatches", sum.mismatches == 0}};
    if (options_.kills_server()) {
      report_server_kills(sum, failed_transfers, checks);
    } else {
      report_client_kills(sum, failed_transfers, checks);
    }
    print_line("mismatches", std::to_string(sum.mismatches));
    const Recovery recovery = judge_recovery(series_, kills_at_);
    print_recovery(recovery, options_.kills_server() ? "restart" : "kill");
    checks.push_back({std::string(options_.kills_server() ? "all restarts" : "all kills") +
                          " recovered within 2 s (rate over [t+1 s, t+2 s] >= " +
                          fixed(kRecovered, 2) + " x level)",
                      recovery.not_recovered() == 0});
    checks.push_back({"a throughput level above 0", recovery.level && *recovery.level > 0});
    const std::string incarnation = options_.kills_server() ? " (last incarnation)" : "";
    print_line("server RSS", megabytes(server_.rss_at_start()) + " at start, " +
                                 megabytes(rss_end) + " at end" + incarnation);
    print_line("server", server_died_ ? "DIED" : restart_failed_ ? "NOT RESTARTED" : "alive");
    if (server_died_) std::cerr << "dma-soak: the server died:\n" << server_.log() << "\n";
    const std::string server_log = server_.log();  // before stop() removes it
    const std::optional<int> status = server_.stop();
    print_line("server exit", (status ? std::to_string(*status) : std::string("-")) + incarnation);
    print_line("client crashes", std::to_string(clients_->crashed()));
    // The server exits 0 on SHUTDOWN (bounded by the module's shutdown-deadline-ms even with
    // wedged endpoints).
    checks.push_back({"no client exited on its own", clients_->crashed() == 0});
    checks.push_back({"server never died on its own", !server_died_});
    checks.push_back({"server exit 0", status && *status == 0});
    checks.push_back({"some work done", sum.operations() > 0});
    const bool passed = print_result(checks);
    if (!passed) print_module_lines(server_log);
    return passed ? 0 : 1;
  }

  // What the module logged (endpoint replacements and why, shutdown), for a run that failed.
  static void print_module_lines(const std::string& log) {
    std::istringstream lines(log);
    std::string line;
    std::cerr << "dma-soak: the module's lines in the server's log:\n";
    while (std::getline(lines, line)) {
      if (line.find("dma") != std::string::npos) std::cerr << "  " << line << "\n";
    }
  }

  std::string clients_mode() const {
    if (options_.kill_every > 0) {
      return ", one SIGKILLed and restarted every " + seconds(options_.kill_every);
    }
    if (options_.kills_server()) {
      return " kept running; the server SIGKILLed " + seconds(options_.kill_server_every) +
             " after each start and restarted on port " + std::to_string(server_.port());
    }
    return ", none killed";
  }

  // Every error a client reports is a live client's: a killed one cannot report the operation
  // it died in. The server may fail the killed clients' transfers in flight, no more.
  void report_client_kills(const Tally& sum, std::optional<long long> failed_transfers,
                           std::vector<Check>& checks) {
    const std::uint64_t kills = kills_at_.size();
    const std::uint64_t allowed = kills * kInFlightPerClient;
    const std::uint64_t live_errors = sum.error_count() + sum.reconnect_failures();
    print_line("clients killed", std::to_string(kills));
    print_line("errors seen by live clients",
               std::to_string(live_errors) + " (" + std::to_string(sum.error_count()) +
                   " operations, " + std::to_string(sum.reconnect_failures()) + " reconnects)");
    print_counts(sum.errors);
    print_counts(sum.reconnects);
    print_line("server-side failed transfers",
               optional_number(failed_transfers) + " (allowed: kills " + std::to_string(kills) +
                   " x " + std::to_string(kInFlightPerClient) + " in flight = " +
                   std::to_string(allowed) + ")");
    checks.push_back({"0 errors seen by live clients", live_errors == 0});
    checks.push_back({"server-side failed transfers <= kills x " +
                          std::to_string(kInFlightPerClient),
                      failed_transfers && *failed_transfers >= 0 &&
                          static_cast<std::uint64_t>(*failed_transfers) <= allowed});
  }

  // Each client may lose its operation in flight per server kill; its reconnect attempts while
  // the server is down fail, and are counted apart.
  void report_server_kills(const Tally& sum, std::optional<long long> failed_transfers,
                           std::vector<Check>& checks) {
    const std::uint64_t kills = server_.kills();
    const std::uint64_t allowed = static_cast<std::uint64_t>(options_.clients) * kills *
                                  kInFlightPerClient;
    print_line("servers killed", std::to_string(kills) + (restart_failed_
                                                               ? ", the last restart FAILED"
                                                               : ", every restart started"));
    print_line("operation errors", std::to_string(sum.error_count()) + " (allowed: clients " +
                                       std::to_string(options_.clients) + " x server kills " +
                                       std::to_string(kills) + " = " + std::to_string(allowed) +
                                       ")");
    print_counts(sum.errors);
    print_line("reconnect failures", std::to_string(sum.reconnect_failures()) +
                                         " (attempts while the server was down; allowed)");
    print_counts(sum.reconnects);
    print_line("server-side failed transfers",
               optional_number(failed_transfers) + " (last incarnation; not judged)");
    checks.push_back({"operation errors <= clients x server kills", sum.error_count() <= allowed});
    checks.push_back({"every restarted server started", !restart_failed_});
  }

  Options options_;
  SoakServer server_;
  std::unique_ptr<ClientPool> clients_;
  Series series_;
  Clock::time_point start_;
  // When each kill happened (seconds since the start): a client's SIGKILL, or the moment the
  // server that replaced a killed one answered PING.
  std::vector<double> kills_at_;
  bool server_died_ = false;
  bool restart_failed_ = false;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dma-soak: many clients against a redis-server with the dma module, every GET checked"};
  Options options;
  app.add_option("--provider", options.provider, "fabric provider")
      ->check(CLI::IsMember({"tcp", "shm", "net"}));
  app.add_option("--clients", options.clients, "client processes")->check(CLI::Range(1, 256));
  app.add_option("--duration", options.duration, "seconds to run")->check(CLI::PositiveNumber);
  app.add_option("--max-size", options.max_size, "largest value in bytes")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 30));
  CLI::Option* kill_every = app.add_option(
      "--kill-every", options.kill_every,
      "SIGKILL one client (round robin) and restart it every this many seconds; 0: never")
      ->check(CLI::NonNegativeNumber);
  // At least 2 s, so that each kill's recovery window [t+1 s, t+2 s] falls within the life of
  // the server it judges.
  app.add_option("--kill-server-every", options.kill_server_every,
                 "SIGKILL the redis-server this many seconds after each start and start a new one "
                 "on the same port (at least 2)")
      ->check(CLI::Range(2.0, 86400.0))
      ->excludes(kill_every);
  app.add_option("--series", options.series_path,
                 "write the operation count every 250 ms and the kill times to this file");
  ClientOptions client_options;
  CLI::App* client = app.add_subcommand("client", "one client process (spawned by dma-soak)");
  client->add_option("--provider", client_options.provider)->required();
  client->add_option("--port", client_options.port)->required();
  client->add_option("--slot", client_options.slot)->required();
  client->add_option("--max-size", client_options.max_size)->required();
  client->add_option("--seed", client_options.seed);
  CLI11_PARSE(app, argc, argv);
  if (client->parsed()) return run_client(client_options);
  return Soak(options).run();
}
