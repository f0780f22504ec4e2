// Shared test fixtures: byte buffers as transfer contexts, a completion collector, patterns.
// The pattern and the buffer are the support library's (support/), which the tools and the
// benchmark use too, so a seed means the same bytes everywhere.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dma/configuration.hpp"
#include "dma/protocol.hpp"
#include "dma/service.hpp"
#include "dma/target.hpp"
#include "support/owned_bytes.hpp"
#include "support/pattern.hpp"

namespace dma::testing {

inline constexpr auto kDeadline = std::chrono::seconds(60);

inline Configuration loopback(const std::string& provider) {
  Configuration configuration;
  configuration.providers = {provider};
  configuration.bind = "127.0.0.1";
  return configuration;
}

// Deterministic bytes: a different pattern per seed, so misplaced bytes are caught.
inline std::vector<std::byte> pattern(std::size_t length, std::uint32_t seed) {
  return support::make_pattern(length, seed);
}

// A transfer context owning its bytes: the source for a write, the landing buffer for a read
// (public `bytes` and `tag`).
using Buffer = support::OwnedBytes;

// Collects completions from the batch completer; thread-safe.
class Collector {
 public:
  struct Finished {
    std::unique_ptr<Operands> context;
    Outcome outcome;
  };
  BatchCompleter completer() {
    return [this](std::span<Completion> batch) {
      {
        std::lock_guard lock(mutex_);
        ++batches_;
        for (Completion& completion : batch) {
          finished_.push_back(Finished{std::move(completion.context), std::move(completion.outcome)});
        }
      }
      changed_.notify_all();
    };
  }
  // Waits (with the test deadline) until `count` completions have arrived; returns them all.
  // With `expect_all` false, returns whatever arrived without failing the test.
  std::vector<Finished> wait_for(std::size_t count,
                                 std::chrono::milliseconds deadline = kDeadline,
                                 bool expect_all = true) {
    std::unique_lock lock(mutex_);
    const bool arrived =
        changed_.wait_for(lock, deadline, [&] { return finished_.size() >= count; });
    EXPECT_TRUE(arrived || !expect_all) << "only " << finished_.size() << " of " << count
                         << " completions arrived before the deadline";
    return std::move(finished_);
  }
  std::size_t count() {
    std::lock_guard lock(mutex_);
    return finished_.size();
  }
  std::size_t batches() {
    std::lock_guard lock(mutex_);
    return batches_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<Finished> finished_;
  std::size_t batches_ = 0;
};

// A service whose completions go to `collector`; nullptr (with a test failure) if it does not
// start.
inline std::unique_ptr<FabricService> start_service(const Configuration& configuration,
                                             Collector& collector) {
  auto service = FabricService::start(configuration, collector.completer(), nullptr);
  EXPECT_TRUE(service) << service.error().describe();
  return service ? std::move(*service) : nullptr;
}

// Polls `condition` until it holds or `within` passes; returns whether it held. For state that
// changes with nothing to wait on (a service's generation, a server's INFO after an expiry or a
// replica's link): `within` is a hang guard, not a measurement.
template <typename Condition>
bool eventually(Condition condition, std::chrono::milliseconds within = std::chrono::seconds(30)) {
  const auto deadline = std::chrono::steady_clock::now() + within;
  while (!condition()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

inline FabricAddress address_of(std::span<const std::uint8_t> bytes) {
  return FabricAddress::from(bytes).value();
}

inline Buffer* buffer_of(const std::unique_ptr<Operands>& context) {
  return static_cast<Buffer*>(context.get());
}

// A write of `value` over the whole of `exposed`, on `target`, from a Buffer tagged `client`.
inline TransferRequest write_into(const Target& target, const Exposed& exposed,
                                  std::vector<std::byte> value, std::uint64_t client = 1) {
  TransferRequest write;
  write.client_id = client;
  write.peer_address = address_of(target.local_address());
  write.regions.push_back(exposed.whole());
  write.context = std::make_unique<Buffer>(std::move(value), client);
  return write;
}

}  // namespace dma::testing
