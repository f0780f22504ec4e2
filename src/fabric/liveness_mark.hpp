// Private: a same-host peer's liveness, told by the kernel through shared memory, so that asking
// "has the process behind this shm address exited?" costs a load instead of a poll(2).
//
// Why: before every post to an shm peer the worker must know the peer's process is not dead
// (peer_process.hpp: a post into the region of a process that died holding its lock spins
// forever). Asking the pidfd is a syscall per transfer: measured at 64 B and 4 KiB, depth 1,
// it cut our ops/s from 0.85-0.94 of raw libfabric to 0.52-0.58 (docs/PERFORMANCE.md).
//
// How: a dma::Target on shm creates a small file beside its region ("<region>.live" in
// /dev/shm) holding a process-shared *robust* mutex, which its progress thread locks for as long
// as it runs. When a thread dies holding a robust mutex, the kernel rewrites the mutex's word
// while the thread exits (set_robust_list(2), the kernel's futex documentation): the owner's TID
// is cleared and FUTEX_OWNER_DIED is set. A process's threads have all exited, so every such
// word is rewritten, before its pidfd polls readable or a waitpid sees it. So a word that still
// shows its owner and no OWNER_DIED proves the process had not exited when the word was read:
// the answer is as exact as the poll's. A word that shows neither (the Target closed, or not yet
// started) says nothing, and the caller asks the pidfd as before. Peers that are not our Target
// have no file and are always asked by poll(2).
//
// The same page carries a doorbell, so that an idle target sleeps instead of polling on a timer
// and still starts an shm transfer at once. On shm the *target's* progress copies the bytes of
// a write or read (process_vm_readv/writev in its fi_cq_read): a command posted while the target
// sleeps its poll_interval waits for the rest of it (~73 us for a 50 us interval here, 126 us
// before the timer slack was tightened; docs/PERFORMANCE.md, "The doorbell"). So the worker
// rings after each post to a peer with a mark: one atomic add and one load, plus a FUTEX_WAKE
// only when the target said it sleeps. The target sleeps on the count with FUTEX_WAIT, bounded
// by its poll_interval (initiators that do not ring, raw libfabric among them, are served as
// before). Lost wake-ups are excluded by ordering: the target says it sleeps, reads the count,
// polls once more, then waits for the count to move; a ringer posts, adds, then reads whether
// the target sleeps (all sequentially consistent). A post made before the target read the
// count is seen by that last poll; one made after moves the count, so the wait returns at once
// or is woken.
//
// Ownership: a LivenessMark belongs to the Target that created it (it unlinks the file); a
// LivenessWatch to the address-vector entry that watches the peer. Thread-safety: hold() and
// release(), prepare_to_sleep() and sleep() from the one holding thread; ring(), rings() and
// state() from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "fabric/shm_regions.hpp"

namespace dma::internal {

// The file name (in /dev/shm) of the mark for the shm region `region` ("dma.<pid>.<start>:..."),
// or "" if the region is not one of ours.
std::string liveness_file_name(std::span<const std::uint8_t> address);

class LivenessMark {
 public:
  // Creates the mark for our shm endpoint at `address`; nullptr if the address is not one of
  // ours or the file cannot be made (peers then ask by poll).
  static std::unique_ptr<LivenessMark> create(std::span<const std::uint8_t> address);
  ~LivenessMark();  // unlinks the file; the holder must have released it
  LivenessMark(const LivenessMark&) = delete;
  LivenessMark& operator=(const LivenessMark&) = delete;
  void hold();     // locks the robust mutex (the holding thread, once)
  void release();  // unlocks it (the same thread)

  // The doorbell, target side. prepare_to_sleep() says the holder is going to sleep and returns
  // the count to sleep on; poll once more after it, then sleep(seen, timeout) waits until the
  // count moves past `seen` or `timeout` passes, and says whether it moved (rung).
  std::uint32_t prepare_to_sleep() noexcept;
  bool sleep(std::uint32_t seen, std::chrono::nanoseconds timeout) noexcept;
  std::uint32_t rings() const noexcept;  // the count: it moves with every ring
  void ring() noexcept;                  // wakes our own sleeper (stop, a Busy token)

  struct Shared;

 private:
  LivenessMark(std::string path, Shared* shared) : path_(std::move(path)), shared_(shared) {}
  std::string path_;
  Shared* shared_;
  bool held_ = false;
};

class LivenessWatch {
 public:
  // Maps the mark of the peer at `address` owned by `owner`; nullptr if it has none (or it was
  // made by another process than the one the address names).
  static std::unique_ptr<LivenessWatch> open(std::span<const std::uint8_t> address,
                                             const ShmOwner& owner);
  ~LivenessWatch();
  LivenessWatch(const LivenessWatch&) = delete;
  LivenessWatch& operator=(const LivenessWatch&) = delete;

  enum class State { kAlive, kDead, kUnknown };
  // One load of the mutex's word: kAlive while its holder runs, kDead once the kernel marked
  // the holder dead, kUnknown when nobody holds it.
  State state() const noexcept;
  // Rings the peer's doorbell: call after posting to it. A no-op if its file could only be
  // opened for reading.
  void ring() noexcept;

 private:
  LivenessWatch(LivenessMark::Shared* shared, bool writable)
      : shared_(shared), writable_(writable) {}
  LivenessMark::Shared* shared_;
  bool writable_;
};

}  // namespace dma::internal
