#include "fabric/peer_process.hpp"

#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>

namespace dma::internal {
namespace {

int open_pidfd(long pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(::syscall(SYS_pidfd_open, static_cast<pid_t>(pid), 0));
#else
  (void)pid;
  errno = ENOSYS;
  return -1;
#endif
}

}  // namespace

PeerProcess::PeerProcess(const ShmOwner& owner, std::span<const std::uint8_t> address)
    : pid_(owner.pid) {
  pidfd_ = open_pidfd(pid_);
  if (pidfd_ < 0 && errno == ESRCH) {
    exited_ = true;
    return;
  }
  // Read after the pidfd is open: if the start time matches now, the pidfd names the
  // incarnation that advertised the address (a pid recycled before the open shows another
  // start time). A zombie has no start time here: it has exited.
  const std::optional<std::uint64_t> started = process_start_time(pid_);
  if (!started || (owner.start_time && *started != *owner.start_time)) exited_ = true;
  // Mapped after the incarnation check: the mark's name carries the start time too, and it
  // must have been made by the pid the address names.
  if (!exited_ && !address.empty()) watch_ = LivenessWatch::open(address, owner);
}

std::optional<bool> PeerProcess::exited_by_mark() const {
  if (!watch_) return std::nullopt;
  switch (watch_->state()) {
    case LivenessWatch::State::kAlive:
      return false;
    case LivenessWatch::State::kDead:
      exited_ = true;
      return true;
    case LivenessWatch::State::kUnknown:
      break;
  }
  return std::nullopt;
}

PeerProcess::~PeerProcess() {
  if (pidfd_ >= 0) ::close(pidfd_);
}

bool PeerProcess::exited(std::chrono::steady_clock::time_point now,
                         std::chrono::steady_clock::duration max_age) const {
  if (exited_) return true;
  if (const std::optional<bool> marked = exited_by_mark()) return *marked;
  if (asked_ && now - asked_at_ < max_age) return false;
  asked_ = true;
  asked_at_ = now;
  return exited();
}

bool PeerProcess::exited_for_batch(std::uint64_t taken, std::uint64_t current) const {
  if (exited_) return true;
  if (const std::optional<bool> marked = exited_by_mark()) return *marked;
  if (asked_in_batch_ != 0 && asked_in_batch_ >= taken) return false;
  asked_in_batch_ = current;
  return exited();
}

bool PeerProcess::exited() const {
  if (exited_) return true;
  if (pidfd_ >= 0) {
    // A pidfd polls readable once its process has terminated (pidfd_open(2)).
    pollfd watch{pidfd_, POLLIN, 0};
    exited_ = ::poll(&watch, 1, 0) > 0;
  } else {
    exited_ = ::kill(static_cast<pid_t>(pid_), 0) != 0 && errno == ESRCH;
  }
  return exited_;
}

}  // namespace dma::internal
