#include "support/redis_server.hpp"

#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "support/redis_connection.hpp"

namespace dma::support {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kBindAttempts = 5;  // a picked port can be taken before the server binds it

[[maybe_unused]] std::string command_output(const std::string& command) {
  std::string out;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return out;
  std::array<char, 512> chunk{};
  while (std::fgets(chunk.data(), chunk.size(), pipe) != nullptr) out += chunk.data();
  ::pclose(pipe);
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

// What the child's environment adds to ours (see the header). Reports from inside the server
// land in its log; tsan does not halt there.
std::vector<std::string> added_environment() {
  std::vector<std::string> added{"IPATH_NO_BACKTRACE=1"};
#if defined(__SANITIZE_ADDRESS__)
  added.push_back("LD_PRELOAD=" + command_output("gcc -print-file-name=libasan.so"));
  added.push_back("ASAN_OPTIONS=detect_leaks=0");
#elif defined(__SANITIZE_THREAD__)
  added.push_back("LD_PRELOAD=" + command_output("gcc -print-file-name=libtsan.so"));
  // detect_deadlocks=0: at fork (BGSAVE, BGREWRITEAOF) jemalloc's prefork handler holds every
  // arena's locks at once, more than the 64 tsan's deadlock detector tracks per thread, and tsan
  // aborts with "CHECK failed: sanitizer_deadlock_detector.h:67" (seen once the value store
  // added its arena). Races are still reported.
  added.push_back("TSAN_OPTIONS=halt_on_error=0:report_signal_unsafe=0:detect_deadlocks=0:suppressions=" +
                  std::string(DMA_TSAN_SUPPRESSIONS));
#endif
  return added;
}

Result<std::string> module_of(const RedisServer::Options& options) {
  std::string module = options.module_path;
  if (module.empty()) {
    std::error_code error;
    const auto self = std::filesystem::read_symlink("/proc/self/exe", error);
    if (error) {
      return fail(ErrorCode::kNotFound, "cannot find my own executable: " + error.message());
    }
    const auto prefix = self.parent_path().parent_path();
    module = (prefix / "lib" / "dma.so").string();
#if defined(DMA_INSTALLED_MODULE)
    // An installed tool (<prefix>/bin/dma-demo) finds the installed module
    // (<prefix>/<libdir>/dma/dma.so, cmake/package.cmake).
    if (!std::filesystem::exists(module)) module = (prefix / DMA_INSTALLED_MODULE).string();
#endif
  }
  if (!std::filesystem::exists(module)) {
    return fail(ErrorCode::kNotFound, "no module at " + module + " (build it first)");
  }
  return module;
}

std::string log_path_for(int port) {
  static std::atomic<int> serial{0};  // distinct names within this process
  return (std::filesystem::temp_directory_path() /
          ("dma-redis-" + std::to_string(::getpid()) + "-" + std::to_string(port) + "-" +
           std::to_string(serial++) + ".log"))
      .string();
}

bool lost_the_port(const std::string& log) {
  return log.find("Address already in use") != std::string::npos;
}

}  // namespace

int free_port() {
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

Result<std::unique_ptr<RedisServer>> RedisServer::start(const Options& options) {
  DMA_TRY_ASSIGN(const std::string module, module_of(options));
  if (options.cluster && options.directory.empty()) {
    return fail(ErrorCode::kInvalidArgument, "a cluster node needs Options::directory");
  }
  std::string last_log;
  for (int attempt = 0; attempt < kBindAttempts; ++attempt) {
    const int port = options.port != 0 ? options.port : free_port();
    if (port == 0) return fail(ErrorCode::kResourceExhausted, "no free loopback port");
    auto server = std::unique_ptr<RedisServer>(
        new RedisServer(port, log_path_for(port), options.stop_deadline));
    if (options.cluster) {
      server->cluster_port_ = free_port();
      if (server->cluster_port_ == 0 || server->cluster_port_ == port) {
        return fail(ErrorCode::kResourceExhausted, "no free loopback port for the cluster bus");
      }
    }
    DMA_TRY(server->spawn(options, module));
    auto ready = server->wait_ready(options.start_deadline);
    if (ready) return server;
    last_log = server->log();
    server->stop();
    if (!lost_the_port(last_log) || options.port != 0) return fail(std::move(ready).error());
  }
  return fail(ErrorCode::kResourceExhausted,
              "redis-server could not bind a free port in " + std::to_string(kBindAttempts) +
                  " attempts:\n" + last_log);
}

Result<RedisServer::Exit> RedisServer::run_to_exit(const Options& options) {
  DMA_TRY_ASSIGN(const std::string module, module_of(options));
  for (int attempt = 0; attempt < kBindAttempts; ++attempt) {
    const int port = options.port != 0 ? options.port : free_port();
    if (port == 0) return fail(ErrorCode::kResourceExhausted, "no free loopback port");
    RedisServer server(port, log_path_for(port), options.stop_deadline);
    DMA_TRY(server.spawn(options, module));
    const int status = server.wait_for_exit(options.start_deadline);
    Exit exit{status, server.log()};
    if (status == -1) {
      return fail(ErrorCode::kTimedOut, "redis-server kept running:\n" + exit.log);
    }
    if (!lost_the_port(exit.log) || options.port != 0) return exit;
  }
  return fail(ErrorCode::kResourceExhausted, "redis-server could not bind a free port in " +
                                                 std::to_string(kBindAttempts) + " attempts");
}

RedisServer::~RedisServer() {
  if (child_) stop();
  child_.reset();
  std::error_code ignored;
  std::filesystem::remove(log_path_, ignored);
}

std::string RedisServer::log() const {
  std::ifstream in(log_path_);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

int RedisServer::wait_for_exit(std::chrono::milliseconds timeout) {
  return child_->wait_exit(timeout).value_or(-1);
}

int RedisServer::stop() {
  if (child_->exited()) return child_->exit_status();
  const auto half = stop_deadline_ / 2;
  if (auto connection = RedisConnection::open(host_, port_, half)) {
    // No reply on success: the server closes the connection as it exits.
    const std::string_view shutdown[] = {"SHUTDOWN", "NOSAVE"};
    (void)(*connection)->send(shutdown);
  }
  if (!child_->wait_exit(half)) {
    child_->signal(SIGTERM);
    child_->wait_exit(half);
  }
  child_->kill_now();  // no-op once reaped
  return child_->exit_status();
}

std::optional<std::size_t> RedisServer::rss_bytes() {
  if (child_->exited()) return std::nullopt;
  std::ifstream status("/proc/" + std::to_string(child_->pid()) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) {
      return static_cast<std::size_t>(std::strtoull(line.c_str() + 6, nullptr, 10)) * 1024;
    }
  }
  return std::nullopt;
}

Status RedisServer::spawn(const Options& options, const std::string& module) {
  std::vector<std::string> arguments = {options.executable, "--port", std::to_string(port_),
                                        "--bind", host_, "--save", "", "--appendonly", "no"};
#if defined(__SANITIZE_THREAD__)
  // jemalloc's background threads start further ones with a pthread_create tsan does not
  // intercept; the value store's arena (module/store/arena.cpp) makes it start one, whose first
  // calloc then crashes inside the tsan runtime (seen: SIGSEGV in jemalloc_bg_thd at load).
  arguments.insert(arguments.end(), {"--jemalloc-bg-thread", "no"});
#endif
  if (!options.directory.empty()) arguments.insert(arguments.end(), {"--dir", options.directory});
  if (options.cluster) {
    arguments.insert(arguments.end(),
                     {"--cluster-enabled", "yes", "--cluster-port", std::to_string(cluster_port_),
                      "--cluster-config-file", "nodes-" + std::to_string(port_) + ".conf"});
  }
  arguments.insert(arguments.end(), options.server_arguments.begin(),
                   options.server_arguments.end());
  arguments.push_back("--loadmodule");
  arguments.push_back(module);
  arguments.insert(arguments.end(), options.module_arguments.begin(),
                   options.module_arguments.end());
  ChildProcess::Options child;
  child.pipe_stdin = false;
  child.output_file = log_path_;
  child.merge_stderr = true;
  child.environment = added_environment();
  child.search_path = true;
  DMA_TRY_ASSIGN(child_, ChildProcess::spawn(arguments, child));
  return {};
}

Status RedisServer::wait_ready(std::chrono::milliseconds within) {
  const auto deadline = Clock::now() + within;
  while (Clock::now() < deadline) {
    if (child_->exited()) {
      return fail(ErrorCode::kUnreachable, "redis-server exited during startup (status " +
                                               std::to_string(child_->exit_status()) + "):\n" +
                                               log());
    }
    if (auto probe = RedisConnection::open(host_, port_, std::chrono::seconds(1))) {
      auto pong = (*probe)->command({"PING"});
      if (pong && (*pong)->type == REDIS_REPLY_STATUS) return {};
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // a child cannot notify us
  }
  return fail(ErrorCode::kTimedOut, "redis-server did not answer PING within " +
                                        std::to_string(within.count()) + " ms:\n" + log());
}

}  // namespace dma::support
