// RedisServer: a redis-server child with the dma module loaded, on loopback, for the module
// tests, dma-demo, dma-soak and `dma-bench redis`. Failures are Results, never test assertions.
//
// start() spawns `redis-server --port P --bind 127.0.0.1 --save '' --appendonly no [--dir D]
// [cluster options] <server arguments...> --loadmodule <module> <module arguments...>` (see
// Options; support/redis_cluster.hpp builds a cluster of them) with stdout and stderr in a
// temporary log file, then polls PING until it answers or the start deadline passes (a child
// cannot notify us, so polling is the only way to learn it is ready). With port 0 it picks a
// port the kernel just had free; another process (a test running in parallel) can take it
// before the server binds it, so a start that fails with "Address already in use" is retried on
// another port instead of failing the caller.
//
// Ownership: the object owns the child process and its log file. Destroying it (or stop())
// sends SHUTDOWN NOSAVE, then SIGTERM, then SIGKILL, within `stop_deadline` in all; the child is
// always reaped and the log removed. Thread-safety: none; one owner thread.
//
// Sanitizer builds: an instrumented module needs its runtime preloaded into the uninstrumented
// redis-server, so a build with asan or tsan adds LD_PRELOAD (and the runtime's options) to the
// child's environment. IPATH_NO_BACKTRACE=1 keeps libinfinipath (loaded with libfabric's psm
// provider) from taking over SIGTERM (module.cpp, warn_if_sigterm_taken).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dma/result.hpp"
#include "support/child_process.hpp"

namespace dma::support {

class RedisServer {
 public:
  struct Options {
    // The module to load; empty: <directory of this executable>/../lib/dma.so (build/bin ->
    // build/lib), or else the installed <prefix>/<libdir>/dma/dma.so (bin -> lib/dma).
    std::string module_path;
    // Module load arguments as name/value pairs (module/core.hpp parse_module_arguments).
    std::vector<std::string> module_arguments{"providers", "tcp", "bind", "127.0.0.1"};
    // Extra redis-server options placed before --loadmodule, e.g. {"--maxmemory", "1gb"},
    // {"--replicaof", "127.0.0.1", "6379"}, {"--appendonly", "yes"} (they override the defaults
    // above).
    std::vector<std::string> server_arguments;
    // The server's working directory (--dir), where its RDB, AOF and cluster node file live;
    // it must exist. Empty: none given (the caller's current directory, fine while nothing is
    // saved).
    std::string directory;
    // Cluster mode: --cluster-enabled yes, the cluster bus on a second free loopback port
    // (--cluster-port: the default, port + 10000, is out of range for most ports the kernel
    // hands out) and --cluster-config-file nodes-<port>.conf, inside `directory`, which a
    // cluster node needs.
    bool cluster = false;
    int port = 0;                             // 0: pick a free loopback port
    std::string executable = "redis-server";  // looked up in PATH
    std::chrono::milliseconds start_deadline{30000};
    std::chrono::milliseconds stop_deadline{10000};
  };

  // Starts the server and returns once it answers PING. Fails (with the server's log in the
  // message) if it cannot be spawned, exits during startup, or does not answer in time; the
  // child is reaped in every case.
  static Result<std::unique_ptr<RedisServer>> start(const Options& options);

  // How a server that was expected to refuse to start ended.
  struct Exit {
    int status;       // its exit status (128 + signal if killed)
    std::string log;  // everything it wrote
  };
  // Runs a server expected to exit during startup (a bad module argument). kTimedOut, with the
  // log, if it is still running at the start deadline (it is then killed).
  static Result<Exit> run_to_exit(const Options& options);

  ~RedisServer();
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  const std::string& host() const noexcept { return host_; }
  int port() const noexcept { return port_; }
  // The cluster bus port (Options::cluster), else 0.
  int cluster_port() const noexcept { return cluster_port_; }
  pid_t pid() const noexcept { return child_->pid(); }
  // Everything the server wrote to stdout and stderr so far.
  std::string log() const;
  // True once the child has exited (and been reaped).
  bool exited() { return child_->exited(); }
  // Waits at most `timeout` for the server to exit on its own: its exit status, or -1 if it is
  // still running.
  int wait_for_exit(std::chrono::milliseconds timeout);
  // Stops the server: SHUTDOWN NOSAVE (graceful: the module unloads), then SIGTERM, then
  // SIGKILL, each after half the stop deadline; always reaps it. Returns its exit status (0
  // after a graceful shutdown, 128 + signal if killed); idempotent.
  int stop();
  // The server's resident set size in bytes (VmRSS from /proc/<pid>/status), or nullopt if the
  // process is gone or the field is missing.
  std::optional<std::size_t> rss_bytes();

 private:
  RedisServer(int port, std::string log_path, std::chrono::milliseconds stop_deadline)
      : port_(port), log_path_(std::move(log_path)), stop_deadline_(stop_deadline) {}
  // Spawns the server on port_ (child_ set on success).
  Status spawn(const Options& options, const std::string& module);
  // Polls PING until the server answers +PONG, exits, or `within` passes.
  Status wait_ready(std::chrono::milliseconds within);

  std::string host_ = "127.0.0.1";
  int port_;
  int cluster_port_ = 0;
  std::string log_path_;
  std::chrono::milliseconds stop_deadline_;
  // Declared last: destroyed (the child reaped) before the log path, which ~RedisServer removes.
  std::unique_ptr<ChildProcess> child_;
};

// A port the kernel just had free on 127.0.0.1, or 0. Racy by nature (see RedisServer::start):
// whoever binds it must retry on "Address already in use".
int free_port();

}  // namespace dma::support
