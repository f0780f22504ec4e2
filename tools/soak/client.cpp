// The client process's loop (client.hpp): one operation at a time against its own keys.
#include "soak/client.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <iostream>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <thread>
#include <utility>
#include <vector>

#include "dma/client.hpp"
#include "dma/protocol.hpp"
#include "soak/tally.hpp"
#include "support/pattern.hpp"
#include "support/redis_connection.hpp"

namespace dma::soak {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kKeysPerClient = 8;
// Between a client's failed reconnect attempts (the server is down or still starting).
constexpr auto kReconnectBackoff = 100ms;

dma::Configuration configuration_for(const std::string& provider) {
  dma::Configuration configuration;
  configuration.providers = {provider};
  configuration.bind = "127.0.0.1";
  return configuration;
}

std::string key_name(int slot, int key) {
  return "soak-" + std::to_string(slot) + "-" + std::to_string(key);
}

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

}  // namespace

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

}  // namespace dma::soak
