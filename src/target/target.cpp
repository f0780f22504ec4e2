#include "dma/target.hpp"

#include <array>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>

#include "fabric/endpoint.hpp"
#include "fabric/peer_addresses.hpp"

namespace dma {

using internal::Endpoint;
using internal::Lease;

struct Target::Impl {
  // Serialises every call into the endpoint (FI_THREAD_DOMAIN): the progress thread's polls,
  // registrations, address inserts and, through DeferredCloses, closes.
  std::mutex mutex;
  std::unique_ptr<Endpoint> endpoint;
  std::vector<fi_addr_t> initiators;
  std::vector<std::uint8_t> address;
  Options options;
  std::atomic<bool> running{true};
  std::mutex sleep_mutex;
  std::condition_variable stop;
  std::thread progress;

  void run() {
    std::array<fi_cq_entry, 16> entries;
    while (running.load(std::memory_order_acquire)) {
      {
        std::lock_guard lock(mutex);
        // Drives the provider's progress (connection setup, read responses, delivery-complete
        // acknowledgements). Entries here are our own sends, if any; nothing needs them.
        ssize_t count = fi_cq_read(endpoint->completion_queue(), entries.data(), entries.size());
        if (count == -FI_EAVAIL) {
          fi_cq_err_entry failure{};
          fi_cq_readerr(endpoint->completion_queue(), &failure, 0);
        }
      }
      // A zero interval busy-polls (waiting on a condition variable, even for zero time, still
      // takes a futex round trip and gives up the CPU).
      if (options.poll_interval.count() == 0) {
        std::this_thread::yield();  // lets a caller waiting on `mutex` in
        continue;
      }
      std::unique_lock lock(sleep_mutex);
      stop.wait_for(lock, options.poll_interval,
                    [&] { return !running.load(std::memory_order_acquire); });
    }
  }
};

struct Exposed::Handle {
  Target::Impl* target;
  Lease lease;
  ~Handle() {
    // Closed under the target's lock: the progress thread may be inside the provider.
    std::lock_guard lock(target->mutex);
    lease.reset();
  }
};

Exposed::Exposed(std::unique_ptr<Handle> handle, Advertisement advertisement, std::byte* data,
                 std::size_t length)
    : handle_(std::move(handle)),
      advertisement_(std::move(advertisement)),
      data_(data),
      length_(length) {}
Exposed::Exposed(Exposed&&) noexcept = default;
Exposed& Exposed::operator=(Exposed&&) noexcept = default;
Exposed::~Exposed() = default;

Result<std::unique_ptr<Target>> Target::open(const Configuration& configuration,
                                             const std::string& domain) {
  return open(configuration, domain, Options{});
}

Result<std::unique_ptr<Target>> Target::open(const Configuration& configuration,
                                             const std::string& domain, Options options) {
  auto impl = std::make_unique<Impl>();
  // Every thread that touches the endpoint holds impl->mutex, so a region may be closed on
  // whichever of them drops its last lease: the domain has no single owner thread.
  DMA_TRY_ASSIGN(impl->endpoint, Endpoint::open(configuration, internal::Role::kTarget, domain,
                                                internal::DomainOwner::any_thread()));
  impl->address = impl->endpoint->local_address();
  impl->options = options;
  Impl* raw = impl.get();
  try {
    impl->progress = std::thread([raw] {
      pthread_setname_np(pthread_self(), "dma-target");
      raw->run();
    });
  } catch (const std::system_error& error) {
    // std::thread reports a failed pthread_create (EAGAIN: the thread limit) by throwing; the
    // endpoint closes with `impl`, which no other thread has seen.
    return fail(ErrorCode::kResourceExhausted,
                std::string("cannot start the target's progress thread: ") + error.what());
  }
  return std::unique_ptr<Target>(new Target(std::move(impl)));
}

Target::Target(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Target::~Target() {
  impl_->running.store(false, std::memory_order_release);
  {
    std::lock_guard lock(impl_->sleep_mutex);
  }
  impl_->stop.notify_all();
  impl_->progress.join();
  std::lock_guard lock(impl_->mutex);
  impl_->endpoint.reset();
}

std::span<const std::uint8_t> Target::local_address() const noexcept { return impl_->address; }
const EndpointDescription& Target::describe() const noexcept {
  return impl_->endpoint->describe();
}

Result<Exposed> Target::expose(void* data, std::size_t length) {
  if (data == nullptr) return fail(ErrorCode::kInvalidArgument, "cannot expose a null buffer");
  std::lock_guard lock(impl_->mutex);
  DMA_TRY_ASSIGN(Lease lease, impl_->endpoint->register_memory(
                                  reinterpret_cast<std::uintptr_t>(data), length,
                                  FI_REMOTE_READ | FI_REMOTE_WRITE));
  Advertisement advertisement;
  advertisement.address = impl_->address;
  advertisement.key = lease->key();
  advertisement.remote_address =
      impl_->endpoint->virtual_addresses() ? reinterpret_cast<std::uint64_t>(data) : 0;
  auto handle = std::make_unique<Exposed::Handle>();
  handle->target = impl_.get();
  handle->lease = std::move(lease);
  return Exposed(std::move(handle), std::move(advertisement), static_cast<std::byte*>(data),
                 length);
}

void Target::synchronize() {
  std::lock_guard lock(impl_->mutex);
  std::array<fi_cq_entry, 16> entries;
  if (fi_cq_read(impl_->endpoint->completion_queue(), entries.data(), entries.size()) ==
      -FI_EAVAIL) {
    fi_cq_err_entry failure{};
    fi_cq_readerr(impl_->endpoint->completion_queue(), &failure, 0);
  }
}

Status Target::add_initiator(std::span<const std::uint8_t> address) {
  std::lock_guard lock(impl_->mutex);
  const auto format = internal::address_format_from(impl_->endpoint->info()->addr_format);
  DMA_TRY(internal::identity_length(format, address));
  DMA_TRY(internal::check_address(impl_->endpoint->info()->addr_format, address));
  fi_addr_t handle = FI_ADDR_NOTAVAIL;
  const int inserted =
      fi_av_insert(impl_->endpoint->address_vector(), address.data(), 1, &handle, 0, nullptr);
  if (inserted != 1) {
    return fail(inserted < 0 ? internal::fabric_error("fi_av_insert", inserted)
                             : Error(ErrorCode::kFabric, "fi_av_insert inserted 0 addresses"));
  }
  impl_->initiators.push_back(handle);
  return {};
}

}  // namespace dma
