#include <algorithm>
#include <condition_variable>
#include <optional>
#include <string>
#include <unordered_map>
#include <variant>
#include <cstdio>
#include <mutex>
#include <system_error>
#include <thread>

#include "dma/service.hpp"
#include "fabric/endpoint.hpp"
#include "fabric/registration_cache.hpp"
#include "fabric/timer_slack.hpp"
#include "worker/one_shot.hpp"
#include "worker/service_shared.hpp"
#include "worker/worker.hpp"

namespace dma {

using internal::Answer;
using internal::Channel;
using internal::Message;
using internal::ServiceShared;
using internal::ServiceTotals;
using internal::Worker;

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

// ---- FabricService -----------------------------------------------------------------------
//
// Endpoint replacement. A service is a succession of generations, each one endpoint with its
// own worker thread and channel; `current` is where new transfers go. A generation retires when
// its worker finds the endpoint wedged (expiry.hpp; it then calls on_retired and is retired once
// the new endpoint is in place), when the
// watchdog finds its worker stuck inside a libfabric call, or on replace_endpoint(). The service
// then opens a new generation, replays into its channel the peers add_peer() made and the pins
// that are still live, and routes new submissions there. A retired worker keeps its endpoint
// open, holding what the provider may still touch, until shutdown; a stuck one is never joined
// while stuck (its objects are left to it, on purpose).

namespace {
// A generation's thread says here that it has finished (joinable without blocking).
struct Exit {
  std::mutex mutex;
  std::condition_variable done_signal;
  bool done = false;
};
// What the workers ask of the watchdog (held by their on_retired callbacks, which may run after
// the service is gone: a worker that was left stuck at shutdown and came back).
struct Requests {
  std::mutex mutex;
  std::condition_variable wake;
  std::optional<std::string> replace;  // a worker retired its endpoint: open a new one
  bool stopping = false;
};
}  // namespace

struct Generation {
  std::shared_ptr<ServiceShared> shared;
  std::thread thread;
  std::shared_ptr<Exit> exit;
  std::vector<std::uint8_t> address;
  EndpointDescription description;
  std::uintptr_t domain_key = 0;
  Worker* worker = nullptr;  // owned by its thread; valid while the thread runs
  std::thread::id worker_id;
  bool abandoned = false;  // counted once, stuck or undrained at shutdown
  // The watchdog's last look at `turns`, and when it last saw it change.
  std::uint64_t seen_turns = 0;
  std::chrono::steady_clock::time_point seen_at{};
};

struct FabricService::Impl {
  Configuration configuration;
  std::string domain;
  BatchCompleter complete_batch;
  std::shared_ptr<Pool> pool;
  std::shared_ptr<ServiceTotals> totals = std::make_shared<ServiceTotals>();
  std::shared_ptr<Requests> requests = std::make_shared<Requests>();

  mutable std::mutex mutex;  // guards everything below but `current` and `generation`
  std::vector<std::unique_ptr<Generation>> generations;  // every one, the current last
  std::unordered_map<std::uint64_t, FabricAddress> peers;  // what add_peer() made
  std::vector<std::pair<std::uintptr_t, std::size_t>> pins;
  std::optional<bool> drained;  // set once shutdown() has run
  std::atomic<Generation*> current{nullptr};
  std::atomic<std::uint64_t> generation{0};
  std::thread watchdog;

  Status refuse_reentry() const {
    std::lock_guard lock(mutex);
    for (const auto& each : generations) {
      if (std::this_thread::get_id() == each->worker_id) {
        return fail(ErrorCode::kInvalidArgument,
                    "a blocking FabricService call from its own completion callback would "
                    "deadlock");
      }
    }
    return {};
  }
  // How long a blocking call waits for a worker's answer: long enough for the watchdog to find
  // a stuck worker and hand the message to the next one.
  std::chrono::milliseconds answer_bound() const {
    return configuration.stuck_deadline * 2 + configuration.progress_deadline +
           std::chrono::milliseconds(1000);
  }

  Result<std::unique_ptr<Generation>> open_generation();
  // Why the old generation goes: asked (replace_endpoint: its worker is told to retire),
  // retired (its worker found the endpoint wedged and retired it itself) or stuck (the
  // watchdog has taken its table; its channel is closed so nothing more waits on it).
  enum class Cause { kAsked, kRetired, kStuck };
  Status replace(const std::string& reason, Cause cause);
  // Moves what waits in `old`'s channel (never taken by its worker: never posted) to the
  // current generation.
  void move_waiting(Generation& old);
  void watch();
  void check_stuck(std::chrono::steady_clock::time_point now);
  bool shutdown(std::chrono::milliseconds bound);
  // A shutdown leaves `left` behind: answers what its worker holds if it is inside a provider
  // call (the gate), fails what still waits in its channel, and tells it to stop if it returns.
  void orphan(Generation& left);
};

namespace {
struct Opened {
  std::vector<std::uint8_t> address;
  EndpointDescription description;
  std::uintptr_t domain_key = 0;
  Worker* worker = nullptr;
};
std::atomic<unsigned> next_worker_index{0};

// One line on stderr per event that costs callers their transfers (a replacement, a worker left
// behind): rare, and what an operator needs to see.
void log_line(const std::string& text) { std::fprintf(stderr, "dma: %s\n", text.c_str()); }
}  // namespace

Result<std::unique_ptr<Generation>> FabricService::Impl::open_generation() {
  auto fresh = std::make_unique<Generation>();
  fresh->shared = std::make_shared<ServiceShared>(totals);
  fresh->shared->complete_batch = complete_batch;
  fresh->shared->pool = pool;
  fresh->shared->on_retired = [requests = requests](const std::string& reason) {
    {
      std::lock_guard lock(requests->mutex);
      if (!requests->replace) requests->replace = reason;
    }
    requests->wake.notify_all();
  };
  fresh->exit = std::make_shared<Exit>();
  auto [ready, waiting] = internal::one_shot<Result<Opened>>();
  const unsigned index = next_worker_index.fetch_add(1, std::memory_order_relaxed);
  try {
    fresh->thread = std::thread([configuration = configuration, domain = domain,
                                 shared = fresh->shared, exit = fresh->exit, index,
                                 ready = std::move(ready)]() mutable {
      char name[16];
      std::snprintf(name, sizeof(name), "fabric-%02u", index % 100);
      pthread_setname_np(pthread_self(), name);
      internal::use_precise_timers();  // its naps notice completions
      {
        Result<std::unique_ptr<Worker>> worker = Worker::open(configuration, domain, shared);
        if (!worker) {
          ready.send(fail(std::move(worker).error()));
        } else {
          ready.send(Opened{(*worker)->endpoint().local_address(),
                            (*worker)->endpoint().describe(),
                            (*worker)->endpoint().domain_key(), worker->get()});
          (*worker)->run();
          if (shared->orphaned.load(std::memory_order_acquire)) {
            // Back after a shutdown left it behind: the endpoint and what the provider may
            // still reference stay allocated for good (service_shared.hpp, keep_forever).
            Worker* leaked = worker->release();
            internal::keep_forever(std::shared_ptr<Worker>(leaked, [](Worker*) {}));
          }
        }
      }
      std::lock_guard lock(exit->mutex);
      exit->done = true;
      exit->done_signal.notify_all();
    });
  } catch (const std::system_error& error) {
    // std::thread reports a failed pthread_create (EAGAIN: the thread limit) by throwing;
    // nothing throws across this API. The lambda (and `ready` with it) is gone unrun.
    return fail(ErrorCode::kResourceExhausted,
                std::string("cannot start the fabric worker thread: ") + error.what());
  }
  fresh->worker_id = fresh->thread.get_id();
  std::optional<Result<Opened>> opened = waiting.wait();
  if (!opened || !*opened) {
    fresh->shared->channel.close();
    fresh->thread.join();
    if (!opened) return fail(ErrorCode::kWorkerGone, "fabric worker exited before it was ready");
    return fail(std::move(*opened).error());
  }
  fresh->address = std::move((*opened)->address);
  fresh->description = std::move((*opened)->description);
  fresh->domain_key = (*opened)->domain_key;
  fresh->worker = (*opened)->worker;
  fresh->seen_at = std::chrono::steady_clock::now();
  return fresh;
}

Status FabricService::Impl::replace(const std::string& reason, Cause cause) {
  DMA_TRY_ASSIGN(std::unique_ptr<Generation> fresh, open_generation());
  Generation* old = nullptr;
  {
    std::lock_guard lock(mutex);
    if (drained) {
      // Shut down while the new endpoint opened: it never served, so it closes at once.
      fresh->shared->channel.close();
      fresh->thread.join();
      return fail(ErrorCode::kWorkerGone, "the service is shutting down");
    }
    old = current.load(std::memory_order_relaxed);
    Channel& channel = fresh->shared->channel;
    // Peers first, so the transfers routed here find their entries; answers are not awaited
    // (a peer the new endpoint refuses fails its transfers as an unknown client would).
    for (const auto& [client_id, address] : peers) {
      auto [answer, unused] = internal::one_shot<Status>();
      (void)channel.push(internal::AddPeerMessage{client_id, address, std::move(answer)});
    }
    // Pins the caller has not invalidated: the old domain's registry still covers them.
    std::vector<std::pair<std::uintptr_t, std::size_t>> live;
    for (const auto& [base, length] : pins) {
      if (internal::registry::covering(base, base + length, old->domain_key)) {
        live.emplace_back(base, length);
        auto [answer, unused] = internal::one_shot<Status>();
        (void)channel.push(internal::RegisterMessage{base, length, std::move(answer)});
      }
    }
    pins = std::move(live);
    generations.push_back(std::move(fresh));
    current.store(generations.back().get(), std::memory_order_release);
  }
  generation.fetch_add(1, std::memory_order_acq_rel);
  totals->counters.replacements.fetch_add(1, std::memory_order_relaxed);
  if (cause == Cause::kStuck) old->shared->channel.close();  // submit() then retries here
  move_waiting(*old);
  // A wedged or asked-for endpoint retires only now, with its successor in place (a caller told
  // "endpoint replaced" and saying hello again must find the new one).
  if (cause != Cause::kStuck) (void)old->shared->channel.push(internal::RetireMessage{reason});
  log_line("endpoint replaced (" + reason + "); new address " +
           std::to_string(current.load()->address.size()) + " bytes, generation " +
           std::to_string(generation.load()));
  return {};
}

void FabricService::Impl::move_waiting(Generation& old) {
  // The old worker may be taking from its channel at the same time (Channel locks): what it
  // takes first it handles itself (failing transfers as replaced once it has retired).
  std::vector<Message> waiting;
  (void)old.shared->channel.take(waiting, false);
  Channel& target = current.load(std::memory_order_acquire)->shared->channel;
  for (Message& message : waiting) {
    std::visit(
        [&](auto& each) {
          using Kind = std::decay_t<decltype(each)>;
          if constexpr (!std::is_same_v<Kind, internal::RetireMessage>) {
            // A TransferRequest that cannot be pushed (the service shutting down) is dropped with
            // its context; shutdown fails what it can still reach.
            (void)target.push(std::move(each));
          }
        },
        message);
  }
}

void FabricService::Impl::watch() {
  pthread_setname_np(pthread_self(), "dma-watchdog");
  const auto period = std::max<std::chrono::milliseconds>(configuration.stuck_deadline / 4,
                                                          std::chrono::milliseconds(1));
  std::unique_lock lock(requests->mutex);
  while (!requests->stopping) {
    requests->wake.wait_for(lock, period,
                            [&] { return requests->stopping || requests->replace.has_value(); });
    if (requests->stopping) break;
    std::optional<std::string> reason = std::exchange(requests->replace, std::nullopt);
    lock.unlock();
    if (reason) {
      if (Status replaced = replace(*reason, Cause::kRetired); !replaced) {
        log_line("could not replace a retired endpoint: " + replaced.error().describe() +
                 "; transfers fail until it can");
        std::lock_guard again(requests->mutex);
        if (!requests->replace) requests->replace = *reason;  // try again next period
      }
    } else {
      check_stuck(std::chrono::steady_clock::now());
    }
    lock.lock();
  }
}

void FabricService::Impl::check_stuck(std::chrono::steady_clock::time_point now) {
  Generation* watched = current.load(std::memory_order_acquire);
  ServiceShared& shared = *watched->shared;
  const std::uint64_t turns = shared.turns.load(std::memory_order_relaxed);
  if (turns != watched->seen_turns || shared.parked.load(std::memory_order_relaxed)) {
    watched->seen_turns = turns;
    watched->seen_at = now;
    return;
  }
  if (now - watched->seen_at < configuration.stuck_deadline) return;
  const std::string reason = "the fabric worker has been inside one libfabric call for over " +
                             std::to_string(configuration.stuck_deadline.count()) + " ms";
  {
    std::lock_guard lock(mutex);
    watched->abandoned = true;
  }
  totals->counters.abandoned.fetch_add(1, std::memory_order_relaxed);
  log_line("abandoning a stuck fabric worker: " + reason);
  // The new endpoint first, so the callers answered below find it in place when they say
  // hello again. A stuck worker that ever returns finds itself retired by abandon(), or its
  // channel closed.
  if (Status replaced = replace(reason, Cause::kStuck); !replaced) {
    log_line("could not replace the stuck endpoint: " + replaced.error().describe());
  }
  if (shared.gate.claim()) {
    // The worker cannot touch its table until released: answer everything in it now.
    watched->worker->abandon(Error(ErrorCode::kFabric, "endpoint replaced: " + reason));
    shared.gate.release();
  } else {
    log_line("the fabric worker has not turned for " +
             std::to_string(configuration.stuck_deadline.count()) +
             " ms outside a libfabric call it could be relieved from; its transfers are answered "
             "only if it returns");
  }
}

bool FabricService::Impl::shutdown(std::chrono::milliseconds bound) {
  const auto deadline = std::chrono::steady_clock::now() + bound;
  {
    std::lock_guard lock(mutex);
    if (drained) return *drained;
  }
  {
    std::lock_guard lock(requests->mutex);
    requests->stopping = true;
  }
  requests->wake.notify_all();
  if (watchdog.joinable()) watchdog.join();
  std::lock_guard lock(mutex);
  // Workers fail what is still live at three quarters of the bound, so that their endpoints
  // close and every completion is delivered within it.
  const auto drain_at = std::chrono::steady_clock::now() + bound * 3 / 4;
  for (const auto& each : generations) {
    each->shared->drain_until_ns.store(drain_at.time_since_epoch().count(),
                                       std::memory_order_release);
    each->shared->channel.close();
  }
  bool all = true;
  for (const auto& each : generations) {
    bool done = false;
    {
      std::unique_lock wait(each->exit->mutex);
      done = each->exit->done_signal.wait_until(wait, deadline, [&] { return each->exit->done; });
    }
    if (done) {
      each->thread.join();
      continue;
    }
    all = false;
    orphan(*each);
    each->thread.detach();
    if (!each->abandoned) {
      each->abandoned = true;
      totals->counters.abandoned.fetch_add(1, std::memory_order_relaxed);
    }
    log_line("shutdown left a fabric worker behind after " + std::to_string(bound.count()) +
             " ms (stuck in the provider); its endpoint and buffers are not freed");
  }
  drained = all;
  return all;
}

void FabricService::Impl::orphan(Generation& left) {
  ServiceShared& shared = *left.shared;
  // Before the gate goes back: a worker that returns must find itself orphaned.
  shared.orphaned.store(true, std::memory_order_release);
  if (shared.gate.claim()) {
    left.worker->abandon(Error(ErrorCode::kWorkerGone,
                               "the service shut down with the fabric worker stuck inside the "
                               "provider; the local buffer stays held for good"));
    shared.gate.release();
  } else if (!left.abandoned) {
    log_line("a fabric worker not inside a provider call did not finish by the shutdown bound; "
             "its transfers are answered only if it returns");
  }
  // Closed by shutdown() already; what was pushed before it and never taken fails here.
  std::vector<Message> waiting;
  (void)shared.channel.take(waiting, false);
  std::vector<Completion> failed;
  for (Message& message : waiting) {
    if (auto* request = std::get_if<TransferRequest>(&message)) {
      Completion completion{std::move(request->context),
                            fail(ErrorCode::kWorkerGone,
                                 "fabric worker is gone (service shut down with it stuck)")};
      totals->outstanding.fetch_sub(1, std::memory_order_acq_rel);
      totals->counters.failed.fetch_add(1, std::memory_order_relaxed);
      if (completion.context && completion.context->on_complete(completion.outcome)) continue;
      failed.push_back(std::move(completion));
    }
  }
  if (!failed.empty() && complete_batch) complete_batch(std::span<Completion>(failed));
}

Result<std::unique_ptr<FabricService>> FabricService::start(const Configuration& configuration,
                                                            BatchCompleter complete_batch,
                                                            std::shared_ptr<Pool> pool,
                                                            const std::string& domain) {
  if (!pool) {
    DMA_TRY_ASSIGN(pool, Pool::create(configuration.crc_threads));
  }
  auto impl = std::make_unique<Impl>();
  impl->configuration = configuration;
  impl->domain = domain;
  impl->complete_batch = std::move(complete_batch);
  impl->pool = std::move(pool);
  DMA_TRY_ASSIGN(std::unique_ptr<Generation> first, impl->open_generation());
  impl->generations.push_back(std::move(first));
  impl->current.store(impl->generations.back().get(), std::memory_order_release);
  try {
    impl->watchdog = std::thread([raw = impl.get()] { raw->watch(); });
  } catch (const std::system_error& error) {
    impl->shutdown(configuration.shutdown_deadline);
    return fail(ErrorCode::kResourceExhausted,
                std::string("cannot start the service's watchdog thread: ") + error.what());
  }
  return std::unique_ptr<FabricService>(new FabricService(std::move(impl)));
}

FabricService::FabricService(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

FabricService::~FabricService() { impl_->shutdown(impl_->configuration.shutdown_deadline); }

bool FabricService::shutdown(std::chrono::milliseconds bound) { return impl_->shutdown(bound); }

std::vector<std::uint8_t> FabricService::local_address() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->current.load(std::memory_order_relaxed)->address;
}
EndpointDescription FabricService::describe() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->current.load(std::memory_order_relaxed)->description;
}
std::uint64_t FabricService::generation() const noexcept {
  return impl_->generation.load(std::memory_order_acquire);
}
std::size_t FabricService::outstanding() const noexcept {
  return impl_->totals->outstanding.load(std::memory_order_relaxed);
}
ServiceCounters FabricService::counters() const noexcept {
  return impl_->totals->counters.snapshot();
}

Status FabricService::replace_endpoint(std::string_view reason) {
  DMA_TRY(impl_->refuse_reentry());
  return impl_->replace(std::string(reason), Impl::Cause::kAsked);
}

Status FabricService::submit(TransferRequest&& request) {
  if (!request.context) return fail(ErrorCode::kInvalidArgument, "transfer has no context");
  ServiceTotals& totals = *impl_->totals;
  totals.outstanding.fetch_add(1, std::memory_order_acq_rel);
  // A push can find the channel closed only while a replacement or shutdown runs: the next
  // generation is then current, unless the service is shutting down.
  for (int attempt = 0; attempt < 4; ++attempt) {
    Generation* target = impl_->current.load(std::memory_order_acquire);
    if (target->shared->channel.push(std::move(request))) {
      totals.counters.submitted.fetch_add(1, std::memory_order_relaxed);
      return {};
    }
    if (impl_->current.load(std::memory_order_acquire) == target) break;
  }
  totals.outstanding.fetch_sub(1, std::memory_order_acq_rel);
  return fail(ErrorCode::kWorkerGone, "fabric worker is gone");
}

Status FabricService::add_peer(std::uint64_t client_id, std::span<const std::uint8_t> address) {
  DMA_TRY(impl_->refuse_reentry());
  DMA_TRY_ASSIGN(const FabricAddress inline_address, FabricAddress::from(address));
  auto [answer, waiting] = internal::one_shot<Status>();
  Generation* asked = impl_->current.load(std::memory_order_acquire);
  if (!asked->shared->channel.push(
          internal::AddPeerMessage{client_id, inline_address, std::move(answer)})) {
    return fail(ErrorCode::kWorkerGone, "fabric worker is gone");
  }
  bool timed_out = false;
  std::optional<Status> added = waiting.wait_for(impl_->answer_bound(), timed_out);
  if (timed_out) return fail(ErrorCode::kTimedOut, "the fabric worker did not add the peer in time");
  if (!added) return fail(ErrorCode::kWorkerGone, "fabric worker exited before adding the peer");
  if (*added) {
    std::lock_guard lock(impl_->mutex);
    impl_->peers.insert_or_assign(client_id, inline_address);
    // Replaced since the push: the replay ran without this peer, so the new endpoint gets it
    // here (replace() reads `peers` and switches `current` under this same lock).
    if (Generation* now = impl_->current.load(std::memory_order_relaxed); now != asked) {
      auto [replayed, unused] = internal::one_shot<Status>();
      (void)now->shared->channel.push(
          internal::AddPeerMessage{client_id, inline_address, std::move(replayed)});
    }
  }
  return std::move(*added);
}

void FabricService::remove_peer(std::uint64_t client_id) {
  std::lock_guard lock(impl_->mutex);
  impl_->peers.erase(client_id);
  // Every generation: a retired one still holds the entries of transfers it is draining.
  for (const auto& each : impl_->generations) {
    (void)each->shared->channel.push(internal::RemovePeerMessage{client_id});
  }
}

Status FabricService::pin(std::uintptr_t base, std::size_t length) {
  if (length == 0) return fail(ErrorCode::kInvalidArgument, "cannot register 0 bytes");
  if (base + length < base) {
    return fail(ErrorCode::kInvalidArgument, "registered range overflows the address space");
  }
  DMA_TRY(impl_->refuse_reentry());
  auto [answer, waiting] = internal::one_shot<Status>();
  Generation* asked = impl_->current.load(std::memory_order_acquire);
  if (!asked->shared->channel.push(internal::RegisterMessage{base, length, std::move(answer)})) {
    return fail(ErrorCode::kWorkerGone, "fabric worker is gone");
  }
  bool timed_out = false;
  std::optional<Status> pinned = waiting.wait_for(impl_->answer_bound(), timed_out);
  if (timed_out) return fail(ErrorCode::kTimedOut, "the fabric worker did not register in time");
  if (!pinned) return fail(ErrorCode::kWorkerGone, "fabric worker exited before registering");
  if (*pinned) {
    std::lock_guard lock(impl_->mutex);
    impl_->pins.emplace_back(base, length);
    // As in add_peer: a replacement since the push did not know this pin.
    if (Generation* now = impl_->current.load(std::memory_order_relaxed); now != asked) {
      auto [replayed, unused] = internal::one_shot<Status>();
      (void)now->shared->channel.push(
          internal::RegisterMessage{base, length, std::move(replayed)});
    }
  }
  return std::move(*pinned);
}

}  // namespace dma
