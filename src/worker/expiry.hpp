// Private: failing posted transfers that never complete (the completion deadline).
//
// A peer that hangs (a stopped process, a wedged host) or shm's delivery-complete write past an
// exposed region never produces a completion (docs/PROVIDERS.md, "shm"). Without a deadline such a transfer
// holds its caller forever and, with the in-flight cap small, the whole server. Past
// completion_deadline since its first post, a live transfer fails as kTimedOut (its context's
// on_expired is told at once) and leaves the in-flight cap (its pieces become "held"), so others
// keep flowing. It does not leave the worker: its pieces may still be in the provider's hands,
// so its context (the operand's owner) and its address entry stay until the pieces are reaped
// late or the endpoint closes. Held pieces still occupy the provider's transmit queue: if they
// ever filled it, new posts would answer -FI_EAGAIN and fail at the progress deadline (errors,
// never a hang). The table is scanned at most every tenth of the deadline (at most 100 ms), which
// bounds how late a transfer expires.
//
// The same scan notices a wedged endpoint: shm completes an endpoint's delivery-complete writes
// in posting order and never answers one whose target died, so every later write on the
// endpoint, to any peer, would expire in turn (docs/RELIABILITY.md). A transfer that expires
// with nothing of its direction reaped since its first post while later transfers of that
// direction were posted behind it is that case; check() says so, and the worker retires the
// endpoint for the service to replace (worker.hpp). A dead peer on tcp or net does not match:
// the other peers' transfers keep completing. (An endpoint whose only traffic is to one stopped
// peer matches too; replacing it costs that peer's transfers nothing they were not losing.)
//
// A wedge is also seen without waiting for the deadline: a transfer to an shm peer whose
// process has exited never completes (its target's progress does shm's copy and sends the
// acknowledgement), so one posted at least kDeadPeerGrace ago to a peer found dead, with nothing
// of its direction reaped since its post and later ones of its direction posted behind it, is
// taken for that case at once. This catches only some of the wedges a kill makes (the 120 s shm
// soak, a client killed every 2 s: 4 replaced at once, 5 stalls of 2-4 s left; before it, 28 s
// stalls): transfers older than it that complete after its post hide it, and so do later ones
// of the other direction. A broader signature (any transfer posted after it waiting 250 ms)
// caught them all and met the soak's recovery goal, but the 14 replacements it made crashed 4
// clients inside shm's progress (docs/RELIABILITY.md, "Soak"), so it is not used.
//
// Ownership: owned by the Worker. Thread-safety: the worker thread only.
#pragma once

#include <chrono>
#include <optional>
#include <string>

#include "worker/clock.hpp"
#include "worker/op_table.hpp"
#include "worker/service_shared.hpp"

namespace dma::internal {

class Expiry {
 public:
  Expiry(std::chrono::milliseconds completion_deadline, WorkerClock clock,
         AtomicCounters& counters)
      : deadline_(completion_deadline), clock_(clock), counters_(counters) {}

  // Expires every live transfer posted at least the deadline ago, if a scan is due. Returns why
  // the endpoint looks wedged, if it does (above).
  std::optional<std::string> check(OpTable& table);

 private:
  // A transfer posted this long ago to a dead peer's process is taken for never completing: a
  // completion it did earn is reaped within microseconds of the peer's acknowledgement, and the
  // peer's exit is asked about at most this often (one poll(2) on its pidfd).
  static constexpr std::chrono::milliseconds kDeadPeerGrace{20};

  std::optional<std::string> expire_overdue(OpTable& table, WorkerClock::time_point now);
  // Why the endpoint is wedged behind `op`, posted to a peer whose process has exited (above).
  std::optional<std::string> dead_peer_wedge(const OpTable& table, const Op& op,
                                             WorkerClock::time_point now) const;

  std::chrono::milliseconds deadline_;  // zero: never
  WorkerClock clock_;
  AtomicCounters& counters_;
  WorkerClock::time_point next_check_{};
};

// Fails `op` with `error` now (its context's on_expired is told) and holds what of it the
// provider still has (table.held), unless it has expired already. Used by the deadline, by a
// retiring worker and by the watchdog (with the worker's gate claimed).
void expire_op(OpTable& table, Op& op, Error error, AtomicCounters& counters);

}  // namespace dma::internal
