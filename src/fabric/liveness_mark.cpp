#include "fabric/liveness_mark.hpp"

#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <new>
#include <string_view>

namespace dma::internal {

// The file's contents. `mutex` is a glibc pthread_mutex_t; its first int (__data.__lock) is the
// futex word the kernel's robust-list handling rewrites (glibc's x86-64 and aarch64 ABI, fixed
// since robust mutexes exist).
// `doorbell` and `sleeping` are the doorbell (liveness_mark.hpp), on a cache line of their own
// so that rings do not bounce the mutex's line; both are read and written with __atomic
// builtins (sequentially consistent), `doorbell` is a futex word shared between processes.
struct LivenessMark::Shared {
  std::uint64_t magic;
  std::int64_t pid;
  pthread_mutex_t mutex;
  alignas(64) std::uint32_t doorbell;
  std::uint32_t sleeping;
};

namespace {
constexpr std::uint64_t kMagic = 0x646d612e6c697665ULL;  // "dma.live"
constexpr std::string_view kDirectory = "/dev/shm/";
static_assert(offsetof(pthread_mutex_t, __data.__lock) == 0);

int word_of(const pthread_mutex_t& mutex) noexcept {
  return __atomic_load_n(&mutex.__data.__lock, __ATOMIC_ACQUIRE);
}

// FUTEX_WAKE / FUTEX_WAIT without FUTEX_PRIVATE_FLAG: the word is shared between processes.
void wake_sleeper(std::uint32_t* word) noexcept {
  (void)::syscall(SYS_futex, word, FUTEX_WAKE, 1, nullptr, nullptr, 0);
}

// Increments the doorbell and wakes its sleeper if it said it sleeps. Sequentially consistent
// against the sleeper's (sleeping = 1, then read the doorbell): either this sees `sleeping` and
// wakes it, or the sleeper reads the new count and does not sleep on the old one.
void ring_bell(LivenessMark::Shared* shared) noexcept {
  __atomic_add_fetch(&shared->doorbell, 1U, __ATOMIC_SEQ_CST);
  if (__atomic_load_n(&shared->sleeping, __ATOMIC_SEQ_CST) != 0) wake_sleeper(&shared->doorbell);
}
}  // namespace

std::string liveness_file_name(std::span<const std::uint8_t> address) {
  constexpr std::string_view kScheme = "fi_shm://";
  std::string_view text(reinterpret_cast<const char*>(address.data()), address.size());
  while (!text.empty() && text.back() == '\0') text.remove_suffix(1);
  if (text.substr(0, kScheme.size()) != kScheme) return {};
  text.remove_prefix(kScheme.size());
  if (text.substr(0, 4) != "dma." || text.find('/') != std::string_view::npos) return {};
  return std::string(text) + ".live";
}

std::unique_ptr<LivenessMark> LivenessMark::create(std::span<const std::uint8_t> address) {
  const std::string name = liveness_file_name(address);
  if (name.empty()) return nullptr;
  const std::string path = std::string(kDirectory) + name;
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return nullptr;
  void* mapped = MAP_FAILED;
  if (::ftruncate(fd, sizeof(Shared)) == 0) {
    mapped = ::mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  ::close(fd);
  if (mapped == MAP_FAILED) {
    ::unlink(path.c_str());
    return nullptr;
  }
  auto* shared = new (mapped) Shared{};
  pthread_mutexattr_t attributes;
  pthread_mutexattr_init(&attributes);
  pthread_mutexattr_setpshared(&attributes, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&attributes, PTHREAD_MUTEX_ROBUST);
  const int made = pthread_mutex_init(&shared->mutex, &attributes);
  pthread_mutexattr_destroy(&attributes);
  if (made != 0) {
    ::munmap(mapped, sizeof(Shared));
    ::unlink(path.c_str());
    return nullptr;
  }
  shared->pid = ::getpid();
  // Last: a reader trusts the file only with the magic in place.
  __atomic_store_n(&shared->magic, kMagic, __ATOMIC_RELEASE);
  return std::unique_ptr<LivenessMark>(new LivenessMark(path, shared));
}

LivenessMark::~LivenessMark() {
  if (held_) release();
  ::unlink(path_.c_str());
  ::munmap(shared_, sizeof(Shared));
}

void LivenessMark::hold() {
  if (held_) return;
  held_ = pthread_mutex_lock(&shared_->mutex) == 0;
}

void LivenessMark::release() {
  if (!held_) return;
  pthread_mutex_unlock(&shared_->mutex);
  held_ = false;
}

std::uint32_t LivenessMark::prepare_to_sleep() noexcept {
  __atomic_store_n(&shared_->sleeping, 1U, __ATOMIC_SEQ_CST);
  return __atomic_load_n(&shared_->doorbell, __ATOMIC_SEQ_CST);
}

bool LivenessMark::sleep(std::uint32_t seen, std::chrono::nanoseconds timeout) noexcept {
  if (timeout.count() > 0 && __atomic_load_n(&shared_->doorbell, __ATOMIC_SEQ_CST) == seen) {
    const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(timeout);
    timespec relative{};
    relative.tv_sec = static_cast<time_t>(seconds.count());
    relative.tv_nsec = static_cast<long>((timeout - seconds).count());
    // Returns at a ring (FUTEX_WAKE), at once if the count moved since `seen` (EAGAIN), at the
    // timeout, or on a signal: each is only an early poll.
    (void)::syscall(SYS_futex, &shared_->doorbell, FUTEX_WAIT, seen, &relative, nullptr, 0);
  }
  __atomic_store_n(&shared_->sleeping, 0U, __ATOMIC_SEQ_CST);
  return __atomic_load_n(&shared_->doorbell, __ATOMIC_SEQ_CST) != seen;
}

std::uint32_t LivenessMark::rings() const noexcept {
  return __atomic_load_n(&shared_->doorbell, __ATOMIC_SEQ_CST);
}

void LivenessMark::ring() noexcept { ring_bell(shared_); }

std::unique_ptr<LivenessWatch> LivenessWatch::open(std::span<const std::uint8_t> address,
                                                   const ShmOwner& owner) {
  const std::string name = liveness_file_name(address);
  if (name.empty()) return nullptr;
  const std::string path = std::string(kDirectory) + name;
  // Writable for the doorbell; a file we may only read still tells liveness.
  bool writable = true;
  int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    writable = false;
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  }
  if (fd < 0) return nullptr;
  struct stat status {};
  void* mapped = MAP_FAILED;
  if (::fstat(fd, &status) == 0 && status.st_size >= static_cast<off_t>(sizeof(LivenessMark::Shared)) &&
      status.st_uid == ::getuid()) {
    mapped = ::mmap(nullptr, sizeof(LivenessMark::Shared),
                    writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
  }
  ::close(fd);
  if (mapped == MAP_FAILED) return nullptr;
  auto* shared = static_cast<LivenessMark::Shared*>(mapped);
  if (__atomic_load_n(&shared->magic, __ATOMIC_ACQUIRE) != kMagic || shared->pid != owner.pid) {
    ::munmap(mapped, sizeof(LivenessMark::Shared));
    return nullptr;
  }
  return std::unique_ptr<LivenessWatch>(new LivenessWatch(shared, writable));
}

LivenessWatch::~LivenessWatch() { ::munmap(shared_, sizeof(LivenessMark::Shared)); }

void LivenessWatch::ring() noexcept {
  if (writable_) ring_bell(shared_);
}

LivenessWatch::State LivenessWatch::state() const noexcept {
  const int word = word_of(shared_->mutex);
  if ((word & FUTEX_OWNER_DIED) != 0) return State::kDead;
  if ((word & FUTEX_TID_MASK) != 0) return State::kAlive;
  return State::kUnknown;
}

}  // namespace dma::internal
