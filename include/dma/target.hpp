// Target: the client side. Opens an endpoint that the server RMAs *into*, exposes caller memory
// for remote read and write, and makes progress on its own so a caller that only waits for an
// RPC reply still sees its transfers complete.
//
// Most providers need the target to drive progress (docs/PROVIDERS.md, "Progress"): tcp and net
// block the first operation (connection setup) and hang reads and delivery-complete writes until
// the target calls into libfabric; shm stalls the initiator with -FI_EAGAIN after ~1020
// operations. A Target runs one progress thread. While a transfer is expected (a Busy token is
// held; dma::Client holds one from each DMA command to its reply with Options::busy_poll) it
// polls without sleeping, yielding the CPU between polls; otherwise it polls every
// `poll_interval` and sleeps in between, longer and longer while nothing happens, up to 10 ms,
// so an idle target costs next to nothing (no transfer waits for those polls: on tcp and net
// the provider's own progress thread moves the bytes, on shm the doorbell below), except within
// an expect() window, when it polls, yielding, for the kind of transfer announced. A zero interval
// spins without any syscall, for a target with a core of its own; on shm it spins on the
// doorbell below and polls when it rings (or every 5 us, for initiators that do not ring),
// since each poll takes a cache line that every post to it needs. On shm, where the target's
// own progress copies every write and read, it sleeps on a doorbell that our FabricService
// rings after each post (at most poll_interval, for initiators that do not ring), so a
// transfer starts at once instead of at the next timed poll (docs/PROVIDERS.md, "shm").
//
// Errors: open() reports a provider that cannot open, or a progress thread that cannot start,
// as an error Result; no method throws.
//
// Ownership: the Target owns its endpoint and progress thread; Exposed regions must be destroyed
// before the Target. Thread-safety: every method may be called from any thread (calls into the
// endpoint are serialised with the progress thread, as FI_THREAD_DOMAIN requires).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "dma/export.hpp"
#include "dma/configuration.hpp"
#include "dma/protocol.hpp"
#include "dma/result.hpp"
#include "dma/fabric.hpp"

namespace dma {

class Target;

// Caller memory exposed for one-sided access. Destroying it closes the registration, after which
// the server's RMAs against its key fail. Move-only.
class DMA_EXPORT Exposed {
 public:
  Exposed() = default;
  Exposed(Exposed&&) noexcept;
  Exposed& operator=(Exposed&&) noexcept;
  ~Exposed();

  // The advertisement a client sends: this target's address, the region's key, and its remote
  // address (a virtual address under FI_MR_VIRT_ADDR, else 0, the offset of its first byte).
  const Advertisement& advertisement() const noexcept { return advertisement_; }
  std::byte* data() const noexcept { return data_; }
  std::size_t length() const noexcept { return length_; }
  // The remote region for bytes [offset, offset + length) of this exposed buffer.
  RemoteRegion region(std::size_t offset, std::size_t length) const noexcept {
    return RemoteRegion{advertisement_.key, advertisement_.remote_address + offset, length};
  }
  RemoteRegion whole() const noexcept { return region(0, length_); }

  struct Handle;

 private:
  friend class Target;
  Exposed(std::unique_ptr<Handle> handle, Advertisement advertisement, std::byte* data,
          std::size_t length);
  std::unique_ptr<Handle> handle_;
  Advertisement advertisement_;
  std::byte* data_ = nullptr;
  std::size_t length_ = 0;
};

class DMA_EXPORT Target {
 public:
  struct Options {
    // How long the progress thread sleeps between polls of an idle completion queue. Each
    // sleep that nothing cuts short (a Busy token; on shm a ring of the doorbell) doubles it,
    // up to 10 ms (or poll_interval if longer), so an idle target costs next to nothing.
    // Zero busy-polls: the lowest latency (shm's delivery-complete writes wait on the
    // target's progress), for a whole core. On shm it polls when our initiators ring.
    std::chrono::microseconds poll_interval{50};
  };
  // Keeps the progress thread polling without pause while it lives: take one before the RPC
  // that makes the server transfer and drop it at the reply. Tokens nest; move-only; taking one
  // wakes a sleeping progress thread. Must not outlive its Target.
  class DMA_EXPORT Busy {
   public:
    Busy() = default;
    Busy(Busy&& other) noexcept : target_(std::exchange(other.target_, nullptr)) {}
    Busy& operator=(Busy&& other) noexcept;
    ~Busy();

   private:
    friend class Target;
    explicit Busy(Target* target) : target_(target) {}
    Target* target_ = nullptr;
  };

  static Result<std::unique_ptr<Target>> open(const Configuration& configuration,
                                              const std::string& domain = {});
  static Result<std::unique_ptr<Target>> open(const Configuration& configuration,
                                              const std::string& domain, Options options);
  ~Target();
  Target(const Target&) = delete;
  Target& operator=(const Target&) = delete;

  std::span<const std::uint8_t> local_address() const noexcept;
  const EndpointDescription& describe() const noexcept;

  // Registers [data, data + length) for remote read and write and returns its advertisement.
  // Keys are chosen by the provider or by us, as the provider requires; two exposed buffers
  // never share a key. Zero length is an error.
  Result<Exposed> expose(void* data, std::size_t length);
  Busy busy();
  // What a peer is about to do to this target's memory (expect()).
  enum class Expected : std::uint8_t { kWrite, kRead };
  // A transfer of that kind is expected within `window` (the RPC that makes the server do it
  // is being sent). Where this target's own progress serves it, the progress thread is woken
  // now and polls on (yielding between polls) until the window ends instead of sleeping, so its
  // wake-up overlaps the server's work: a write on shm (this target copies it), a read on tcp
  // and net (a poll drives the provider's progress here, ahead of the provider thread's own
  // wake-up: a 1 MiB DMA.SET at one client ran at 1.50-1.57 of SET against 1.11-1.46). Nothing
  // happens otherwise: an shm read is copied by the initiator, and on tcp and net 1 MiB
  // DMA.GETs whose writes were polled for ran slower (docs/PERFORMANCE.md, "Speed, tenth
  // pass"). Bounded, unlike a Busy token. Returns whether the target polls for it.
  bool expect(Expected what, std::chrono::microseconds window);
  // How many times the progress thread has polled the provider (diagnostics, tests).
  std::uint64_t progress_polls() const noexcept;
  // Inserts an initiator's (server's) address into this target's address vector. efa-direct
  // requires the target to know its initiator; elsewhere it is harmless.
  Status add_initiator(std::span<const std::uint8_t> address);
  // Whether the process behind an initiator's address (one add_initiator was given) is known to
  // have exited. Only an shm address names its process (watched with a pidfd from
  // add_initiator on); for any other address, or one never added, false: it cannot be known.
  // dma::Client asks it before handing back a buffer a failed DMA.GET left to that server.
  bool initiator_exited(std::span<const std::uint8_t> address) const;

  // Orders this process's own accesses to exposed memory against the provider's. Call it
  // before touching an exposed buffer yourself (after an RPC reply told you the server's
  // transfer is done) and again after (before you let a server at it). It drives progress once
  // under the endpoint lock, which the progress thread (and the provider's own locks) also hold
  // around their copies, so every copy the provider made happens-before your accesses and yours
  // before its next ones. On x86 the bytes are already there; ThreadSanitizer and weaker memory
  // models need the edge.
  void synchronize();

  struct Impl;

 private:
  explicit Target(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dma
