#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "dma/service.hpp"
#include "endpoint.hpp"
#include "one_shot.hpp"
#include "worker.hpp"

namespace dma {

using internal::Answer;
using internal::ServiceShared;
using internal::Worker;

Result<FabricAddress> FabricAddress::from(std::span<const std::uint8_t> bytes) {
  if (bytes.size() > kCapacity) {
    return fail(ErrorCode::kInvalidArgument, "fabric address is " + std::to_string(bytes.size()) +
                                                 " bytes; at most " + std::to_string(kCapacity) +
                                                 " are supported");
  }
  FabricAddress address;
  std::copy(bytes.begin(), bytes.end(), address.bytes_.begin());
  address.size_ = bytes.size();
  return address;
}

TransferRequest TransferRequest::single(std::uint64_t client_id, FabricAddress peer,
                                        std::uint64_t key, std::uint64_t remote_address,
                                        Direction direction, std::size_t length,
                                        std::unique_ptr<Operands> context) {
  TransferRequest request;
  request.client_id = client_id;
  request.peer_address = peer;
  // A single region is as long as the transfer needs; for kToPeer the worker checks it against
  // the source's size, so make it unbounded there.
  request.regions.push_back(RemoteRegion{
      key, remote_address,
      direction == Direction::kFromPeer ? length : std::uint64_t{1} << 62});
  request.direction = direction;
  request.length = length;
  request.context = std::move(context);
  return request;
}

std::string EndpointDescription::to_string() const {
  std::ostringstream out;
  out << "provider=" << provider << " fabric=" << fabric << " domain=" << domain
      << " addr_format=" << address_format << " mr_mode=" << mr_mode_flags
      << " caps=" << caps_flags << " tx_size=" << tx_size << " max_msg_size=" << max_msg_size
      << " max_in_flight=" << max_in_flight
      << " remote_addresses=" << (virtual_addresses ? "virtual" : "offset")
      << " keys=" << (provider_keys ? "provider" : "application");
  return out.str();
}

Result<std::vector<DomainChoice>> discover_domains(const Configuration& configuration) {
  if (Status valid = configuration.validate(); !valid) return fail(std::move(valid).error());
  std::vector<DomainChoice> found;
  std::ostringstream reasons;
  for (const std::string& provider : configuration.providers) {
    Result<internal::InfoPtr> all =
        internal::query_provider(configuration, provider, internal::Role::kInitiator, nullptr);
    if (!all) {
      reasons << "; " << all.error().message();
      continue;
    }
    const std::string exact = provider == "efa-direct" ? "efa" : canonical_provider(provider);
    std::set<std::string> seen;
    for (fi_info* info = all->get(); info != nullptr; info = info->next) {
      if (exact != info->fabric_attr->prov_name) continue;
      if (provider == "efa-direct" && std::string("efa-direct") != info->fabric_attr->name) continue;
      const std::string domain = info->domain_attr->name ? info->domain_attr->name : "";
      if (!configuration.interfaces.empty() &&
          std::find(configuration.interfaces.begin(), configuration.interfaces.end(), domain) ==
              configuration.interfaces.end()) {
        continue;
      }
      if (seen.insert(domain).second) found.push_back(DomainChoice{provider, domain});
    }
  }
  if (found.empty()) {
    std::string why = reasons.str();
    return fail(ErrorCode::kNotFound,
                "no domain matches the configuration" + (why.empty() ? "" : ": " + why.substr(2)));
  }
  return found;
}

// ---- FabricService -----------------------------------------------------------------------

struct FabricService::Impl {
  std::shared_ptr<ServiceShared> shared;
  std::thread thread;
  std::thread::id worker_id;
  std::vector<std::uint8_t> address;
  EndpointDescription description;

  Status refuse_reentry() const {
    if (std::this_thread::get_id() == worker_id) {
      return fail(ErrorCode::kInvalidArgument,
                  "a blocking FabricService call from its own completion callback would "
                  "deadlock");
    }
    return {};
  }
};

namespace {
struct Opened {
  std::vector<std::uint8_t> address;
  EndpointDescription description;
};
std::atomic<unsigned> next_worker_index{0};
}  // namespace

Result<std::unique_ptr<FabricService>> FabricService::start(const Configuration& configuration,
                                                            BatchCompleter complete_batch,
                                                            std::shared_ptr<Pool> pool,
                                                            const std::string& domain) {
  if (!pool) {
    Result<std::shared_ptr<Pool>> created = Pool::create(configuration.crc_threads);
    if (!created) return fail(std::move(created).error());
    pool = std::move(*created);
  }
  auto impl = std::make_unique<Impl>();
  impl->shared = std::make_shared<ServiceShared>();
  impl->shared->complete_batch = std::move(complete_batch);
  impl->shared->pool = std::move(pool);

  auto [ready, waiting] = internal::one_shot<Result<Opened>>();
  const unsigned index = next_worker_index.fetch_add(1, std::memory_order_relaxed);
  impl->thread = std::thread([configuration, domain, shared = impl->shared, index,
                              ready = std::move(ready)]() mutable {
    char name[16];
    std::snprintf(name, sizeof(name), "fabric-%02u", index % 100);
    pthread_setname_np(pthread_self(), name);
    Result<std::unique_ptr<Worker>> worker = Worker::open(configuration, domain, shared);
    if (!worker) {
      ready.send(fail(std::move(worker).error()));
      return;
    }
    ready.send(Opened{(*worker)->endpoint().local_address(), (*worker)->endpoint().describe()});
    (*worker)->run();
  });
  impl->worker_id = impl->thread.get_id();
  std::optional<Result<Opened>> opened = waiting.wait();
  if (!opened || !*opened) {
    impl->shared->channel.close();
    impl->thread.join();
    if (!opened) return fail(ErrorCode::kWorkerGone, "fabric worker exited before it was ready");
    return fail(std::move(*opened).error());
  }
  impl->address = std::move((*opened)->address);
  impl->description = std::move((*opened)->description);
  return std::unique_ptr<FabricService>(new FabricService(std::move(impl)));
}

FabricService::FabricService(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

FabricService::~FabricService() {
  impl_->shared->channel.close();
  if (impl_->thread.joinable()) impl_->thread.join();
}

std::span<const std::uint8_t> FabricService::local_address() const noexcept {
  return impl_->address;
}
const EndpointDescription& FabricService::describe() const noexcept { return impl_->description; }
std::size_t FabricService::outstanding() const noexcept {
  return impl_->shared->outstanding.load(std::memory_order_relaxed);
}
ServiceCounters FabricService::counters() const noexcept {
  return impl_->shared->counters.snapshot();
}

Status FabricService::submit(TransferRequest&& request) {
  if (!request.context) return fail(ErrorCode::kInvalidArgument, "transfer has no context");
  auto& shared = *impl_->shared;
  shared.outstanding.fetch_add(1, std::memory_order_acq_rel);
  if (!shared.channel.push(std::move(request))) {
    shared.outstanding.fetch_sub(1, std::memory_order_acq_rel);
    return fail(ErrorCode::kWorkerGone, "fabric worker is gone");
  }
  shared.counters.submitted.fetch_add(1, std::memory_order_relaxed);
  return {};
}

Status FabricService::add_peer(std::uint64_t client_id, std::span<const std::uint8_t> address) {
  if (Status ok = impl_->refuse_reentry(); !ok) return ok;
  Result<FabricAddress> inline_address = FabricAddress::from(address);
  if (!inline_address) return fail(std::move(inline_address).error());
  auto [answer, waiting] = internal::one_shot<Status>();
  if (!impl_->shared->channel.push(
          internal::AddPeerMessage{client_id, *inline_address, std::move(answer)})) {
    return fail(ErrorCode::kWorkerGone, "fabric worker is gone");
  }
  std::optional<Status> added = waiting.wait();
  if (!added) return fail(ErrorCode::kWorkerGone, "fabric worker exited before adding the peer");
  return std::move(*added);
}

void FabricService::remove_peer(std::uint64_t client_id) {
  (void)impl_->shared->channel.push(internal::RemovePeerMessage{client_id});
}

Status FabricService::pin(std::uintptr_t base, std::size_t length) {
  if (length == 0) return fail(ErrorCode::kInvalidArgument, "cannot register 0 bytes");
  if (base + length < base) {
    return fail(ErrorCode::kInvalidArgument, "registered range overflows the address space");
  }
  if (Status ok = impl_->refuse_reentry(); !ok) return ok;
  auto [answer, waiting] = internal::one_shot<Status>();
  if (!impl_->shared->channel.push(internal::RegisterMessage{base, length, std::move(answer)})) {
    return fail(ErrorCode::kWorkerGone, "fabric worker is gone");
  }
  std::optional<Status> pinned = waiting.wait();
  if (!pinned) return fail(ErrorCode::kWorkerGone, "fabric worker exited before registering");
  return std::move(*pinned);
}

// ---- Transfer ----------------------------------------------------------------------------

struct Transfer::State {
  std::mutex mutex;
  std::condition_variable done;
  std::optional<Outcome> outcome;
  std::unique_ptr<Operands> context;
  std::coroutine_handle<> waiter;

  // The outcome is known: wakes the waiters. `inner` (the caller's context) comes with it, or
  // later through complete() for a transfer that expired while the provider held it.
  void complete(Outcome result, std::unique_ptr<Operands> inner) {
    std::coroutine_handle<> resume;
    {
      std::lock_guard lock(mutex);
      if (!outcome) outcome = std::move(result);  // an expiry already told the waiters
      context = std::move(inner);
      resume = std::exchange(waiter, nullptr);
    }
    done.notify_all();
    if (resume) resume.resume();
  }
};

namespace {
// Wraps the caller's context so its completion lands in a Transfer's state instead of the batch
// completer.
class AwaitedOperands final : public Operands {
 public:
  AwaitedOperands(std::unique_ptr<Operands> inner, std::shared_ptr<Transfer::State> state)
      : inner_(std::move(inner)), state_(std::move(state)) {}
  std::span<const std::byte> source() override { return inner_->source(); }
  std::span<std::byte> allocate(std::size_t length) override { return inner_->allocate(length); }
  std::optional<CacheableSpan> cacheable_span() override { return inner_->cacheable_span(); }
  bool on_complete(Outcome& outcome) override {
    state_->complete(std::move(outcome), std::move(inner_));
    return true;
  }
  void on_expired(const Error& error) override {
    inner_->on_expired(error);
    state_->complete(fail(error), nullptr);
  }
  // The caller's context, for a transfer that was never submitted.
  std::unique_ptr<Operands> release() { return std::move(inner_); }

 private:
  std::unique_ptr<Operands> inner_;
  std::shared_ptr<Transfer::State> state_;
};
}  // namespace

Result<Transfer> FabricService::transfer(TransferRequest&& request) {
  if (!request.context) return fail(ErrorCode::kInvalidArgument, "transfer has no context");
  auto state = std::make_shared<Transfer::State>();
  std::unique_ptr<Operands> inner = std::move(request.context);
  request.context = std::make_unique<AwaitedOperands>(std::move(inner), state);
  if (Status submitted = submit(std::move(request)); !submitted) {
    // Refused requests are left untouched: give the caller its own context back.
    request.context = static_cast<AwaitedOperands*>(request.context.get())->release();
    return fail(std::move(submitted).error());
  }
  return Transfer(std::move(state));
}

bool Transfer::ready() const {
  std::lock_guard lock(state_->mutex);
  return state_->outcome.has_value();
}

Outcome Transfer::wait() {
  std::unique_lock lock(state_->mutex);
  state_->done.wait(lock, [&] { return state_->outcome.has_value(); });
  return *state_->outcome;
}

Outcome Transfer::wait_for(std::chrono::milliseconds timeout) {
  std::unique_lock lock(state_->mutex);
  if (!state_->done.wait_for(lock, timeout, [&] { return state_->outcome.has_value(); })) {
    return fail(ErrorCode::kTimedOut, "transfer did not complete within " +
                                          std::to_string(timeout.count()) + " ms");
  }
  return *state_->outcome;
}

std::unique_ptr<Operands> Transfer::take_context() {
  std::lock_guard lock(state_->mutex);
  return std::move(state_->context);
}

bool Transfer::await_suspend(std::coroutine_handle<> waiter) {
  std::lock_guard lock(state_->mutex);
  if (state_->outcome.has_value()) return false;  // completed meanwhile: do not suspend
  state_->waiter = waiter;
  return true;
}

// ---- ServiceSet --------------------------------------------------------------------------

Result<std::unique_ptr<ServiceSet>> ServiceSet::start(const Configuration& configuration,
                                                      BatchCompleter complete_batch,
                                                      std::size_t per_domain) {
  if (per_domain == 0) return fail(ErrorCode::kInvalidArgument, "per_domain must be at least 1");
  Result<std::vector<DomainChoice>> domains = discover_domains(configuration);
  if (!domains) return fail(std::move(domains).error());
  Result<std::shared_ptr<Pool>> pool = Pool::create(configuration.crc_threads);
  if (!pool) return fail(std::move(pool).error());
  // Every domain of the first provider that offers any (preference order).
  const std::string provider = domains->front().provider;
  Configuration chosen = configuration;
  chosen.providers = {provider};
  std::vector<std::unique_ptr<FabricService>> services;
  for (const DomainChoice& choice : *domains) {
    if (choice.provider != provider) continue;
    for (std::size_t copy = 0; copy < per_domain; ++copy) {
      Result<std::unique_ptr<FabricService>> service =
          FabricService::start(chosen, complete_batch, *pool, choice.domain);
      if (!service) return fail(std::move(service).error());
      services.push_back(std::move(*service));
    }
  }
  return from(std::move(services), std::move(*pool));
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
