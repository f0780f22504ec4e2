// The registration cache: invalidate() retires a registration at once but the region closes only
// with its last lease, so a reclaim never closes a descriptor a transfer has posted; cacheable
// spans and pinned spans serve the operands inside them; closes happen on the domain's owner
// thread. Driven on real tcp domains, because a retire closes whatever it removes and a fake
// fid_mr would fault inside libfabric before any assertion ran.
//
// The registry is process-wide and shared by every test in this binary, so each test keys
// everything by its own endpoint's domain.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "dma/configuration.hpp"
#include "dma/memory.hpp"
#include "dma/result.hpp"
#include "fabric/endpoint.hpp"
#include "fabric/local_regions.hpp"
#include "fabric/registration_cache.hpp"

namespace dma::internal {
namespace {

constexpr auto kDeadline = std::chrono::seconds(30);
constexpr std::uint64_t kLocalAccess = FI_READ | FI_WRITE;

std::uintptr_t address_of(const void* pointer) { return reinterpret_cast<std::uintptr_t>(pointer); }
void* pointer_to(std::uintptr_t address) { return reinterpret_cast<void*>(address); }

// A real tcp endpoint on loopback owned by this thread, or a test failure saying why there is
// none. tcp takes application-chosen keys, and Endpoint::register_memory picks a fresh one each
// time, since requesting one key twice on a domain fails with -FI_ENOKEY.
std::unique_ptr<Endpoint> open_tcp(DomainOwner owner = DomainOwner::calling_thread()) {
  Configuration configuration;
  configuration.providers = {"tcp"};
  configuration.bind = "127.0.0.1";
  auto endpoint = Endpoint::open(configuration, Role::kInitiator, {}, std::move(owner));
  if (!endpoint) {
    ADD_FAILURE() << "tcp endpoint: " << endpoint.error().describe();
    return nullptr;
  }
  return std::move(*endpoint);
}

// A fresh local registration of `memory`, or a test failure (and null).
Lease register_bytes(Endpoint& endpoint, std::vector<std::uint8_t>& memory) {
  auto lease = endpoint.register_memory(address_of(memory.data()), memory.size(), kLocalAccess);
  if (!lease) {
    ADD_FAILURE() << lease.error().describe();
    return nullptr;
  }
  return std::move(*lease);
}

// Whether a region holding application key `key` is still open on `endpoint`'s domain, asked of
// libfabric rather than of our reference counts: with application keys, fi_mr_reg refuses a key
// an open region holds with -FI_ENOKEY (fi_mr(3)), so a probe registration under the same key
// tells an open region from a closed one without touching it. Owner thread only.
bool key_is_held(Endpoint& endpoint, std::uint64_t key) {
  EXPECT_FALSE(endpoint.describe().provider_keys) << "the probe needs application keys";
  static std::uint8_t probe_memory[64];
  fid_mr* probe = nullptr;
  const int code = fi_mr_reg(endpoint.domain(), probe_memory, sizeof probe_memory, kLocalAccess,
                             0, key, 0, &probe, nullptr);
  if (code == 0) {
    fi_close(&probe->fid);
    return false;
  }
  EXPECT_EQ(code, -FI_ENOKEY) << "the probe registration failed for another reason: "
                              << fi_strerror(-code);
  return true;
}

TEST(RegistrationCache, FreeingOneValueDeregistersANeighbourThatIsStillInFlight) {
  // Breaks: the production crash in miniature. One cached registration covers a whole allocator
  // extent and serves several values; freeing one reports only that value's pages, but
  // invalidate() retires every registration overlapping them, which is the one a neighbouring
  // value's in-flight transfer is using. If that closed the region, the transfer's descriptor,
  // already on the wire, would be a closed fid_mr.
  auto endpoint = open_tcp();
  ASSERT_TRUE(endpoint);
  const std::uintptr_t domain = endpoint->domain_key();
  std::vector<std::uint8_t> extent(64 * 1024);
  const std::uintptr_t base = address_of(extent.data());
  Lease registration = register_bytes(*endpoint, extent);
  ASSERT_TRUE(registration);
  const std::uint64_t key = registration->key();
  registry::track(base, base + extent.size(), domain, registration);
  registration.reset();  // the registry is the only holder now, as in production

  // A transfer resolves its operand out of the cache and goes in flight holding this lease.
  const std::uintptr_t operand_start = base + 4096;
  const std::uintptr_t operand_end = base + 8192;
  Lease lease = registry::covering(operand_start, operand_end, domain);
  ASSERT_TRUE(lease) << "the cached registration covers this operand";

  // A different value in the same extent is freed; its pages are reported before reclaim.
  dma::invalidate(base + 32768, base + 36864);

  // Retired from the registry, so nothing new can bind to it...
  EXPECT_FALSE(registry::covering(operand_start, operand_end, domain))
      << "a reclaimed extent must leave the registry immediately";
  // ...but still registered, because this operand's transfer is on the wire.
  EXPECT_EQ(lease.use_count(), 1)
      << "the in-flight operand must be the last holder, not a holder of a closed region";
  EXPECT_TRUE(key_is_held(*endpoint, key)) << "the region closed under an in-flight transfer";

  // The transfer completes: the last lease goes, and only now does the region close.
  lease.reset();
  EXPECT_FALSE(key_is_held(*endpoint, key)) << "the last lease must close the region";
}

TEST(RegistrationCache, ACacheableSpanWidensTheRegistration) {
  // Breaks: neighbouring operands in one allocator extent each take their own fi_mr_reg; or a span
  // that does not contain the operand is registered, pinning the wrong memory and leaving the
  // operand unregistered.
  constexpr std::size_t kExtent = 64 * 1024;
  constexpr std::size_t kOperand = 4096;
  auto endpoint = open_tcp();
  ASSERT_TRUE(endpoint);
  const std::uintptr_t domain = endpoint->domain_key();
  LocalRegions regions(*endpoint, /*register_operands=*/true);

  // Over-allocated and aligned into: an operand straddling an extent boundary would be widened to
  // two extents, and whether it does is down to where the allocator put the vector. An aligned
  // start makes the claims below about the span, not about luck. Room for the refused span's
  // operand at start + 2 * kExtent is included.
  std::vector<std::uint8_t> memory(4 * kExtent);
  const std::uintptr_t start = (address_of(memory.data()) + kExtent - 1) / kExtent * kExtent;

  auto span = dma::CacheableSpan::create(start, kExtent);
  ASSERT_TRUE(span) << span.error().describe();
  auto first = regions.operand(pointer_to(start), kOperand,
                               [&]() -> std::optional<dma::CacheableSpan> { return *span; });
  ASSERT_TRUE(first) << first.error().describe();

  // The whole span is registered, not just the operand: an operand at its far end is a cache hit
  // against the same registration, and a hit never asks the caller for its span.
  bool asked = false;
  auto neighbour = regions.operand(pointer_to(start + kExtent - kOperand), kOperand,
                                   [&]() -> std::optional<dma::CacheableSpan> {
                                     asked = true;
                                     return std::nullopt;
                                   });
  ASSERT_TRUE(neighbour) << neighbour.error().describe();
  EXPECT_FALSE(asked) << "a cache hit must not ask for a span";
  Lease cached = registry::covering(start, start + kOperand, domain);
  ASSERT_TRUE(cached) << "the span is tracked";
  ASSERT_TRUE(neighbour->lease) << "a tracked span always leases";
  EXPECT_EQ(neighbour->lease.get(), cached.get())
      << "operands across the span must share one registration";
  EXPECT_EQ(first->lease.get(), cached.get());
  EXPECT_EQ(neighbour->descriptor, cached->descriptor());

  // A span that does not contain the operand is refused, and nothing is tracked for it.
  const std::uintptr_t outside = start + 2 * kExtent;
  auto bogus = dma::CacheableSpan::create(outside + kExtent, kOperand);
  ASSERT_TRUE(bogus) << bogus.error().describe();
  auto fallback = regions.operand(pointer_to(outside), kOperand,
                                  [&]() -> std::optional<dma::CacheableSpan> { return *bogus; });
  ASSERT_TRUE(fallback) << "falls back to the operand's own registration: "
                        << fallback.error().describe();
  EXPECT_TRUE(fallback->lease) << "the operand itself must still be registered";
  EXPECT_FALSE(registry::covering(outside + kExtent, outside + kExtent + kOperand, domain))
      << "a span not containing the operand must not be registered";
  EXPECT_FALSE(registry::covering(outside, outside + kOperand, domain))
      << "a registration for one transfer must not be cached";
  EXPECT_EQ(registry::size(domain), 1u);
}

TEST(RegistrationCache, ARegistrationHandedToACallerHasNoLease) {
  // Breaks: the same defect reached the other way. If covering() handed out a bare fid_mr and
  // dropped the registry lock, nothing would stop invalidate() closing it between the lookup and
  // the post that uses it; the caller's lease must hold it open.
  auto endpoint = open_tcp();
  ASSERT_TRUE(endpoint);
  const std::uintptr_t domain = endpoint->domain_key();
  std::vector<std::uint8_t> extent(8192);
  const std::uintptr_t base = address_of(extent.data());
  const std::uintptr_t end = base + extent.size();
  Lease registration = register_bytes(*endpoint, extent);
  ASSERT_TRUE(registration);
  const std::uint64_t key = registration->key();
  registry::track(base, end, domain, registration);
  registration.reset();

  Lease lease = registry::covering(base, end, domain);
  ASSERT_TRUE(lease) << "just tracked";
  dma::invalidate(base, end);

  EXPECT_FALSE(registry::covering(base, end, domain));
  EXPECT_EQ(lease.use_count(), 1)
      << "the caller's lease must outlive the registry's, not be closed underneath it";
  EXPECT_TRUE(key_is_held(*endpoint, key));
  EXPECT_NE(lease->descriptor(), nullptr);
}

TEST(RegistrationCache, APinnedSpanServesTheOperandsInsideIt) {
  // Breaks: the point of pinning — one registration up front, then no fi_mr_reg on the hot path —
  // because pin and operand disagree about what is cached.
  auto endpoint = open_tcp();
  ASSERT_TRUE(endpoint);
  const std::uintptr_t domain = endpoint->domain_key();
  std::vector<std::uint8_t> arena(64 * 1024);
  const std::uintptr_t base = address_of(arena.data());
  LocalRegions regions(*endpoint, /*register_operands=*/true);

  ASSERT_TRUE(regions.pin(base, arena.size()));

  // An operand well inside the span resolves out of the cache, with no span of its own...
  auto operand = regions.operand(pointer_to(base + 4096), 4096,
                                 []() -> std::optional<dma::CacheableSpan> { return std::nullopt; });
  ASSERT_TRUE(operand) << operand.error().describe();
  ASSERT_TRUE(operand->lease) << "a pinned span always leases";
  // ...and it is the pinned registration, not a second one taken for this operand.
  Lease cached = registry::covering(base + 4096, base + 8192, domain);
  ASSERT_TRUE(cached) << "still registered";
  EXPECT_EQ(operand->lease.get(), cached.get()) << "the operand must reuse the pinned registration";
  EXPECT_EQ(registry::size(domain), 1u);
}

TEST(RegistrationCache, DroppingARegionRetiresItsRegistration) {
  // Breaks: a caller's MemoryRegion is freed while its registration stays cached (a later operand
  // at those addresses binds to stale pages); or the retire closes a descriptor an operand still
  // leases. The same rule as a reclaim, reached the other way.
  auto endpoint = open_tcp();
  ASSERT_TRUE(endpoint);
  const std::uintptr_t domain = endpoint->domain_key();
  auto storage = std::make_unique<std::vector<std::uint8_t>>(8192);
  const std::uintptr_t base = address_of(storage->data());
  const std::uintptr_t end = base + storage->size();
  LocalRegions regions(*endpoint, /*register_operands=*/true);
  ASSERT_TRUE(regions.pin(base, storage->size()));

  Lease lease = registry::covering(base, end, domain);
  ASSERT_TRUE(lease) << "just pinned";
  const std::uint64_t key = lease->key();
  {
    dma::MemoryRegion<std::vector<std::uint8_t>> region(std::move(storage), base, end);
  }

  EXPECT_FALSE(registry::covering(base, end, domain))
      << "a dropped region must leave the registry immediately";
  EXPECT_EQ(lease.use_count(), 1)
      << "an operand mid-flight must be the last holder, not a holder of a closed region";
  EXPECT_TRUE(key_is_held(*endpoint, key));
  lease.reset();
  EXPECT_FALSE(key_is_held(*endpoint, key));
}

TEST(RegistrationCache, ARegionOutlivingItsEndpointClosesNothingTwice) {
  // Breaks: a caller's region dropped after its service has gone closes a region the endpoint
  // already closed with its domain (a double fi_close, which faults inside libfabric or trips
  // ASan).
  auto storage = std::make_unique<std::vector<std::uint8_t>>(8192);
  const std::uintptr_t base = address_of(storage->data());
  const std::uintptr_t end = base + storage->size();
  std::uintptr_t domain = 0;
  {
    auto endpoint = open_tcp();
    ASSERT_TRUE(endpoint);
    domain = endpoint->domain_key();
    LocalRegions regions(*endpoint, /*register_operands=*/true);
    ASSERT_TRUE(regions.pin(base, storage->size()));
    ASSERT_EQ(registry::size(domain), 1u);
    // The server goes first: its destructor retires and closes this domain's registrations.
  }
  EXPECT_FALSE(registry::covering(base, end, domain));
  EXPECT_EQ(registry::size(domain), 0u);

  // Then the caller's region. A second close here would fault inside libfabric.
  { dma::MemoryRegion<std::vector<std::uint8_t>> region(std::move(storage), base, end); }
  EXPECT_FALSE(registry::covering(base, end, domain));
}

TEST(RegistrationCache, ALeaseDroppedOffTheOwnerThreadIsClosedByTheOwner) {
  // Breaks: the last lease dropping on a CRC or allocator-hook thread closes the region on a
  // thread that does not own the domain (FI_THREAD_DOMAIN allows one), or the close is lost and
  // the region never closes.
  std::atomic<int> wakes{0};
  auto endpoint = open_tcp(DomainOwner::calling_thread([&wakes] { wakes.fetch_add(1); }));
  ASSERT_TRUE(endpoint);
  const std::shared_ptr<DeferredCloses>& closes = endpoint->deferred_closes();
  std::vector<std::uint8_t> memory(8192);
  Lease lease = register_bytes(*endpoint, memory);
  ASSERT_TRUE(lease);
  const std::uint64_t key = lease->key();

  std::thread([dropped = std::move(lease)]() mutable { dropped.reset(); }).join();

  EXPECT_TRUE(closes->pending()) << "the close must be queued for the owner";
  EXPECT_EQ(wakes.load(), 1) << "the owner must be woken to close it";
  EXPECT_TRUE(key_is_held(*endpoint, key)) << "the region was closed off the owner thread";

  closes->drain();
  EXPECT_FALSE(closes->pending());
  EXPECT_FALSE(key_is_held(*endpoint, key)) << "draining must close what was queued";
}

TEST(RegistrationCache, WithoutAnOwnerThreadALeaseClosesWhereItDrops) {
  // Breaks: a Target's regions (its domain has no owner thread; every caller holds the target's
  // lock) are queued for an owner that never drains, so an unexposed buffer stays registered
  // and reachable by its old key until the target closes.
  auto endpoint = open_tcp(DomainOwner::any_thread());
  ASSERT_TRUE(endpoint);
  std::vector<std::uint8_t> memory(8192);
  Lease lease = register_bytes(*endpoint, memory);
  ASSERT_TRUE(lease);
  const std::uint64_t key = lease->key();

  std::thread([dropped = std::move(lease)]() mutable { dropped.reset(); }).join();

  EXPECT_FALSE(endpoint->deferred_closes()->pending()) << "nothing may be queued";
  EXPECT_FALSE(key_is_held(*endpoint, key)) << "the dropping thread must have closed it";
}

TEST(RegistrationCache, DescriptorsStayValidWhileReclaimsRunUnderneath) {
  // Breaks: the race the hardware hit. Threads resolve operands out of the cache and read their
  // descriptors while the owner reclaims the same extents underneath them; under the old registry
  // that read a closed fid_mr and faulted inside libfabric. With leases a reclaim is merely a
  // retire, and the descriptor stays valid while any holder lives.
  constexpr std::size_t kExtents = 8;
  constexpr std::size_t kReaders = 4;
  constexpr int kRounds = 60;
  auto endpoint = open_tcp();
  ASSERT_TRUE(endpoint);
  const std::uintptr_t domain = endpoint->domain_key();
  std::vector<std::vector<std::uint8_t>> extents(kExtents, std::vector<std::uint8_t>(32 * 1024));
  std::vector<std::pair<std::uintptr_t, std::uintptr_t>> bounds;
  for (auto& extent : extents) {
    bounds.emplace_back(address_of(extent.data()), address_of(extent.data()) + extent.size());
  }
  auto register_all = [&] {
    for (std::size_t index = 0; index < kExtents; ++index) {
      Lease registration = register_bytes(*endpoint, extents[index]);
      if (!registration) return false;
      registry::track(bounds[index].first, bounds[index].second, domain, registration);
    }
    return true;
  };
  ASSERT_TRUE(register_all());

  std::atomic<bool> running{true};
  std::atomic<std::size_t> null_regions{0};
  std::mutex mutex;
  std::condition_variable changed;
  std::size_t leasing = 0;  // readers that have leased at least once; guarded by `mutex`
  std::vector<std::size_t> seen(kReaders, 0);  // each reader's own slot, read after join
  std::vector<std::thread> readers;
  for (std::size_t reader = 0; reader < kReaders; ++reader) {
    readers.emplace_back([&, reader] {
      bool announced = false;
      while (running.load(std::memory_order_relaxed)) {
        for (const auto& [base, end] : bounds) {
          if (Lease lease = registry::covering(base, base + 4096, domain)) {
            // What a post does with it: read the descriptor off a leased region while a reclaim
            // may be retiring it on another thread.
            void* volatile descriptor = fi_mr_desc(lease->memory_region());
            (void)descriptor;
            if (lease->memory_region() == nullptr) null_regions.fetch_add(1);
            ++seen[reader];
            if (!announced) {
              announced = true;
              {
                std::lock_guard lock(mutex);
                ++leasing;
              }
              changed.notify_all();
            }
          }
        }
      }
    });
  }

  // Reclaim only once every reader is in the loop, so the two really overlap.
  bool all_leasing = false;
  {
    std::unique_lock lock(mutex);
    all_leasing = changed.wait_for(lock, kDeadline, [&] { return leasing == kReaders; });
  }
  bool registered = all_leasing;
  for (int round = 0; registered && round < kRounds; ++round) {
    for (const auto& [base, end] : bounds) dma::invalidate(base, end);
    // What the owner's loop does: close what readers dropped last.
    endpoint->deferred_closes()->drain();
    // Re-register so the readers keep finding entries to lease.
    registered = register_all();
  }
  running.store(false, std::memory_order_relaxed);
  for (std::thread& reader : readers) reader.join();
  endpoint->deferred_closes()->drain();

  ASSERT_TRUE(all_leasing) << "not every reader leased before the deadline";
  EXPECT_TRUE(registered);
  EXPECT_EQ(null_regions.load(), 0u);
  std::size_t total = 0;
  for (std::size_t count : seen) total += count;
  EXPECT_GT(total, 0u) << "the readers should have leased something";
  EXPECT_EQ(registry::size(domain), kExtents);
}

}  // namespace
}  // namespace dma::internal
