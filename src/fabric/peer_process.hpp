// Private: whether the process behind a same-host (shm) peer address is still alive.
//
// libfabric 1.17's shm posts an RMA by taking a spinlock that lives in the *target's* shared
// region (smr_generic_rma), and the target holds that same lock while its own progress copies
// the operation's bytes. A target that dies while holding it (SIGKILL, OOM, a crash) leaves it
// held forever: every later fi_writemsg/fi_read to that region spins in pthread_spin_lock and
// never returns, so the worker thread that called it, and every transfer queued behind it,
// hangs (it failed a CI run: KilledTarget/shm, transfers after the kill never finished). No
// libfabric call can be interrupted, so the only defence is not to call: before posting to a
// shm peer the worker asks this watch whether the process that owns the address has exited,
// and fails the transfer instead.
//
// What is left (docs/RELIABILITY.md): a poster already spinning on the lock at the instant the
// target dies still spins forever; that is shm's to fix.
//
// Ownership: one per address-vector entry, used by the thread that owns the endpoint; not
// thread-safe. Holds a pidfd (pidfd_open(2)): it names one incarnation of the pid, so a pid the
// kernel recycles for another process is not mistaken for the peer.
#pragma once

#include <chrono>
#include <optional>
#include <cstdint>
#include <memory>
#include <span>

#include "fabric/liveness_mark.hpp"
#include "fabric/shm_regions.hpp"

namespace dma::internal {

class PeerProcess {
 public:
  // Watches `owner`. If it is already gone (no such process, a zombie, or a pid whose start
  // time is not the one advertised), exited() is true from the start.
  // With the peer's `address`, also maps its liveness mark if it has one (liveness_mark.hpp):
  // then the timed and per-batch questions are answered by a load while the mark shows its
  // holder, and ask the pidfd only when it shows nobody.
  explicit PeerProcess(const ShmOwner& owner, std::span<const std::uint8_t> address = {});
  ~PeerProcess();
  PeerProcess(const PeerProcess&) = delete;
  PeerProcess& operator=(const PeerProcess&) = delete;

  // True once the process has exited (it stays true). One poll(2) on the pidfd, asked afresh
  // every time. Without pidfd support (kernel older than 5.3, or a seccomp
  // profile refusing it) it falls back to kill(pid, 0), which misses a zombie.
  bool exited() const;
  // The same, but answers "alive" without asking again if the last question was asked less than
  // `max_age` before `now`. A poll costs about 1.3 us here (a syscall), and an operation on shm
  // meets -FI_EAGAIN 5 to 25 times before it posts: asking at every retry cost more than the
  // post itself.
  bool exited(std::chrono::steady_clock::time_point now,
              std::chrono::steady_clock::duration max_age) const;
  // The same for a transfer taken from the worker's channel in batch `taken` (batches are
  // numbered from 1 as the worker takes them; `current` is the one being handled): asks again
  // unless it already asked while handling batch `taken` or a later one. As exact as asking for
  // every transfer: whatever could be seen before the transfer was submitted could be seen
  // when its batch was taken, before the question was asked. One poll(2) costs 0.3-1.3 us
  // here; at depth 64 a batch holds many transfers to one peer, and asking once serves them all.
  bool exited_for_batch(std::uint64_t taken, std::uint64_t current) const;
  long pid() const noexcept { return pid_; }
  // Rings the peer's doorbell if it has a mark (liveness_mark.hpp): its target starts a
  // transfer just posted to it now instead of at its next timed poll.
  void ring() const noexcept {
    if (watch_) watch_->ring();
  }
  // Whether the peer's liveness mark answers for it now (a test's view).
  bool marked() const noexcept {
    return watch_ && watch_->state() != LivenessWatch::State::kUnknown;
  }

 private:
  long pid_;
  int pidfd_ = -1;
  mutable bool exited_ = false;
  mutable bool asked_ = false;  // by the timed exited(), at asked_at_
  mutable std::chrono::steady_clock::time_point asked_at_{};
  mutable std::uint64_t asked_in_batch_ = 0;  // by exited_for_batch(); 0: never
  std::unique_ptr<LivenessWatch> watch_;      // the peer's mark, if it has one
  // The mark's answer: true/false when it has one (an exit it shows is kept), nullopt if not.
  std::optional<bool> exited_by_mark() const;
};

}  // namespace dma::internal
