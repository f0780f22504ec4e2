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
// Ownership: a LivenessMark belongs to the Target that created it (it unlinks the file); a
// LivenessWatch to the address-vector entry that watches the peer. Thread-safety: hold() and
// release() from the one holding thread; state() from any thread.
#pragma once

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

 private:
  explicit LivenessWatch(const LivenessMark::Shared* shared) : shared_(shared) {}
  const LivenessMark::Shared* shared_;
};

}  // namespace dma::internal
