// ServiceSet: several services behind one routing front.
#include "dma/service.hpp"

#include <algorithm>
#include <system_error>
#include <thread>

namespace dma {

Result<std::unique_ptr<ServiceSet>> ServiceSet::start(const Configuration& configuration,
                                                      BatchCompleter complete_batch,
                                                      std::size_t per_domain) {
  if (per_domain == 0) return fail(ErrorCode::kInvalidArgument, "per_domain must be at least 1");
  DMA_TRY_ASSIGN(const std::vector<DomainChoice> domains, discover_domains(configuration));
  DMA_TRY_ASSIGN(std::shared_ptr<Pool> pool, Pool::create(configuration.crc_threads));
  // Every domain of the first provider that offers any (preference order).
  const std::string provider = domains.front().provider;
  Configuration chosen = configuration;
  chosen.providers = {provider};
  std::vector<std::unique_ptr<FabricService>> services;
  for (const DomainChoice& choice : domains) {
    if (choice.provider != provider) continue;
    for (std::size_t copy = 0; copy < per_domain; ++copy) {
      DMA_TRY_ASSIGN(std::unique_ptr<FabricService> service,
                     FabricService::start(chosen, complete_batch, pool, choice.domain));
      services.push_back(std::move(service));
    }
  }
  return from(std::move(services), std::move(pool));
}

std::unique_ptr<ServiceSet> ServiceSet::from(std::vector<std::unique_ptr<FabricService>> services,
                                             std::shared_ptr<Pool> pool) {
  return std::unique_ptr<ServiceSet>(new ServiceSet(std::move(services), std::move(pool)));
}

std::size_t ServiceSet::least_loaded_index() {
  const std::size_t count = services_.size();
  const std::size_t start = next_.fetch_add(1, std::memory_order_relaxed) % count;
  std::size_t best = start;
  std::size_t best_load = services_[start]->outstanding();
  for (std::size_t step = 1; step < count; ++step) {
    const std::size_t index = (start + step) % count;
    const std::size_t load = services_[index]->outstanding();
    if (load < best_load) {
      best = index;
      best_load = load;
    }
  }
  return best;
}

FabricService& ServiceSet::least_loaded() { return *services_[least_loaded_index()]; }

std::vector<std::vector<std::uint8_t>> ServiceSet::local_addresses() const {
  std::vector<std::vector<std::uint8_t>> out;
  for (const auto& service : services_) {
    auto address = service->local_address();
    out.emplace_back(address.begin(), address.end());
  }
  return out;
}

std::uint64_t ServiceSet::generation() const noexcept {
  std::uint64_t sum = 0;
  for (const auto& service : services_) sum += service->generation();
  return sum;
}

bool ServiceSet::shutdown(std::chrono::milliseconds bound) {
  // In parallel, so the set takes one bound, not one per service.
  std::vector<std::thread> stoppers;
  std::vector<char> drained(services_.size(), 0);
  for (std::size_t index = 0; index < services_.size(); ++index) {
    try {
      stoppers.emplace_back([&, index] { drained[index] = services_[index]->shutdown(bound); });
    } catch (const std::system_error&) {
      drained[index] = services_[index]->shutdown(bound);
    }
  }
  for (std::thread& stopper : stoppers) stopper.join();
  return std::all_of(drained.begin(), drained.end(), [](char each) { return each != 0; });
}

Status ServiceSet::add_peer(std::uint64_t client_id, std::span<const std::uint8_t> address) {
  for (std::size_t index = 0; index < services_.size(); ++index) {
    if (Status added = services_[index]->add_peer(client_id, address); !added) {
      for (std::size_t undo = 0; undo < index; ++undo) services_[undo]->remove_peer(client_id);
      return added;
    }
  }
  return {};
}

void ServiceSet::remove_peer(std::uint64_t client_id) {
  for (auto& service : services_) service->remove_peer(client_id);
}

Status ServiceSet::pin(std::uintptr_t base, std::size_t length) {
  for (auto& service : services_) {
    if (Status pinned = service->pin(base, length); !pinned) {
      invalidate(base, base + length);
      return pinned;
    }
  }
  return {};
}

}  // namespace dma
