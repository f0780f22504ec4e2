// Teardown and races, meant for the tsan build as much as any: a service dropped with a thousand
// transfers in flight, invalidate() storms over extents that transfers are using, remove_peer
// racing new transfers for the same client, and a client re-advertising a new address while its
// old transfers are in flight. Real providers on loopback; every wait has a deadline.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "dma/memory.hpp"
#include "dma/service.hpp"
#include "dma/target.hpp"
#include "fixtures.hpp"

namespace dma {
namespace {

using testing::Buffer;
using testing::Collector;
using testing::loopback;
using testing::pattern;
using testing::start_service;

// A target with one exposed buffer of `slots` values of `value` bytes each.
struct ExposedTarget {
  std::unique_ptr<Target> target;
  std::vector<std::byte> memory;
  std::optional<Exposed> exposed;

  static ExposedTarget open(const Configuration& configuration, std::size_t bytes) {
    ExposedTarget out;
    auto target = Target::open(configuration);
    EXPECT_TRUE(target) << target.error().describe();
    if (!target) return out;
    out.target = std::move(*target);
    out.memory.resize(bytes);
    auto exposed = out.target->expose(out.memory.data(), bytes);
    EXPECT_TRUE(exposed) << exposed.error().describe();
    if (exposed) out.exposed.emplace(std::move(*exposed));
    return out;
  }
  FabricAddress address() const { return testing::address_of(target->local_address()); }
};

class Races : public ::testing::TestWithParam<std::string> {};

TEST_P(Races, dropping_a_service_with_a_thousand_transfers_in_flight_delivers_each_exactly_once) {
  // If this fails, a server shutting down under load hangs, loses a completion (a client never
  // answered) or delivers one twice (a double free in the caller).
  constexpr std::size_t kCount = 1000;
  constexpr std::size_t kValue = 4096;
  Configuration configuration = loopback(GetParam());
  configuration.max_in_flight = 0;  // the provider's whole queue
  ExposedTarget target = ExposedTarget::open(configuration, kValue * kCount);
  ASSERT_TRUE(target.exposed);
  Collector collector;
  auto service = start_service(configuration, collector);
  ASSERT_TRUE(service);
  for (std::size_t index = 0; index < kCount; ++index) {
    TransferRequest request;
    request.client_id = 1;
    request.peer_address = target.address();
    request.regions.push_back(target.exposed->region(index * kValue, kValue));
    request.context = std::make_unique<Buffer>(pattern(kValue, static_cast<std::uint32_t>(index)), index);
    request.want_checksum = index % 2 == 0;
    ASSERT_TRUE(service->submit(std::move(request)));
  }
  service.reset();
  auto finished = collector.wait_for(kCount, std::chrono::milliseconds(0));
  ASSERT_EQ(kCount, finished.size());
  std::vector<bool> seen(kCount, false);
  target.target->synchronize();
  for (auto& done : finished) {
    ASSERT_NE(nullptr, done.context);
    const std::uint64_t index = testing::buffer_of(done.context)->tag;
    ASSERT_FALSE(seen[index]) << "transfer " << index << " delivered twice";
    seen[index] = true;
    if (!done.outcome) {
      EXPECT_EQ(ErrorCode::kWorkerGone, done.outcome.error().code()) << done.outcome.error().describe();
      continue;
    }
    const auto expected = pattern(kValue, static_cast<std::uint32_t>(index));
    ASSERT_EQ(0, std::memcmp(expected.data(), target.memory.data() + index * kValue, kValue))
        << "transfer " << index << " reported success but its bytes are not there";
  }
}

// Operands carved out of one shared extent, which the cache may register as a whole.
class ExtentSlice : public Buffer {
 public:
  ExtentSlice(std::byte* extent, std::size_t extent_length, std::byte* slice, std::size_t length,
              std::uint64_t label)
      : Buffer({}, label), extent_(extent), extent_length_(extent_length), slice_(slice), length_(length) {}
  std::span<const std::byte> source() override { return {slice_, length_}; }
  std::optional<CacheableSpan> cacheable_span() override {
    auto span = CacheableSpan::create(reinterpret_cast<std::uintptr_t>(extent_), extent_length_);
    return span ? std::optional<CacheableSpan>(*span) : std::nullopt;
  }

 private:
  std::byte* extent_;
  std::size_t extent_length_;
  std::byte* slice_;
  std::size_t length_;
};

TEST_P(Races, invalidate_storms_over_extents_in_use_never_break_a_transfer) {
  // If this fails, an allocator retiring registrations while transfers use the same pages
  // (jemalloc's purge hook firing under load) corrupts a value or closes a region under the
  // provider.
  constexpr std::size_t kValue = 16384;
  constexpr std::size_t kSlots = 32;
  constexpr std::size_t kRounds = 8;
  Configuration configuration = loopback(GetParam());
  configuration.always_register_operands = true;  // the path invalidate() guards
  ExposedTarget target = ExposedTarget::open(configuration, kValue * kSlots);
  ASSERT_TRUE(target.exposed);
  Collector collector;
  auto service = start_service(configuration, collector);
  ASSERT_TRUE(service);
  std::vector<std::byte> extent(kValue * kSlots);
  for (std::size_t slot = 0; slot < kSlots; ++slot) {
    const auto bytes = pattern(kValue, static_cast<std::uint32_t>(slot));
    std::memcpy(extent.data() + slot * kValue, bytes.data(), kValue);
  }
  std::atomic<bool> storming{true};
  std::thread storm([&] {
    const auto base = reinterpret_cast<std::uintptr_t>(extent.data());
    while (storming.load(std::memory_order_relaxed)) {
      invalidate(base, base + extent.size());
      invalidate(base + kValue, base + 2 * kValue);  // a slice of it
      std::this_thread::yield();
    }
  });
  for (std::size_t round = 0; round < kRounds; ++round) {
    for (std::size_t slot = 0; slot < kSlots; ++slot) {
      TransferRequest request;
      request.client_id = 1;
      request.peer_address = target.address();
      request.regions.push_back(target.exposed->region(slot * kValue, kValue));
      request.context = std::make_unique<ExtentSlice>(extent.data(), extent.size(),
                                                      extent.data() + slot * kValue, kValue, slot);
      ASSERT_TRUE(service->submit(std::move(request)));
    }
    auto finished = collector.wait_for(kSlots);
    ASSERT_EQ(kSlots, finished.size());
    for (auto& done : finished) ASSERT_TRUE(done.outcome) << done.outcome.error().describe();
  }
  storming.store(false);
  storm.join();
  target.target->synchronize();
  EXPECT_EQ(0, std::memcmp(extent.data(), target.memory.data(), extent.size()));
}

TEST_P(Races, remove_peer_racing_new_transfers_for_the_same_client_never_misdelivers) {
  // If this fails, a client that disconnects and reconnects quickly (remove_peer and new
  // transfers for one id crossing on different threads) crashes the worker, releases an
  // address-vector entry a posted transfer still uses, or sends bytes to the wrong place.
  constexpr std::size_t kValue = 4096;
  constexpr std::size_t kCount = 400;
  Configuration configuration = loopback(GetParam());
  ExposedTarget target = ExposedTarget::open(configuration, kValue * kCount);
  ASSERT_TRUE(target.exposed);
  Collector collector;
  auto service = start_service(configuration, collector);
  ASSERT_TRUE(service);
  std::atomic<bool> removing{true};
  std::thread remover([&] {
    while (removing.load(std::memory_order_relaxed)) {
      service->remove_peer(7);
      std::this_thread::yield();
    }
  });
  for (std::size_t index = 0; index < kCount; ++index) {
    TransferRequest request;
    request.client_id = 7;
    request.peer_address = target.address();  // re-inserted as needed
    request.regions.push_back(target.exposed->region(index * kValue, kValue));
    request.context = std::make_unique<Buffer>(pattern(kValue, static_cast<std::uint32_t>(index)), index);
    ASSERT_TRUE(service->submit(std::move(request)));
  }
  auto finished = collector.wait_for(kCount);
  removing.store(false);
  remover.join();
  ASSERT_EQ(kCount, finished.size());
  target.target->synchronize();
  for (auto& done : finished) {
    ASSERT_TRUE(done.outcome) << done.outcome.error().describe();
    const std::uint64_t index = testing::buffer_of(done.context)->tag;
    const auto expected = pattern(kValue, static_cast<std::uint32_t>(index));
    ASSERT_EQ(0, std::memcmp(expected.data(), target.memory.data() + index * kValue, kValue))
        << "transfer " << index;
  }
}

// shm is left out: there, re-advertising mid-stream makes the *target's* progress thread crash
// inside libfabric 1.17 (SIGSEGV in shm's progress, 5-9 runs in 30, with our region names or
// shm's own) once the service removes the old address-vector entry while writes to the new one
// fly; with two client ids and no removal, 30 runs in 30 pass. Recorded in docs/RELIABILITY.md
// as an open problem: `build/bin/test_races --gtest_filter=*re_advertising*` with the shm value
// restored reproduces it.
class ReAdvertising : public ::testing::TestWithParam<std::string> {};

TEST_P(ReAdvertising, a_client_re_advertising_a_new_address_mid_stream_gets_old_and_new_bytes_right) {
  // If this fails, a client restarting its endpoint while transfers to the old one are in
  // flight sees them land in the new one, or the old entry vanishes under them.
  constexpr std::size_t kValue = 65536;
  constexpr std::size_t kCount = 64;
  Configuration configuration = loopback(GetParam());
  ExposedTarget old_target = ExposedTarget::open(configuration, kValue * kCount);
  ExposedTarget new_target = ExposedTarget::open(configuration, kValue * kCount);
  ASSERT_TRUE(old_target.exposed && new_target.exposed);
  Collector collector;
  auto service = start_service(configuration, collector);
  ASSERT_TRUE(service);
  const auto submit = [&](ExposedTarget& to, std::size_t index, std::uint32_t seed) {
    TransferRequest request;
    request.client_id = 3;
    request.peer_address = to.address();
    request.regions.push_back(to.exposed->region(index * kValue, kValue));
    request.context = std::make_unique<Buffer>(pattern(kValue, seed), index);
    return service->submit(std::move(request));
  };
  for (std::size_t index = 0; index < kCount; ++index) {
    ASSERT_TRUE(submit(old_target, index, static_cast<std::uint32_t>(index)));
  }
  for (std::size_t index = 0; index < kCount; ++index) {
    ASSERT_TRUE(submit(new_target, index, static_cast<std::uint32_t>(1000 + index)));
  }
  auto finished = collector.wait_for(2 * kCount);
  ASSERT_EQ(2 * kCount, finished.size());
  for (auto& done : finished) ASSERT_TRUE(done.outcome) << done.outcome.error().describe();
  old_target.target->synchronize();
  new_target.target->synchronize();
  for (std::size_t index = 0; index < kCount; ++index) {
    const auto old_bytes = pattern(kValue, static_cast<std::uint32_t>(index));
    const auto new_bytes = pattern(kValue, static_cast<std::uint32_t>(1000 + index));
    ASSERT_EQ(0, std::memcmp(old_bytes.data(), old_target.memory.data() + index * kValue, kValue))
        << "old slot " << index;
    ASSERT_EQ(0, std::memcmp(new_bytes.data(), new_target.memory.data() + index * kValue, kValue))
        << "new slot " << index;
  }
}

INSTANTIATE_TEST_SUITE_P(Providers, Races, ::testing::Values("tcp", "net", "shm"),
                         [](const auto& param_info) { return param_info.param; });
INSTANTIATE_TEST_SUITE_P(Providers, ReAdvertising, ::testing::Values("tcp", "net"),
                         [](const auto& param_info) { return param_info.param; });

}  // namespace
}  // namespace dma
