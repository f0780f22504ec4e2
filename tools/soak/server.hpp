// The redis-server under test through its incarnations: with --kill-server-every each one is
// SIGKILLed and the next started on the same port with the same module arguments, so the
// clients, which keep running, reconnect to it (it is empty: --save '', no AOF).
//
// A restarted server binds the port its predecessor listened on, which can be busy for a moment
// after the SIGKILL; support::RedisServer::start does not retry on a port it was given, so
// kill_and_restart does.
//
// Ownership: owns the current incarnation (stopped or killed on destruction). Thread-safety:
// none; the parent's one thread.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "dma/result.hpp"
#include "soak/options.hpp"
#include "support/redis_server.hpp"

namespace dma::soak {

class SoakServer {
 public:
  explicit SoakServer(const Options& options);

  // The first incarnation, on a free port.
  Status start();
  // SIGKILLs the server, reaps it, and starts the next incarnation on the same port, returning
  // once it answers PING. On failure, the last attempt's error (with the server's log).
  Status kill_and_restart();

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
  std::optional<long long> failed_transfers();
  // Stops the current incarnation: its exit status, or nullopt if there is none.
  std::optional<int> stop();

 private:
  void adopt(std::unique_ptr<support::RedisServer> server);

  support::RedisServer::Options options_;
  std::unique_ptr<support::RedisServer> server_;
  std::optional<std::size_t> rss_at_start_;
  std::uint64_t kills_ = 0;
};

}  // namespace dma::soak
