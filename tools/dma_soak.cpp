// dma-soak: hammers a redis-server running the dma module with many clients for a while and
// checks every byte that comes back.
//
//   dma-soak --provider tcp|shm --clients N --duration S [--max-size B] [--kill-every S]
//
// The parent starts redis-server with the module on loopback (support/redis_server.hpp), then runs
// N client *processes* (`dma-soak client ...`, this same executable), so that --kill-every can
// SIGKILL one of them (round robin) every S seconds mid-transfer and start a replacement: a dead
// peer's transfers are exactly what the server has to survive. Each client owns the keys
// soak-<slot>-0..7, deletes them when it starts (its predecessor in the slot may have been
// killed), and does random DMA.SET/DMA.GET of random sizes (log-uniform in 1..max-size). It
// remembers the CRC32C of what it last stored under each key; every GET is checked against it,
// and a difference is a *mismatch*. A SET that failed on the server must leave the old value
// (so the old CRC stays expected); only when the connection itself broke is the key's content
// unknown until the next successful SET.
//
// Clients report cumulative counters on stdout once a second ("stats ..." lines); the parent
// prints a progress line on stderr and at the end a report: operations, bytes, errors by cause,
// mismatches, the server's RSS at start and end. Exit status 1 if any mismatch was seen, the
// server died, or nothing at all was transferred; 2 on a usage or startup error.
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <optional>
#include <random>
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

// Counters one client process reports; summed by the parent.
struct Tally {
  std::uint64_t gets = 0;
  std::uint64_t sets = 0;
  std::uint64_t bytes = 0;
  std::uint64_t mismatches = 0;
  std::map<std::string, std::uint64_t> errors;  // cause -> count

  // "stats gets sets bytes mismatches cause=count ..." (causes have no spaces).
  std::string line() const {
    std::ostringstream out;
    out << "stats " << gets << ' ' << sets << ' ' << bytes << ' ' << mismatches;
    for (const auto& [cause, count] : errors) out << ' ' << cause << '=' << count;
    return out.str();
  }
  static std::optional<Tally> parse(const std::string& text) {
    std::istringstream in(text);
    std::string word;
    Tally tally;
    if (!(in >> word) || word != "stats") return std::nullopt;
    if (!(in >> tally.gets >> tally.sets >> tally.bytes >> tally.mismatches)) return std::nullopt;
    while (in >> word) {
      const auto equals = word.rfind('=');
      if (equals == std::string::npos) continue;
      tally.errors[word.substr(0, equals)] += std::strtoull(word.c_str() + equals + 1, nullptr, 10);
    }
    return tally;
  }
  void add(const Tally& other) {
    gets += other.gets;
    sets += other.sets;
    bytes += other.bytes;
    mismatches += other.mismatches;
    for (const auto& [cause, count] : other.errors) errors[cause] += count;
  }
  std::uint64_t error_count() const {
    std::uint64_t total = 0;
    for (const auto& [cause, count] : errors) total += count;
    return total;
  }
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

// ---- the client process ------------------------------------------------------------------------

struct ClientOptions {
  std::string provider = "tcp";
  int port = 0;
  int slot = 0;
  std::size_t max_size = 1 << 20;
  std::uint64_t seed = 0;
};

// Deletes this slot's keys over a plain connection (a predecessor may have left them).
bool delete_slot_keys(int port, int slot) {
  auto connection = dma::support::RedisConnection::open("127.0.0.1", port, 10s);
  if (!connection) return false;
  for (int key = 0; key < kKeysPerClient; ++key) {
    const std::string name = "soak-" + std::to_string(slot) + "-" + std::to_string(key);
    if (!(*connection)->command({"DEL", name})) return false;
  }
  return true;
}

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

  Tally tally;
  std::mt19937_64 random(options.seed);
  std::vector<std::byte> value(options.max_size);
  std::vector<std::byte> landing(options.max_size);
  // What each key should hold: its CRC32C and length; nullopt = unknown (or absent).
  std::array<std::optional<std::pair<std::uint32_t, std::size_t>>, kKeysPerClient> expected{};
  std::array<bool, kKeysPerClient> absent{};
  absent.fill(true);
  std::unique_ptr<dma::Client> client;
  auto report_at = Clock::now() + 1s;
  const double log_max = std::log(static_cast<double>(options.max_size));

  while (!stop.load()) {
    if (!client) {
      if (!delete_slot_keys(options.port, options.slot)) {
        tally.errors["connect/delete_failed"]++;
        std::this_thread::sleep_for(100ms);  // back off before reconnecting
        continue;
      }
      expected.fill(std::nullopt);
      absent.fill(true);
      auto made = dma::Client::connect("127.0.0.1", options.port,
                                       configuration_for(options.provider));
      if (!made) {
        tally.errors[cause_of(made.error())]++;
        std::this_thread::sleep_for(100ms);  // back off before reconnecting
        continue;
      }
      if (dma::Status said = (*made)->hello(); !said) {
        tally.errors[cause_of(said.error())]++;
        std::this_thread::sleep_for(100ms);
        continue;
      }
      client = std::move(*made);
    }
    const int key_index = static_cast<int>(random() % kKeysPerClient);
    const std::string key = "soak-" + std::to_string(options.slot) + "-" + std::to_string(key_index);
    const bool do_set = random() % 2 == 0;
    if (do_set) {
      const double draw = std::uniform_real_distribution<double>(0, log_max)(random);
      const auto size = std::clamp<std::size_t>(static_cast<std::size_t>(std::exp(draw)), 1,
                                                options.max_size);
      const auto seed = static_cast<std::uint32_t>(random());
      auto bytes = std::span<std::byte>(value).first(size);
      dma::support::fill_pattern(bytes, seed);
      dma::Status stored = client->set(key, bytes);
      if (stored) {
        ++tally.sets;
        tally.bytes += size;
        expected[key_index] = std::pair{dma::crc32c(bytes), size};
        absent[key_index] = false;
      } else {
        tally.errors[cause_of(stored.error())]++;
        if (stored.error().code() == dma::ErrorCode::kUnreachable) {
          // The connection broke: the SET may or may not have happened; reconnect.
          client.reset();
        }
        // Otherwise the server refused or failed it, which must leave the old value.
      }
    } else {
      auto read = client->get(key, landing);
      if (!read) {
        if (read.error().code() == dma::ErrorCode::kCorrupted) {
          ++tally.mismatches;
          std::cerr << "dma-soak client " << options.slot << ": " << read.error().describe() << "\n";
        }
        tally.errors[cause_of(read.error())]++;
        if (read.error().code() == dma::ErrorCode::kUnreachable) client.reset();
      } else {
        ++tally.gets;
        if (read->has_value()) {
          const std::size_t length = **read;
          tally.bytes += length;
          const auto& want = expected[key_index];
          if (absent[key_index] ||
              (want && (want->second != length ||
                        want->first != dma::crc32c(std::span(landing).first(length))))) {
            ++tally.mismatches;
            std::cerr << "dma-soak client " << options.slot << ": " << key
                      << " does not hold what was last stored there (" << length << " bytes)\n";
          }
        } else if (expected[key_index]) {
          ++tally.mismatches;
          std::cerr << "dma-soak client " << options.slot << ": " << key << " vanished\n";
        }
      }
    }
    if (Clock::now() >= report_at) {
      std::cout << tally.line() << std::endl;
      report_at = Clock::now() + 1s;
    }
  }
  std::cout << tally.line() << std::endl;
  std::cout << "done" << std::endl;
  return 0;
}

// ---- the parent --------------------------------------------------------------------------------

struct Options {
  std::string provider = "tcp";
  int clients = 4;
  double duration = 60;
  std::size_t max_size = 1 << 20;
  double kill_every = 0;
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

  // Reads what is available and takes its reports; false at EOF.
  bool drain() {
    const bool open = child_->read_available();
    while (auto line = child_->take_line()) {
      if (auto tally = Tally::parse(*line)) tally_ = *tally;
      if (*line == "done") done_ = true;
    }
    return open;
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
  bool done_ = false;
  Tally tally_;
};

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

int run_parent(const Options& options) {
  ::signal(SIGPIPE, SIG_IGN);
  dma::support::RedisServer::Options server_options;
  server_options.module_arguments = {"providers", options.provider, "bind", "127.0.0.1",
                                     "max-value-size", std::to_string(options.max_size)};
  auto server = dma::support::RedisServer::start(server_options);
  if (!server) {
    std::cerr << "dma-soak: " << server.error().describe() << "\n";
    return 2;
  }
  const auto rss_start = (*server)->rss_bytes();
  const int port = (*server)->port();
  std::cerr << "dma-soak: redis-server pid " << (*server)->pid() << " port " << port
            << ", provider " << options.provider << ", " << options.clients << " clients, "
            << options.duration << " s, sizes 1.." << options.max_size << " B"
            << (options.kill_every > 0 ? ", killing a client every " + seconds(options.kill_every)
                                       : std::string()) << "\n";

  std::uint64_t next_seed = 1;
  std::vector<std::unique_ptr<ClientProcess>> clients;
  for (int slot = 0; slot < options.clients; ++slot) {
    clients.push_back(ClientProcess::spawn(options, port, slot, next_seed++));
    if (!clients.back()) {
      std::cerr << "dma-soak: cannot start client " << slot << "\n";
      return 2;
    }
  }
  Tally retired;  // the killed clients' last reports
  std::uint64_t kills = 0;
  const auto start = Clock::now();
  const auto end = start + std::chrono::duration_cast<Clock::duration>(
                               std::chrono::duration<double>(options.duration));
  const auto kill_period = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(options.kill_every));
  auto next_kill = start + kill_period;
  auto next_progress = start + 1s;
  int victim = 0;
  auto total = [&] {
    Tally sum = retired;
    for (const auto& client : clients) sum.add(client->tally());
    return sum;
  };
  bool server_died = false;
  while (Clock::now() < end) {
    std::vector<pollfd> fds;
    for (const auto& client : clients) fds.push_back(pollfd{client->output(), POLLIN, 0});
    ::poll(fds.data(), fds.size(), 200);
    for (auto& client : clients) client->drain();
    if (options.kill_every > 0 && Clock::now() >= next_kill) {
      clients[victim]->kill();
      retired.add(clients[victim]->tally());
      clients[victim] = ClientProcess::spawn(options, port, victim, next_seed++);
      if (!clients[victim]) {
        std::cerr << "\ndma-soak: cannot restart client " << victim << "\n";
        return 2;
      }
      ++kills;
      victim = (victim + 1) % options.clients;
      next_kill += kill_period;
    }
    if ((*server)->exited()) {
      server_died = true;
      break;
    }
    if (Clock::now() >= next_progress) {
      const Tally sum = total();
      const auto elapsed = std::chrono::duration<double>(Clock::now() - start).count();
      std::fprintf(stderr,
                   "\r[%5.0f s] ops %" PRIu64 " (%.0f/s), %.1f MiB, errors %" PRIu64
                   ", mismatches %" PRIu64 ", kills %" PRIu64 ", server RSS %s   ",
                   elapsed, sum.gets + sum.sets, (sum.gets + sum.sets) / elapsed,
                   static_cast<double>(sum.bytes) / (1 << 20), sum.error_count(), sum.mismatches,
                   kills, megabytes((*server)->rss_bytes()).c_str());
      next_progress += 1s;
    }
  }
  std::fprintf(stderr, "\n");
  // Stop the clients: close their stdin, collect their last report, reap them.
  for (auto& client : clients) client->stop();
  const auto stop_deadline = Clock::now() + 60s;
  for (auto& client : clients) {
    while (!client->done() && Clock::now() < stop_deadline) {
      pollfd fd{client->output(), POLLIN, 0};
      ::poll(&fd, 1, 200);
      if (!client->drain()) break;  // EOF
    }
    if (client->done()) {
      client->reap();
    } else {
      std::cerr << "dma-soak: a client did not stop in time; killed\n";
      client->kill();
    }
  }
  const Tally sum = total();
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  const auto rss_end = (*server)->rss_bytes();
  server_died = server_died || (*server)->exited();

  std::cout << "provider          " << options.provider << "\n"
            << "clients           " << options.clients << " processes"
            << (options.kill_every > 0 ? ", one SIGKILLed and restarted every " + seconds(options.kill_every)
                                       : std::string())
            << "\n"
            << "duration          " << elapsed << " s\n"
            << "operations        " << sum.gets + sum.sets << " (" << sum.sets << " DMA.SET, "
            << sum.gets << " DMA.GET), " << (sum.gets + sum.sets) / elapsed << " ops/s\n"
            << "bytes             " << sum.bytes << " (" << static_cast<double>(sum.bytes) / 1e6 / elapsed
            << " MB/s)\n"
            << "clients killed    " << kills << "\n"
            << "errors            " << sum.error_count() << "\n";
  for (const auto& [cause, count] : sum.errors) {
    std::cout << "  " << cause << ": " << count << "\n";
  }
  std::cout << "mismatches        " << sum.mismatches << "\n"
            << "server RSS        " << megabytes(rss_start) << " at start, " << megabytes(rss_end)
            << " at end\n"
            << "server            " << (server_died ? "DIED" : "alive") << "\n";
  if (server_died) std::cerr << "dma-soak: the server died:\n" << (*server)->log() << "\n";
  const int status = (*server)->stop();
  std::cout << "server exit       " << status << "\n";
  // Pass: no mismatch, the server alive throughout and exiting 0 on SHUTDOWN (bounded by the
  // module's shutdown-deadline-ms even with wedged endpoints), and some work done.
  const bool passed = sum.mismatches == 0 && !server_died && status == 0 && sum.gets + sum.sets > 0;
  std::cout << "result            " << (passed ? "PASS" : "FAIL")
            << " (rule: 0 mismatches, server alive, server exit 0)\n";
  return passed ? 0 : 1;
}

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
  app.add_option("--kill-every", options.kill_every,
                 "SIGKILL one client (round robin) and restart it every this many seconds; 0: never");
  ClientOptions client_options;
  CLI::App* client = app.add_subcommand("client", "one client process (spawned by dma-soak)");
  client->add_option("--provider", client_options.provider)->required();
  client->add_option("--port", client_options.port)->required();
  client->add_option("--slot", client_options.slot)->required();
  client->add_option("--max-size", client_options.max_size)->required();
  client->add_option("--seed", client_options.seed);
  CLI11_PARSE(app, argc, argv);
  if (client->parsed()) return run_client(client_options);
  return run_parent(options);
}
