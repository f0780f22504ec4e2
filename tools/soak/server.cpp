// The server's incarnations (server.hpp).
#include "soak/server.hpp"

#include <signal.h>

#include <chrono>
#include <thread>
#include <utility>

#include "support/redis_connection.hpp"

namespace dma::soak {
namespace {

using namespace std::chrono_literals;

// Enough for a port a SIGKILLed server left busy to come free; any failure is retried alike.
constexpr int kRestartAttempts = 5;
constexpr auto kRestartBackoff = 200ms;

}  // namespace

SoakServer::SoakServer(const Options& options) {
  options_.module_arguments = {"providers", options.provider, "bind", "127.0.0.1",
                               "max-value-size", std::to_string(options.max_size)};
}

Status SoakServer::start() {
  auto started = support::RedisServer::start(options_);
  if (!started) return fail(started.error());
  adopt(std::move(*started));
  options_.port = server_->port();
  return {};
}

Status SoakServer::kill_and_restart() {
  ::kill(server_->pid(), SIGKILL);
  server_->wait_for_exit(10s);
  server_.reset();
  ++kills_;
  std::optional<Error> last;
  for (int attempt = 0; attempt < kRestartAttempts; ++attempt) {
    if (attempt > 0) std::this_thread::sleep_for(kRestartBackoff);
    auto started = support::RedisServer::start(options_);
    if (started) {
      adopt(std::move(*started));
      return {};
    }
    last = started.error();
  }
  return fail(*last);
}

std::optional<long long> SoakServer::failed_transfers() {
  if (!server_ || server_->exited()) return std::nullopt;
  auto connection = support::RedisConnection::open(server_->host(), server_->port(), 10s);
  if (!connection) return std::nullopt;
  return (*connection)->info_field("dma", "dma_errors");
}

std::optional<int> SoakServer::stop() {
  if (!server_) return std::nullopt;
  return server_->stop();
}

void SoakServer::adopt(std::unique_ptr<support::RedisServer> server) {
  server_ = std::move(server);
  rss_at_start_ = server_->rss_bytes();
}

}  // namespace dma::soak
