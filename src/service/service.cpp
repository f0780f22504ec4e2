#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <system_error>
#include <thread>

#include "dma/service.hpp"
#include "fabric/endpoint.hpp"
#include "worker/one_shot.hpp"
#include "worker/service_shared.hpp"
#include "worker/worker.hpp"

namespace dma {

using internal::Answer;
using internal::ServiceShared;
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
    DMA_TRY_ASSIGN(pool, Pool::create(configuration.crc_threads));
  }
  auto impl = std::make_unique<Impl>();
  impl->shared = std::make_shared<ServiceShared>();
  impl->shared->complete_batch = std::move(complete_batch);
  impl->shared->pool = std::move(pool);

  auto [ready, waiting] = internal::one_shot<Result<Opened>>();
  const unsigned index = next_worker_index.fetch_add(1, std::memory_order_relaxed);
  try {
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
  } catch (const std::system_error& error) {
    // std::thread reports a failed pthread_create (EAGAIN: the thread limit) by throwing;
    // nothing throws across this API. The lambda (and `ready` with it) is gone unrun.
    return fail(ErrorCode::kResourceExhausted,
                std::string("cannot start the fabric worker thread: ") + error.what());
  }
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
  DMA_TRY(impl_->refuse_reentry());
  DMA_TRY_ASSIGN(const FabricAddress inline_address, FabricAddress::from(address));
  auto [answer, waiting] = internal::one_shot<Status>();
  if (!impl_->shared->channel.push(
          internal::AddPeerMessage{client_id, inline_address, std::move(answer)})) {
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
  DMA_TRY(impl_->refuse_reentry());
  auto [answer, waiting] = internal::one_shot<Status>();
  if (!impl_->shared->channel.push(internal::RegisterMessage{base, length, std::move(answer)})) {
    return fail(ErrorCode::kWorkerGone, "fabric worker is gone");
  }
  std::optional<Status> pinned = waiting.wait();
  if (!pinned) return fail(ErrorCode::kWorkerGone, "fabric worker exited before registering");
  return std::move(*pinned);
}

}  // namespace dma
