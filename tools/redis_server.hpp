// RedisServer: a redis-server child with the dma module loaded, on loopback, for tools and
// benchmarks (dma-demo, dma-bench redis, dma-soak). Not a test fixture: failures are Results,
// never gtest assertions.
//
// start() spawns `redis-server --port P --bind 127.0.0.1 --save '' --appendonly no
// --loadmodule <module> <module arguments...>` with stdout and stderr in a temporary log file,
// then polls PING until it answers or the start deadline passes (a child cannot notify us, so
// polling is the only way to learn it is ready). With port 0 it picks a free port; if the server
// then loses the race for it ("Address already in use") it retries on another port.
//
// Ownership: the object owns the child process and its log file. Destroying it (or stop()) sends
// SHUTDOWN NOSAVE, then SIGTERM, then SIGKILL, within `stop_deadline` in all; the child is always
// reaped and the log removed. Thread-safety: none; one owner thread.
//
// Sanitizer builds: an instrumented module needs its runtime preloaded into the uninstrumented
// redis-server, so a tool built with asan or tsan adds LD_PRELOAD (and the runtime's options) to
// the child's environment, as tests/test_module.cpp does.
#pragma once

#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "dma/result.hpp"

extern char** environ;

namespace dma::tools {

class RedisServer {
 public:
  struct Options {
    // The module to load; empty: <directory of this executable>/../lib/dma.so (build/bin ->
    // build/lib).
    std::string module_path;
    // Module load arguments as name/value pairs (module/core.hpp parse_module_arguments), e.g.
    // {"providers", "shm", "bind", "127.0.0.1"}.
    std::vector<std::string> module_arguments{"providers", "tcp", "bind", "127.0.0.1"};
    // Extra redis-server options placed before --loadmodule, e.g. {"--maxmemory", "1gb"}.
    std::vector<std::string> server_arguments;
    int port = 0;                          // 0: pick a free loopback port
    std::string executable = "redis-server";  // looked up in PATH
    std::chrono::milliseconds start_deadline{30000};
    std::chrono::milliseconds stop_deadline{10000};
  };

  // Starts the server and returns once it answers PING. Fails (with the server's log in the
  // message) if it cannot be spawned, exits during startup, or does not answer in time; the
  // child is reaped in every case.
  static Result<std::unique_ptr<RedisServer>> start(const Options& options) {
    std::string module = options.module_path;
    if (module.empty()) {
      std::error_code error;
      const auto self = std::filesystem::read_symlink("/proc/self/exe", error);
      if (error) {
        return fail(ErrorCode::kNotFound, "cannot find my own executable: " + error.message());
      }
      module = (self.parent_path().parent_path() / "lib" / "dma.so").string();
    }
    if (!std::filesystem::exists(module)) {
      return fail(ErrorCode::kNotFound, "no module at " + module + " (build it first)");
    }
    constexpr int kAttempts = 3;  // a picked port can be taken before the server binds it
    std::string last_log;
    for (int attempt = 0; attempt < kAttempts; ++attempt) {
      const int port = options.port != 0 ? options.port : free_port();
      if (port == 0) return fail(ErrorCode::kResourceExhausted, "no free loopback port");
      auto server = std::unique_ptr<RedisServer>(new RedisServer(port, options.stop_deadline));
      if (Status spawned = server->spawn(options, module); !spawned) {
        return fail(std::move(spawned).error());
      }
      auto ready = server->wait_ready(options.start_deadline);
      if (ready) return server;
      last_log = server->log();
      server->stop();
      const bool port_taken = last_log.find("Address already in use") != std::string::npos;
      if (!port_taken || options.port != 0) return fail(std::move(ready).error());
    }
    return fail(ErrorCode::kResourceExhausted,
                "redis-server could not bind a free port in " + std::to_string(kAttempts) +
                    " attempts:\n" + last_log);
  }

  ~RedisServer() {
    stop();
    std::error_code ignored;
    if (!log_path_.empty()) std::filesystem::remove(log_path_, ignored);
  }
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  const std::string& host() const noexcept { return host_; }
  int port() const noexcept { return port_; }
  pid_t pid() const noexcept { return pid_; }
  // Everything the server wrote to stdout and stderr so far.
  std::string log() const {
    std::ifstream in(log_path_);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }

  // True once the child has exited (and been reaped).
  bool exited() {
    if (reaped_) return true;
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) record_exit(status);
    return reaped_;
  }

  // Stops the server: SHUTDOWN NOSAVE (graceful: the module unloads), then SIGTERM, then
  // SIGKILL, each after half the stop deadline; always reaps it. Returns its exit status (0
  // after a graceful shutdown, 128 + signal if killed); idempotent.
  int stop() {
    if (pid_ <= 0 || reaped_) return status_;
    const auto half = stop_deadline_ / 2;
    const timeval timeout{static_cast<time_t>(half.count() / 1000),
                          static_cast<suseconds_t>((half.count() % 1000) * 1000)};
    if (redisContext* connection = redisConnectWithTimeout(host_.c_str(), port_, timeout)) {
      if (connection->err == 0) {
        redisSetTimeout(connection, timeout);
        // No reply on success: the server closes the connection as it exits.
        if (void* reply = redisCommand(connection, "SHUTDOWN NOSAVE")) freeReplyObject(reply);
      }
      redisFree(connection);
    }
    if (!wait_exit(half)) {
      ::kill(pid_, SIGTERM);
      wait_exit(half);
    }
    if (!reaped_) {
      ::kill(pid_, SIGKILL);
      int status = 0;
      while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
      }
      record_exit(status);
    }
    return status_;
  }

  // The server's resident set size in bytes (VmRSS from /proc/<pid>/status), or nullopt if the
  // process is gone or the field is missing.
  std::optional<std::size_t> rss_bytes() const {
    if (pid_ <= 0 || reaped_) return std::nullopt;
    std::ifstream status("/proc/" + std::to_string(pid_) + "/status");
    std::string line;
    while (std::getline(status, line)) {
      if (line.rfind("VmRSS:", 0) == 0) {
        return static_cast<std::size_t>(std::strtoull(line.c_str() + 6, nullptr, 10)) * 1024;
      }
    }
    return std::nullopt;
  }

 private:
  RedisServer(int port, std::chrono::milliseconds stop_deadline)
      : port_(port), stop_deadline_(stop_deadline) {}

  // A port the kernel just had free on 127.0.0.1, or 0.
  static int free_port() {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return 0;
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof address;
    const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 &&
                    ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0;
    ::close(fd);
    return ok ? ntohs(address.sin_port) : 0;
  }

  static std::string command_output(const std::string& command) {
    std::string out;
    FILE* pipe = ::popen(command.c_str(), "r");
    if (pipe == nullptr) return out;
    std::array<char, 512> chunk{};
    while (std::fgets(chunk.data(), chunk.size(), pipe) != nullptr) out += chunk.data();
    ::pclose(pipe);
    while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
    return out;
  }

  // What the child's environment adds to ours. IPATH_NO_BACKTRACE=1 keeps libinfinipath
  // (loaded with libfabric's psm provider) from taking over SIGTERM, so a signalled server still
  // shuts down gracefully. An instrumented module needs its sanitizer runtime preloaded into the
  // uninstrumented server.
  static std::vector<std::string> added_environment() {
    std::vector<std::string> added{"IPATH_NO_BACKTRACE=1"};
#if defined(__SANITIZE_ADDRESS__)
    added.push_back("LD_PRELOAD=" + command_output("gcc -print-file-name=libasan.so"));
    added.push_back("ASAN_OPTIONS=detect_leaks=0");
#elif defined(__SANITIZE_THREAD__)
    added.push_back("LD_PRELOAD=" + command_output("gcc -print-file-name=libtsan.so"));
    added.push_back("TSAN_OPTIONS=halt_on_error=0:report_signal_unsafe=0");
#endif
    return added;
  }

  // Polls for the child's exit for at most `within`; true once it has been reaped.
  bool wait_exit(std::chrono::milliseconds within) {
    const auto deadline = std::chrono::steady_clock::now() + within;
    while (!exited() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));  // a child cannot notify us
    }
    return reaped_;
  }

  void record_exit(int status) {
    reaped_ = true;
    status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  Status spawn(const Options& options, const std::string& module) {
    log_path_ = (std::filesystem::temp_directory_path() /
                 ("dma-redis-" + std::to_string(::getpid()) + "-" + std::to_string(port_) + ".log"))
                    .string();
    std::vector<std::string> arguments = {options.executable, "--port", std::to_string(port_),
                                          "--bind", host_, "--save", "", "--appendonly", "no"};
    arguments.insert(arguments.end(), options.server_arguments.begin(),
                     options.server_arguments.end());
    arguments.push_back("--loadmodule");
    arguments.push_back(module);
    arguments.insert(arguments.end(), options.module_arguments.begin(),
                     options.module_arguments.end());
    std::vector<char*> argv;
    for (auto& argument : arguments) argv.push_back(argument.data());
    argv.push_back(nullptr);

    // Added variables replace inherited ones of the same name.
    const std::vector<std::string> added = added_environment();
    std::vector<std::string> environment;
    for (char** entry = environ; *entry != nullptr; ++entry) {
      const std::string_view inherited(*entry);
      const bool replaced = std::any_of(added.begin(), added.end(), [&](const std::string& mine) {
        return inherited.substr(0, inherited.find('=') + 1) == mine.substr(0, mine.find('=') + 1);
      });
      if (!replaced) environment.emplace_back(inherited);
    }
    environment.insert(environment.end(), added.begin(), added.end());
    std::vector<char*> envp;
    for (auto& entry : environment) envp.push_back(entry.data());
    envp.push_back(nullptr);

    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log_path_.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
    const int spawned = ::posix_spawnp(&pid_, options.executable.c_str(), &actions, nullptr,
                                       argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    if (spawned != 0) {
      pid_ = -1;
      return fail(ErrorCode::kNotFound,
                  "cannot start " + options.executable + ": " + std::strerror(spawned));
    }
    return {};
  }

  // Polls PING until the server answers +PONG, exits, or `deadline` passes.
  Status wait_ready(std::chrono::milliseconds within) {
    const auto deadline = std::chrono::steady_clock::now() + within;
    const timeval probe_timeout{1, 0};
    while (std::chrono::steady_clock::now() < deadline) {
      if (exited()) {
        return fail(ErrorCode::kUnreachable, "redis-server exited during startup (status " +
                                                 std::to_string(status_) + "):\n" + log());
      }
      redisContext* probe = redisConnectWithTimeout(host_.c_str(), port_, probe_timeout);
      if (probe != nullptr && probe->err == 0) {
        redisSetTimeout(probe, probe_timeout);
        auto* pong = static_cast<redisReply*>(redisCommand(probe, "PING"));
        const bool ready = pong != nullptr && pong->type == REDIS_REPLY_STATUS;
        if (pong != nullptr) freeReplyObject(pong);
        if (ready) {
          redisFree(probe);
          return {};
        }
      }
      if (probe != nullptr) redisFree(probe);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // a child cannot notify us
    }
    return fail(ErrorCode::kTimedOut, "redis-server did not answer PING within " +
                                          std::to_string(within.count()) + " ms:\n" + log());
  }

  std::string host_ = "127.0.0.1";
  int port_;
  std::chrono::milliseconds stop_deadline_;
  pid_t pid_ = -1;
  bool reaped_ = false;
  int status_ = -1;
  std::string log_path_;
};

}  // namespace dma::tools
