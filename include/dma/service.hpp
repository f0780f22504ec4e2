// FabricService: the server side. One worker thread per endpoint keeps many one-sided RMAs in
// flight against clients' exposed buffers: fi_writemsg with FI_DELIVERY_COMPLETE for a GET
// (Direction::kToPeer), fi_read for a SET (Direction::kFromPeer).
//
// Ownership: the service owns its worker thread and, through it, every libfabric object of its
// endpoint. Thread-safety: every public member may be called from any thread, except that the
// blocking calls (add_peer, register_memory, start) must not be made from inside a completion
// callback of the same service (they would wait on the thread that is running the callback; they
// fail with kInvalidArgument instead of deadlocking).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <coroutine>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dma/export.hpp"
#include "dma/configuration.hpp"
#include "dma/fabric.hpp"
#include "dma/memory.hpp"
#include "dma/pool.hpp"
#include "dma/result.hpp"

namespace dma {

// Which way the bytes go in a server-initiated RMA.
enum class Direction : std::uint8_t {
  kToPeer,    // fi_writemsg local -> peer (a GET): sends Operands::source()
  kFromPeer,  // fi_read peer -> local (a SET): fills Operands::allocate(length)
};

// The result of a finished transfer.
struct TransferDone {
  std::size_t bytes = 0;                // how many bytes moved
  std::optional<std::uint32_t> checksum;  // CRC32C of the local operand, if asked for
};
using Outcome = Result<TransferDone>;

// The caller's per-transfer context: it supplies the local operand and comes back in the
// Completion. Its methods run on the service's worker thread, once each, and must not block.
class DMA_EXPORT Operands {
 public:
  virtual ~Operands() = default;
  // kToPeer: the bytes to write. Must stay valid and unchanged until the completion. An empty
  // span fails the transfer ("no source").
  virtual std::span<const std::byte> source() { return {}; }
  // kFromPeer: at least `length` writable bytes to read into, valid until the completion. A
  // shorter span fails the transfer.
  virtual std::span<std::byte> allocate(std::size_t /*length*/) { return {}; }
  // The stable extent containing the operand, if the caller knows one; the service then
  // registers the whole extent once and reuses it (see CacheableSpan).
  virtual std::optional<CacheableSpan> cacheable_span() { return std::nullopt; }
  // Called with the outcome just before the completion would go to the batch completer, on the
  // thread completing it. Return true to consume it here (it then skips the batch completer and
  // this object is destroyed). The Transfer handle is built on this.
  virtual bool on_complete(Outcome& /*outcome*/) { return false; }
  // Called once when a posted transfer has had no completion for
  // Configuration::completion_deadline (a peer that died after the post; shm's bad
  // delivery-complete write, which never completes): `error` is kTimedOut. Also when its
  // endpoint is replaced (kFabric, "endpoint replaced: ...") or a bounded shutdown gives up on
  // it (kWorkerGone); then possibly on the service's watchdog or shutdown thread rather than the
  // worker (a worker stuck inside the provider cannot call it). The transfer has failed, so
  // answer your client now, but do NOT free or reuse the operand: the provider
  // may still read or write it. This context is held until the provider lets go of the
  // operation (a late completion, or the endpoint closing at shutdown); its Completion, with the
  // same error, is delivered then. Must not block.
  virtual void on_expired(const Error& /*error*/) {}
};

// A submitted transfer.
struct DMA_EXPORT TransferRequest {
  // The caller's id for the peer (one per connected client). The worker holds its address-vector
  // entry under this id until remove_peer().
  std::uint64_t client_id = 0;
  // The peer's fabric address. Empty: use the entry add_peer() made for client_id. Otherwise it
  // is inserted (or shared) on first use, and a new address replaces the client's old one.
  FabricAddress peer_address;
  // The peer's exposed memory, in order.
  RemoteRegions regions;
  Direction direction = Direction::kToPeer;
  // kFromPeer: how many bytes to read. kToPeer: ignored (the source's size is used).
  std::size_t length = 0;
  // Compute CRC32C of the local operand into TransferDone::checksum: on the CRC pool; on the
  // worker for a lone transfer of at most Configuration::worker_checksum_max bytes while it has
  // nothing else to do; piece by piece as it lands for a larger one into one region.
  bool want_checksum = false;
  // Supplies the operand; handed back in the Completion. Required.
  std::unique_ptr<Operands> context;

  // Convenience for the common single-region case.
  static TransferRequest single(std::uint64_t client_id, FabricAddress peer, std::uint64_t key,
                                std::uint64_t remote_address, Direction direction,
                                std::size_t length, std::unique_ptr<Operands> context);
};

// A finished transfer: the caller's context and its outcome.
struct Completion {
  std::unique_ptr<Operands> context;
  Outcome outcome;
};

// Receives finished transfers in batches (one call per batch), on the worker thread or a pool
// thread. It must not block for long and must not call the service's blocking methods.
using BatchCompleter = std::function<void(std::span<Completion>)>;

// Counters a service keeps (read with relaxed atomics; approximate while running).
struct ServiceCounters {
  std::uint64_t submitted = 0;
  std::uint64_t completed = 0;
  std::uint64_t failed = 0;
  std::uint64_t bytes_to_peer = 0;
  std::uint64_t bytes_from_peer = 0;
  std::uint64_t eagain = 0;
  std::uint64_t expired = 0;  // transfers failed at the completion deadline
  // Error completions the provider reported without an operation context (shm, for writes to
  // a peer that died): their operations are failed by the completion deadline.
  std::uint64_t unattributed_errors = 0;
  // Endpoints replaced under the service (see FabricService, "Endpoint replacement").
  std::uint64_t replacements = 0;
  // Workers left behind: found stuck inside a libfabric call, or not drained by a bounded
  // shutdown. Their endpoints and the buffers they hold are never freed under the provider.
  std::uint64_t abandoned = 0;
};

class Transfer;

// Endpoint replacement. The service notices an endpoint that has stopped working and replaces
// it with a new one (a new address, on a new worker thread) under the same FabricService:
// - wedged: a transfer expires at the completion deadline with nothing of its direction
//   completed since it was posted and later ones stuck behind it (shm never completes a write
//   to a target that died, and completes an endpoint's writes in order);
// - stuck: the worker has not turned for Configuration::stuck_deadline while inside a libfabric
//   call (libfabric 1.17's shm can spin forever on a lock in a dead target's region); a
//   watchdog thread sees it, answers the callers of everything the worker holds, and leaves the
//   worker to it;
// - asked: replace_endpoint().
// Transfers the old endpoint held fail at once with kFabric "endpoint replaced: <reason>" (their
// Operands::on_expired is told; their contexts come back when the old endpoint closes at
// shutdown, or never if its worker never returns). Transfers still queued move to the new
// endpoint. Peers added with add_peer() and memory pinned with pin() (and not invalidated) are
// re-added and re-registered there before any transfer; generation() counts replacements and
// local_address() is the current endpoint's, so a server can tell its clients to learn the new
// address. All of it is logged to stderr, one line per event.
class DMA_EXPORT FabricService {
 public:
  // Opens the endpoint on a new worker thread and starts serving, blocking until the endpoint
  // is open or has failed to open. `domain` restricts the endpoint to one domain (see
  // discover_domains); empty means the configuration's first match. Checksummed completions run
  // on `pool`; the rest on the worker.
  static Result<std::unique_ptr<FabricService>> start(const Configuration& configuration,
                                                      BatchCompleter complete_batch,
                                                      std::shared_ptr<Pool> pool,
                                                      const std::string& domain = {});
  // shutdown(configuration.shutdown_deadline).
  ~FabricService();
  // Stops intake, finishes what is in flight, fails what was never posted with kWorkerGone,
  // delivers every completion, then closes the endpoints, within `bound`: at three quarters of
  // it what is still in flight fails (kWorkerGone) and is held until its endpoint closes; a
  // worker still not done at `bound` (stuck inside the provider) is left running, counted in
  // `abandoned`, and its transfers get no completion. True if every worker finished. Idempotent
  // (later calls return the first answer).
  bool shutdown(std::chrono::milliseconds bound);
  FabricService(const FabricService&) = delete;
  FabricService& operator=(const FabricService&) = delete;

  // The endpoint's fabric address (fi_getname). Clients insert it into their own address vector
  // (efa-direct requires the target to know its initiator).
  // The current endpoint's (they change when it is replaced).
  std::vector<std::uint8_t> local_address() const;
  EndpointDescription describe() const;
  // Endpoints replaced so far: 0 until the first replacement.
  std::uint64_t generation() const noexcept;
  // Replaces the endpoint now, as the health checks would (operators, tests). Blocks until the
  // new endpoint is open; the old one's transfers fail with "endpoint replaced: <reason>".
  Status replace_endpoint(std::string_view reason);
  // Transfers submitted and not yet completed, queued and posted alike: the load signal.
  std::size_t outstanding() const noexcept;
  ServiceCounters counters() const noexcept;

  // Queues a transfer. On success the request has been moved from; on failure (the worker is
  // gone, or the request has no context) it is left untouched so the caller keeps its context.
  Status submit(TransferRequest&& request);
  // Queues a transfer whose outcome is waited on through the returned handle instead of the
  // batch completer.
  Result<Transfer> transfer(TransferRequest&& request);

  // Inserts `address` into the address vector for `client_id`, answered by the worker, so a
  // hello fails on an unusable address rather than its first transfer.
  Status add_peer(std::uint64_t client_id, std::span<const std::uint8_t> address);
  // Releases `client_id`'s entry once every transfer it submitted before this call has
  // finished. Best effort: with the worker gone the entry dies with the endpoint.
  void remove_peer(std::uint64_t client_id);

  // Registers caller storage on this service's domain, blocking until it is registered.
  // Transfers whose operands lie inside it then skip fi_mr_reg.
  template <typename S>
  Result<MemoryRegion<S>> register_memory(S storage) {
    auto owned = std::make_unique<S>(std::move(storage));
    const auto base = reinterpret_cast<std::uintptr_t>(owned->data());
    const std::size_t length = owned->size() * sizeof(*owned->data());
    Status pinned = pin(base, length);
    if (!pinned) return fail(std::move(pinned).error());
    return MemoryRegion<S>(std::move(owned), base, base + length);
  }

  // Registers [base, base + length) on this service's domain (what register_memory uses).
  // The caller must invalidate() it before the memory goes away.
  Status pin(std::uintptr_t base, std::size_t length);

  struct Impl;

 private:
  explicit FabricService(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// A handle on one transfer's outcome: wait on it (with a timeout) or co_await it. The coroutine
// resumes on the thread that completes the transfer (the worker or a pool thread): hop to your
// own executor before doing anything long. Movable; thread-safe.
class DMA_EXPORT Transfer {
 public:
  struct State;
  explicit Transfer(std::shared_ptr<State> state) : state_(std::move(state)) {}

  bool ready() const;
  // Blocks until the transfer completes.
  Outcome wait();
  // Blocks up to `timeout`; kTimedOut if the transfer has not completed by then (it carries on).
  Outcome wait_for(std::chrono::milliseconds timeout);
  // The context given to the request, once the provider has let go of it (else nullptr). A
  // transfer that failed at the completion deadline is ready() with kTimedOut before then: its
  // context comes back only when a late completion arrives or the service shuts down.
  std::unique_ptr<Operands> take_context();

  bool await_ready() const { return ready(); }
  bool await_suspend(std::coroutine_handle<> waiter);
  Outcome await_resume() { return wait(); }

 private:
  std::shared_ptr<State> state_;
};

// Several services, one per domain (or `per_domain` per domain), sharing one CRC pool. Routes
// each transfer to the least-loaded service by outstanding(); adds and removes peers and
// registers memory on all of them. Thread-safe like FabricService.
class DMA_EXPORT ServiceSet {
 public:
  // Opens every domain discover_domains() finds for the configuration's first provider that
  // opens (or only `configuration.interfaces`), `per_domain` services each.
  static Result<std::unique_ptr<ServiceSet>> start(const Configuration& configuration,
                                                   BatchCompleter complete_batch,
                                                   std::size_t per_domain = 1);
  // Builds a set from services already started (they should share `pool`).
  static std::unique_ptr<ServiceSet> from(std::vector<std::unique_ptr<FabricService>> services,
                                          std::shared_ptr<Pool> pool);

  std::size_t size() const noexcept { return services_.size(); }
  FabricService& at(std::size_t index) { return *services_.at(index); }
  // The service with the fewest outstanding transfers (ties: the lowest index after the last
  // pick, so equal loads rotate).
  FabricService& least_loaded();
  // The index least_loaded() would return.
  std::size_t least_loaded_index();
  // Every service's address, in order.
  std::vector<std::vector<std::uint8_t>> local_addresses() const;
  // The sum of the services' generation(): changes whenever any endpoint is replaced.
  std::uint64_t generation() const noexcept;
  // Shuts every service down at once within one `bound` (FabricService::shutdown); true if
  // every worker finished.
  bool shutdown(std::chrono::milliseconds bound);

  Status submit(TransferRequest&& request) { return least_loaded().submit(std::move(request)); }
  // Adds on every service; if any fails, the peer is removed from those that succeeded.
  Status add_peer(std::uint64_t client_id, std::span<const std::uint8_t> address);
  void remove_peer(std::uint64_t client_id);
  // Registers on every service; the region retires all of them when it goes.
  Status pin(std::uintptr_t base, std::size_t length);

 private:
  ServiceSet(std::vector<std::unique_ptr<FabricService>> services, std::shared_ptr<Pool> pool)
      : pool_(std::move(pool)), services_(std::move(services)) {}
  std::shared_ptr<Pool> pool_;
  std::vector<std::unique_ptr<FabricService>> services_;
  std::atomic<std::size_t> next_{0};
};

}  // namespace dma
