#include "dma/target.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>

#include "fabric/endpoint.hpp"
#include "fabric/liveness_mark.hpp"
#include "fabric/peer_addresses.hpp"
#include "fabric/peer_process.hpp"
#include "fabric/shm_regions.hpp"

namespace dma {
namespace {
// A hint to the core that this is a spin-wait (x86 PAUSE, AArch64 YIELD).
inline void spin_pause() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}
}  // namespace

using internal::Endpoint;
using internal::Lease;

// How many times (one sched_yield each) the progress thread lets waiting callers go first
// before it polls anyway.
constexpr int kMaxDeferrals = 64;
// After a ring of its doorbell (shm), how long the progress thread polls on (yielding between
// polls) before it sleeps again: a transfer that follows within it needs no FUTEX_WAKE.
constexpr std::chrono::microseconds kDoorbellLinger{50};
// The longest an idle progress thread sleeps between polls (unless poll_interval is longer):
// its sleep doubles from poll_interval after each one that nothing cut short. A timed wake
// costs ~15-20 us of CPU on the project VM, so polling every 50 us (~120 us with the timer
// slack) took 15 % of a core from an idle client (`dma-cli target`, 77-82 ticks in 5 s). No
// transfer waits for these polls: on shm our initiators ring the doorbell, which resets the
// interval (one that does not ring, raw libfabric, waits up to this long after an idle spell);
// on tcp and net the provider's own progress thread moves the bytes (FI_PROGRESS_AUTO,
// docs/PROVIDERS.md, "Progress").
constexpr std::chrono::microseconds kIdleInterval{10000};
// shm with a mark, spinning (a zero poll_interval): the longest the progress thread waits for a
// ring before it polls anyway, for initiators that do not ring (raw libfabric) and anything
// else that needs the provider's progress unannounced (shm re-signals its own region when it
// cannot answer a command yet). 1 us instead: 64 B reads at depth 64 fell back from 1.34-1.40 to
// 1.01-1.04 of raw libfabric, 1 MiB writes gained 2-5 % (docs/PERFORMANCE.md, "Speed, fifteenth
// pass").
constexpr std::chrono::microseconds kUnrungPoll{5};

struct Target::Impl {
  // Serialises every call into the endpoint (FI_THREAD_DOMAIN): the progress thread's polls,
  // registrations, address inserts and, through DeferredCloses, closes. Callers take it through
  // CallerLock, which lets a busy-polling progress thread know to step aside.
  std::mutex mutex;
  std::unique_ptr<Endpoint> endpoint;
  std::vector<fi_addr_t> initiators;
  std::vector<std::uint8_t> address;
  Options options;
  std::atomic<bool> running{true};
  std::atomic<int> busy{0};     // live Busy tokens
  std::atomic<int> callers{0};  // callers waiting for or holding `mutex`
  std::atomic<std::uint32_t> own_rings{0};  // rings of our own doorbell by this process
  std::atomic<std::int64_t> expect_until_ns{0};  // Target::expect: poll on until then
  bool polls_for_writes = false;  // Target::expect: whose progress serves which transfers
  bool polls_for_reads = false;
  std::atomic<std::uint64_t> polls{0};
  std::mutex sleep_mutex;
  std::condition_variable wake;
  // shm: held by the progress thread while it runs, so initiators read our liveness from
  // shared memory instead of polling our pidfd per transfer (liveness_mark.hpp).
  std::unique_ptr<internal::LivenessMark> mark;
  // shm: the processes behind the initiators' addresses (initiator_exited), by address. Its
  // own lock: a question about a process never waits for the endpoint.
  mutable std::mutex watches_mutex;
  std::vector<std::pair<std::vector<std::uint8_t>, std::unique_ptr<internal::PeerProcess>>>
      watches;
  std::thread progress;

  // One progress poll; the caller holds `mutex`.
  void poll_locked() {
    std::array<fi_cq_entry, 16> entries;
    // Only this thread writes the count: a load and a store, not a locked read-modify-write.
    polls.store(polls.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    // Drives the provider's progress (connection setup, read responses, delivery-complete
    // acknowledgements). Entries here are our own sends, if any; nothing needs them.
    const ssize_t count =
        fi_cq_read(endpoint->completion_queue(), entries.data(), entries.size());
    if (count == -FI_EAVAIL) {
      fi_cq_err_entry failure{};
      fi_cq_readerr(endpoint->completion_queue(), &failure, 0);
    }
  }

  bool spinning() const noexcept {
    return options.poll_interval.count() == 0 || busy.load(std::memory_order_seq_cst) > 0;
  }
  // Within a Target::expect window.
  bool expecting() const noexcept {
    const std::int64_t until = expect_until_ns.load(std::memory_order_acquire);
    return until != 0 && std::chrono::steady_clock::now().time_since_epoch().count() < until;
  }

  void run() {
    // Held across polls while spinning with a zero interval: locking and unlocking around
    // every poll was a quarter of this thread's time on shm at 64 B (perf, issue 10), and the
    // raw loop it races takes no lock at all. It is let go whenever a caller is waiting.
    if (mark) mark->hold();
    std::unique_lock lock(mutex, std::defer_lock);
    Doorbell doorbell;
    if (mark) peer_rang(doorbell);
    // The current sleep between polls: poll_interval, doubled after each sleep that nothing
    // cut short, up to kIdleInterval (see there).
    std::chrono::microseconds idle = options.poll_interval;
    const std::chrono::microseconds most_idle = std::max(options.poll_interval, kIdleInterval);
    while (running.load(std::memory_order_acquire)) {
      if (callers.load(std::memory_order_acquire) > 0) {
        if (lock.owns_lock()) lock.unlock();
        // A std::mutex is not fair: re-locking at once would keep a waiting caller out for
        // as long as we spin. Let it in first, but only for so long: a caller that locks again
        // and again (expose() in a loop) must not starve progress either.
        for (int deferred = 0; deferred < kMaxDeferrals &&
                               callers.load(std::memory_order_acquire) > 0 &&
                               running.load(std::memory_order_relaxed);
             ++deferred) {
          std::this_thread::yield();
        }
      }
      if (!lock.owns_lock()) lock.lock();
      // A zero interval means a core of its own: straight back to the poll, lock held (no
      // syscall; a condition variable's wait, even for zero time, is a futex round trip).
      if (options.poll_interval.count() == 0 && mark) {
        const std::uint32_t rings = mark->rings();
        poll_locked();
        spin_until_rung(rings);
        continue;
      }
      poll_locked();
      if (options.poll_interval.count() == 0) continue;
      lock.unlock();
      // Busy, or within an expect() window: poll again at once, but yield the CPU in between.
      // Several clients each waiting for a reply on a small machine would otherwise spin the
      // server they wait for off the cores (measured: 4 clients on 2 cores, DMA.GET 4 KiB fell
      // to 0.03x of GET).
      if (busy.load(std::memory_order_acquire) > 0 || expecting()) {
        idle = options.poll_interval;
        std::this_thread::yield();
        continue;
      }
      bool woken = false;
      if (mark) {
        woken = rest_by_doorbell(lock, doorbell, idle);
      } else {
        std::unique_lock sleeping(sleep_mutex);
        woken = wake.wait_for(sleeping, idle, [&] {
          return !running.load(std::memory_order_acquire) || spinning() || expecting();
        });
      }
      idle = woken ? options.poll_interval : std::min(idle * 2, most_idle);
    }
    if (mark) mark->release();
  }

  // shm with a mark, spinning: waits, without a syscall, until the doorbell's count moves from
  // `rings` (read before the last poll, so a post rung during that poll is polled for again),
  // a caller wants the endpoint, the target stops, or kUnrungPoll has passed. Each poll of shm
  // compare-exchanges the signal word of our region, on the cache line of the lock that every
  // post to us must take: polled flat out, that line left the initiator's core between every
  // two of its posts, and 64 B reads at depth 64 ran at 0.82-0.87 of raw libfabric's.
  // Our initiators ring after each write and every kReadsPerRing reads (poster.hpp); a read
  // that shm copied inside fi_read needs nothing of us but the draining of its notice.
  void spin_until_rung(std::uint32_t rings) {
    const auto deadline = std::chrono::steady_clock::now() + kUnrungPoll;
    for (std::uint32_t turn = 1;; ++turn) {
      if (mark->rings() != rings || callers.load(std::memory_order_acquire) > 0 ||
          !running.load(std::memory_order_acquire)) {
        return;
      }
      // A clock read every 8 pauses, not every one.
      if (turn % 8 == 0 && std::chrono::steady_clock::now() >= deadline) return;
      spin_pause();
    }
  }

  // What the progress thread last saw of its doorbell, and until when it polls on after a ring.
  struct Doorbell {
    std::uint32_t seen = 0;      // the doorbell's count
    std::uint32_t own_seen = 0;  // own_rings
    std::chrono::steady_clock::time_point linger_until{};
  };

  // Whether an initiator rang since the last look: the count moved by more than our own rings
  // (a Busy token, the destructor), which only wake the thread and must not make it linger.
  bool peer_rang(Doorbell& doorbell) {
    const std::uint32_t own = own_rings.load(std::memory_order_seq_cst);
    const std::uint32_t rings = mark->rings();
    const bool rang = rings - doorbell.seen != own - doorbell.own_seen;
    doorbell.seen = rings;
    doorbell.own_seen = own;
    return rang;
  }

  // Wakes the progress thread from either sleep (a Busy token, an expect() window): under
  // sleep_mutex, so the wake cannot fall between its check and its wait; a doorbell sleep is
  // woken by a ring.
  void wake_progress() {
    { std::lock_guard lock(sleep_mutex); }
    wake.notify_all();
    ring_own();
  }

  // Wakes the progress thread from a doorbell sleep (wake_progress, the destructor).
  void ring_own() {
    if (!mark) return;
    own_rings.fetch_add(1, std::memory_order_seq_cst);
    mark->ring();
  }

  // shm with a mark (liveness_mark.hpp, "doorbell"), between two polls: sleeps until a ring or
  // `interval`, whichever comes first, except within kDoorbellLinger of the last ring, when it
  // only yields: back-to-back transfers then pay no futex call on either side. `lock` is the
  // endpoint lock, not held on entry or exit. True if a ring or a Busy token (or the stop)
  // cut it short, or it only yielded.
  bool rest_by_doorbell(std::unique_lock<std::mutex>& lock, Doorbell& doorbell,
                        std::chrono::microseconds interval) {
    const auto now = std::chrono::steady_clock::now();
    if (peer_rang(doorbell)) doorbell.linger_until = now + kDoorbellLinger;
    if (now < doorbell.linger_until) {
      std::this_thread::yield();
      return true;
    }
    const std::uint32_t seen = mark->prepare_to_sleep();
    // A transfer posted before `seen` was read is found by this poll; one posted after moves
    // the count, so the sleep below returns at once or is woken.
    lock.lock();
    poll_locked();
    lock.unlock();
    // A Busy token or an expect() window that came after the loop's check rang before this
    // sleep: the sleep must not start.
    const bool stay_awake = !running.load(std::memory_order_seq_cst) || spinning() || expecting();
    mark->sleep(seen, stay_awake ? std::chrono::nanoseconds(0) : interval);
    if (peer_rang(doorbell)) {
      doorbell.linger_until = std::chrono::steady_clock::now() + kDoorbellLinger;
      return true;
    }
    return stay_awake || spinning();
  }
};

namespace {

// The endpoint lock, taken by a caller (not the progress thread).
class CallerLock {
 public:
  explicit CallerLock(Target::Impl& impl) : impl_(impl) {
    impl_.callers.fetch_add(1, std::memory_order_acq_rel);
    impl_.mutex.lock();
  }
  ~CallerLock() {
    impl_.mutex.unlock();
    impl_.callers.fetch_sub(1, std::memory_order_acq_rel);
  }
  CallerLock(const CallerLock&) = delete;
  CallerLock& operator=(const CallerLock&) = delete;

 private:
  Target::Impl& impl_;
};

}  // namespace

struct Exposed::Handle {
  Target::Impl* target;
  Lease lease;
  ~Handle() {
    // Closed under the target's lock: the progress thread may be inside the provider.
    CallerLock lock(*target);
    // One poll first. On tcp and net the provider's own thread sends a read's bytes out of
    // this memory, and the caller learns they arrived only through its RPC reply, which no
    // race detector sees. The poll takes the locks that thread held while it sent, so the
    // order is visible to ThreadSanitizer too (without it, an idle-backed-off target left
    // Module.a_crc_mismatch_* and Module.multi_region_* reporting the caller's free as a race).
    target->poll_locked();
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
  impl->mark = internal::LivenessMark::create(impl->address);
  const std::string& provider = impl->endpoint->describe().provider;
  impl->polls_for_writes = provider == "shm";
  impl->polls_for_reads = provider == "tcp;ofi_rxm" || provider == "net";
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
  impl_->running.store(false, std::memory_order_seq_cst);
  {
    std::lock_guard lock(impl_->sleep_mutex);
  }
  impl_->wake.notify_all();
  impl_->ring_own();  // it may sleep on its doorbell instead
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
  CallerLock lock(*impl_);
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
  CallerLock lock(*impl_);
  std::array<fi_cq_entry, 16> entries;
  if (fi_cq_read(impl_->endpoint->completion_queue(), entries.data(), entries.size()) ==
      -FI_EAVAIL) {
    fi_cq_err_entry failure{};
    fi_cq_readerr(impl_->endpoint->completion_queue(), &failure, 0);
  }
}

Target::Busy Target::busy() {
  // The first token wakes the progress thread if it sleeps.
  if (impl_->busy.fetch_add(1, std::memory_order_seq_cst) == 0) impl_->wake_progress();
  return Busy(this);
}

bool Target::expect(Expected what, std::chrono::microseconds window) {
  if (what == Expected::kWrite ? !impl_->polls_for_writes : !impl_->polls_for_reads) return false;
  const auto until = std::chrono::steady_clock::now() + window;
  impl_->expect_until_ns.store(
      std::chrono::duration_cast<std::chrono::nanoseconds>(until.time_since_epoch()).count(),
      std::memory_order_release);
  impl_->wake_progress();
  return true;
}

std::uint64_t Target::progress_polls() const noexcept {
  return impl_->polls.load(std::memory_order_relaxed);
}

Target::Busy& Target::Busy::operator=(Busy&& other) noexcept {
  if (this != &other) {
    Busy dropped(std::move(*this));
    target_ = std::exchange(other.target_, nullptr);
  }
  return *this;
}

Target::Busy::~Busy() {
  if (target_ != nullptr) target_->impl_->busy.fetch_sub(1, std::memory_order_acq_rel);
}

Status Target::add_initiator(std::span<const std::uint8_t> address) {
  CallerLock lock(*impl_);
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
  if (impl_->endpoint->describe().provider == "shm") {
    if (const auto owner = internal::shm_address_owner(address)) {
      const std::lock_guard watching(impl_->watches_mutex);
      // A client says hello again after a replacement: one watch per address is enough.
      const bool watched = std::any_of(
          impl_->watches.begin(), impl_->watches.end(), [&](const auto& watch) {
            return std::equal(watch.first.begin(), watch.first.end(), address.begin(),
                              address.end());
          });
      if (!watched) {
        impl_->watches.emplace_back(std::vector<std::uint8_t>(address.begin(), address.end()),
                                    std::make_unique<internal::PeerProcess>(*owner, address));
      }
    }
  }
  return {};
}

bool Target::initiator_exited(std::span<const std::uint8_t> address) const {
  const std::lock_guard watching(impl_->watches_mutex);
  for (const auto& [watched, process] : impl_->watches) {
    if (std::equal(watched.begin(), watched.end(), address.begin(), address.end())) {
      return process->exited();
    }
  }
  return false;
}

}  // namespace dma
