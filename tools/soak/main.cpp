// dma-soak: hammers a redis-server running the dma module with many clients for a while, kills
// clients or the server under them, and checks every byte that comes back.
//
//   dma-soak --provider tcp|net|shm --clients N --duration S [--max-size B]
//            [--kill-every S | --kill-server-every S] [--series FILE]
//
// Exit status: 0 PASS, 1 FAIL, 2 a usage error or a run that could not start (as dma-cli).
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
//
// The parts, under tools/soak/: main.cpp (this: the command line and the parent's run),
// client.* (the client process), client_pool.* (the client processes as the parent sees them),
// server.* (the server's incarnations), tally.* (a client's report line), series.* (the time
// series), recovery.* (the recovery judge), report.* (the report and its PASS rule).
#include <signal.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <limits>
#include <memory>
#include <vector>

#include "soak/client.hpp"
#include "soak/client_pool.hpp"
#include "soak/options.hpp"
#include "soak/recovery.hpp"
#include "soak/report.hpp"
#include "soak/series.hpp"
#include "soak/server.hpp"
#include "soak/tally.hpp"

namespace dma::soak {
namespace {

using Clock = std::chrono::steady_clock;

// The parent's run: starts the server and the clients, samples, kills and prints progress until
// the duration has passed, then stops the clients and reports. One thread.
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
    return finish();
  }

 private:
  double elapsed() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }
  void sample() { series_.record(elapsed(), clients_->total().operations()); }
  std::uint64_t kills() const {
    return options_.kills_server() ? server_.kills() : kills_at_.size();
  }

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
    std::fprintf(stderr,
                 "\r[%5.0f s] ops %" PRIu64 " (%.0f/s), %.1f MiB, errors %" PRIu64
                 ", reconnect failures %" PRIu64 ", mismatches %" PRIu64 ", %s %" PRIu64
                 ", server RSS %s   ",
                 now, sum.operations(), series_.rate(std::max(0.0, now - kWindow), now),
                 static_cast<double>(sum.bytes) / (1 << 20), sum.error_count(),
                 sum.reconnect_failures(), sum.mismatches,
                 options_.kills_server() ? "server kills" : "kills", kills(),
                 megabytes(server_.rss()).c_str());
  }

  // The clients have stopped, so nothing is in flight; the server's count of failed transfers,
  // its RSS and its log are read before it is stopped.
  int finish() {
    RunSummary run;
    run.sum = clients_->total();
    run.elapsed = elapsed();
    run.rss_end = server_.rss();
    run.server_died = server_died_ || server_.died();
    run.failed_transfers = server_.failed_transfers();
    run.kills = kills();
    run.recovery = judge_recovery(series_, kills_at_);
    run.port = server_.port();
    run.rss_at_start = server_.rss_at_start();
    run.restart_failed = restart_failed_;
    run.server_log = server_.log();  // before stop() removes it
    run.server_exit = server_.stop();
    run.client_crashes = clients_->crashed();
    return report(options_, run);
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
}  // namespace dma::soak

int main(int argc, char** argv) {
  CLI::App app{"dma-soak: many clients against a redis-server with the dma module, every GET checked"};
  dma::soak::Options options;
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
  dma::soak::ClientOptions client_options;
  CLI::App* client = app.add_subcommand("client", "one client process (spawned by dma-soak)");
  client->add_option("--provider", client_options.provider)->required();
  client->add_option("--port", client_options.port)->required();
  client->add_option("--slot", client_options.slot)->required();
  client->add_option("--max-size", client_options.max_size)->required();
  client->add_option("--seed", client_options.seed);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    // --help is 0; a usage error is 2, as for a run that could not start and the other tools.
    return app.exit(error) == 0 ? 0 : 2;
  }
  if (client->parsed()) return dma::soak::run_client(client_options);
  return dma::soak::Soak(options).run();
}
