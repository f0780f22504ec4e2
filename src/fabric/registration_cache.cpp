#include "fabric/registration_cache.hpp"

#include <algorithm>
#include <map>

#include "dma/memory.hpp"

namespace dma::internal {

void DeferredCloses::close(FidPtr<fid_mr> region) noexcept {
  if (!region) return;
  const bool elsewhere =
      owner_.thread != std::thread::id() && std::this_thread::get_id() != owner_.thread;
  if (!elsewhere) return;  // `region` closes here, on the owner (or on a serialised caller)
  {
    std::lock_guard lock(mutex_);
    queued_.push_back(std::move(region));
    pending_.store(true, std::memory_order_release);
  }
  if (owner_.wake) owner_.wake();
}

void DeferredCloses::drain() noexcept {
  std::vector<FidPtr<fid_mr>> closing;
  {
    std::lock_guard lock(mutex_);
    closing.swap(queued_);
    pending_.store(false, std::memory_order_release);
  }
  // `closing` closes here, outside the lock.
}

namespace {

struct Entry {
  std::uintptr_t end;
  Lease lease;
};

struct DomainRegions {
  std::uintptr_t domain;
  std::map<std::uintptr_t, Entry> regions;  // by base
  std::size_t longest = 0;  // the longest extent ever tracked, to bound invalidate's scan
};

struct Registry {
  std::mutex mutex;
  std::vector<DomainRegions> domains;
};

// Process-wide by nature (see the header); constructed on first use, never destroyed, so an
// allocator hook running during static destruction still finds it.
Registry& the_registry() {
  static Registry* registry = new Registry();
  return *registry;
}

DomainRegions* find(Registry& registry, std::uintptr_t domain) {
  for (auto& entry : registry.domains) {
    if (entry.domain == domain) return &entry;
  }
  return nullptr;
}

}  // namespace

namespace registry {

void track(std::uintptr_t base, std::uintptr_t end, std::uintptr_t domain, const Lease& lease) {
  Lease replaced;
  {
    Registry& registry = the_registry();
    std::lock_guard lock(registry.mutex);
    DomainRegions* regions = find(registry, domain);
    if (regions == nullptr) {
      registry.domains.push_back(DomainRegions{domain, {}, 0});
      regions = &registry.domains.back();
    }
    regions->longest = std::max(regions->longest, static_cast<std::size_t>(end - base));
    auto [where, inserted] = regions->regions.try_emplace(base, Entry{end, lease});
    if (!inserted) {
      replaced = std::move(where->second.lease);
      where->second = Entry{end, lease};
    }
  }
  // `replaced` drops here, outside the lock.
}

Lease covering(std::uintptr_t start, std::uintptr_t end, std::uintptr_t domain) {
  Registry& registry = the_registry();
  std::lock_guard lock(registry.mutex);
  DomainRegions* regions = find(registry, domain);
  if (regions == nullptr || regions->regions.empty()) return nullptr;
  auto after = regions->regions.upper_bound(start);
  if (after == regions->regions.begin()) return nullptr;
  const auto& [base, entry] = *std::prev(after);
  if (base <= start && end <= entry.end) return entry.lease;
  return nullptr;
}

void clear_domain(std::uintptr_t domain) {
  std::vector<Lease> retired;
  {
    Registry& registry = the_registry();
    std::lock_guard lock(registry.mutex);
    auto where = std::find_if(registry.domains.begin(), registry.domains.end(),
                              [&](const DomainRegions& entry) { return entry.domain == domain; });
    if (where == registry.domains.end()) return;
    for (auto& [base, entry] : where->regions) retired.push_back(std::move(entry.lease));
    registry.domains.erase(where);
  }
}

std::size_t size(std::uintptr_t domain) {
  Registry& registry = the_registry();
  std::lock_guard lock(registry.mutex);
  DomainRegions* regions = find(registry, domain);
  return regions == nullptr ? 0 : regions->regions.size();
}

}  // namespace registry
}  // namespace dma::internal

namespace dma {

void invalidate(std::uintptr_t start, std::uintptr_t end) noexcept {
  if (end <= start) return;
  std::vector<internal::Lease> retired;
  {
    auto& registry = internal::the_registry();
    std::lock_guard lock(registry.mutex);
    for (auto& domain : registry.domains) {
      // Only entries whose base lies in [start - longest, end) can overlap [start, end).
      const std::uintptr_t from = start > domain.longest ? start - domain.longest : 0;
      auto cursor = domain.regions.lower_bound(from);
      while (cursor != domain.regions.end() && cursor->first < end) {
        if (start < cursor->second.end) {
          retired.push_back(std::move(cursor->second.lease));
          cursor = domain.regions.erase(cursor);
        } else {
          ++cursor;
        }
      }
    }
  }
  // `retired` drops here, outside the lock; each region closes now unless a transfer leases it.
}

Result<CacheableSpan> CacheableSpan::create(std::uintptr_t base, std::size_t length) {
  if (length == 0) return fail(ErrorCode::kInvalidArgument, "cacheable span is empty");
  if (base + length < base) {
    return fail(ErrorCode::kInvalidArgument, "cacheable span overflows the address space");
  }
  return CacheableSpan(base, length);
}

}  // namespace dma
