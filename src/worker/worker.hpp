// Private: the fabric worker, the event loop behind FabricService.
//
// One thread owns every libfabric object of an endpoint (FI_THREAD_DOMAIN); this is the loop it
// runs. Each step():
//   1. takes in everything on the channel (channel.hpp), resolving each transfer's local operand
//      and counting it against its client (client_counts.hpp: a RemovePeer waits for them);
//   2. posts while fewer than max_in_flight are live on the wire (poster.hpp: -FI_EAGAIN and the
//      progress deadline);
//   3. reaps the completion queue in batches (reaper.hpp), and if that ended anything while
//      transfers wait their turn, posts again at once, before step 5's delivery: shm (libfabric
//      1.17) carries a delivery-complete write of up to 4 KiB through one bounce buffer per
//      peer, so such writes go one at a time whatever the depth (the rest get -FI_EAGAIN), and
//      the reap that returns one's completion is what frees the buffer; posting the next only
//      after the callbacks ran kept the target idle meanwhile (64 B writes at depth 64:
//      0.79-0.95 -> 0.98-1.01 of raw libfabric, docs/PERFORMANCE.md, "Speed, fifteenth pass").
//      Not an shm read: shm copies it inside the post, on this thread, and the completions in
//      hand go first;
//   4. fails, as timed out, posted transfers past the completion deadline (expiry.hpp);
//   5. hands completions to the batch completer, checksummed ones via the CRC pool
//      (delivery.hpp), a partial batch flushed when the queue runs dry or before parking; a
//      lone one of at most Configuration::worker_checksum_max bytes, with nothing else to do,
//      it checksums itself (waking a pool thread cost more than the checksum); one into one
//      region, taken in while nothing else is queued or live, is posted in pieces and
//      checksummed piece by piece as they land (a ChecksumStream, delivery.hpp), its completion
//      delivered once the last piece's checksum is done: on the pool if it is larger than
//      worker_checksum_max, else on the worker as it reaps each piece (not on shm, whose copy
//      runs inside the post, on this thread);
//   4a. tells the service when that check finds the endpoint wedged (expiry.hpp): the service
//       opens a new one and this worker only drains (service.hpp, "Endpoint replacement");
//   6. parks on the channel when nothing is queued or live in flight, once it has polled on
//      for Configuration::worker_idle_poll without finding work (with expired pieces held it
//      wakes every kHeldPollInterval to reap them), and naps on it for kNapInterval at a time
//      once transfers in flight have produced nothing for kSpinBeforeNap: a 16 MiB write on
//      shm is copied by the target's process for milliseconds, and spinning through them was
//      most of the server's CPU per DMA.GET (docs/PERFORMANCE.md, "Value store"); short
//      transfers complete within the spin and never wait for a nap. On shm the spin yields
//      the core (past the first 64 passes, every kYieldEvery): the target that copies a
//      transfer may be waiting for this very core (docs/PERFORMANCE.md, "Speed, sixth pass").
//      The idle poll yields on every pass that finds nothing.
// Everything it decides by time it reads from its WorkerClock (clock.hpp), so a test can build
// a Worker on its own thread over a ManualClock and call step(false) itself: no thread, no
// sleep (tests/test_worker.cpp). The thread is a detail of FabricService.
//
// Ownership: the worker owns the endpoint and every libfabric object under it, and is used only
// by the thread that opened it. Members are declared so that transfers, peers and registrations
// go before the endpoint, and the endpoint's domain last.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "dma/service.hpp"
#include "fabric/endpoint.hpp"
#include "fabric/local_regions.hpp"
#include "fabric/peer_addresses.hpp"
#include "worker/channel.hpp"
#include "worker/client_counts.hpp"
#include "worker/clock.hpp"
#include "worker/delivery.hpp"
#include "worker/expiry.hpp"
#include "worker/op_table.hpp"
#include "worker/poster.hpp"
#include "worker/reaper.hpp"
#include "worker/service_shared.hpp"

namespace dma::internal {

// How often a worker whose only operations in flight have expired wakes to reap them.
inline constexpr std::chrono::milliseconds kHeldPollInterval{20};
// How long transfers in flight may produce nothing before the worker naps, and each nap (a
// message ends it at once).
inline constexpr std::chrono::microseconds kSpinBeforeNap{200};
inline constexpr std::chrono::microseconds kNapInterval{50};
// Quiet passes between two yields of the core while transfers to shm peers are in flight,
// after the first 64; an idle poll (worker_idle_poll) yields on every pass.
inline constexpr std::uint32_t kYieldEvery = 16;

struct WorkerOptions {
  WorkerClock clock;  // the real steady clock unless a test gives a ManualClock
  std::chrono::milliseconds held_poll_interval = kHeldPollInterval;
};

class Worker {
 public:
  static Result<std::unique_ptr<Worker>> open(const Configuration& configuration,
                                              const std::string& domain,
                                              std::shared_ptr<ServiceShared> shared,
                                              WorkerOptions options = {});
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // One pass of the loop. With `may_block`, parks on the channel while idle. Returns false once
  // the channel is closed and everything taken in has completed and been delivered.
  bool step(bool may_block);
  // Steps until done, then waits for the pool jobs this worker started.
  void run();

  // Introspection (tests, diagnostics).
  const Endpoint& endpoint() const noexcept { return *endpoint_; }
  std::size_t in_flight() const noexcept { return table_.in_flight; }
  // Pieces of expired transfers still in the provider's hands (counted in in_flight()).
  std::size_t held() const noexcept { return table_.held; }
  std::size_t queued() const noexcept { return table_.pending.size(); }
  // The context of the transfer `position` places from the front of the queue to post; nullptr
  // past its end.
  const Operands* queued_context(std::size_t position) const {
    const Op* op = table_.pending.at(position);
    return op == nullptr ? nullptr : op->request.context.get();
  }
  std::size_t checksums_batched() const noexcept { return delivery_.checksums_batched(); }
  // Checksums the worker computed itself (step 5; diagnostics, tests).
  std::uint64_t checksums_here() const noexcept { return checksums_here_; }
  // Pieces of large transfers checksummed as they landed (step 5; diagnostics, tests).
  std::uint64_t pieces_streamed() const noexcept { return delivery_.pieces_streamed(); }
  std::uint64_t pieces_here() const noexcept { return delivery_.pieces_here(); }
  const PeerAddresses& peers() const noexcept { return *peers_; }
  const ClientCounts& clients() const noexcept { return clients_; }
  // Nothing queued and nothing live in flight: step(true) would park, for park_timeout() (zero:
  // until a message comes).
  bool idle() const noexcept { return table_.pending.empty() && table_.live_in_flight() == 0; }
  // Passes that found nothing to take, post or reap while transfers were in flight, and naps
  // taken (diagnostics, tests).
  std::uint64_t naps() const noexcept { return naps_; }
  // Idle passes that polled on (worker_idle_poll) instead of parking (diagnostics, tests).
  std::uint64_t idle_polls() const noexcept { return idle_polls_; }
  // shm doorbell rings, and of those the ones a read needed after all (poster.hpp).
  std::uint64_t peer_rings() const noexcept { return poster_.rings(); }
  std::uint64_t peer_rings_deferred() const noexcept { return poster_.rings_deferred(); }
  // Whether the endpoint was retired (replaced under the service): transfers still arriving
  // fail with "endpoint replaced: ", what it held has been failed to its callers.
  bool retired() const noexcept { return retired_; }
  // Fails every transfer taken in and not finished with `error` now (held like an expired one
  // where the provider still has it) and retires the endpoint, so the worker only drains from
  // then on. The watchdog calls it with the gate claimed (service_shared.hpp) while the worker
  // is stuck in a libfabric call; the worker itself when it retires or its shutdown runs out of
  // time.
  void abandon(const Error& error);
  std::chrono::milliseconds park_timeout() const noexcept {
    return table_.held > 0 ? held_poll_interval_ : std::chrono::milliseconds(0);
  }

 private:
  Worker(std::unique_ptr<Endpoint> endpoint, const Configuration& configuration,
         std::shared_ptr<ServiceShared> shared, WorkerOptions options);
  // Step 1: everything queued on the channel (blocking while `park`).
  void take_messages(bool park, std::chrono::microseconds timeout);
  // Whether this blocking pass should nap: transfers are in flight, nothing is queued, and no
  // pass has made progress for kSpinBeforeNap (the steady clock is read every 64 quiet passes).
  bool nap_due();
  // Whether this idle, blocking pass should poll on instead of parking: less than
  // worker_idle_poll has passed since the worker ran out of work (the steady clock is read on
  // idle passes after the first only).
  bool idle_poll_due();
  // Shutting down with transfers still live past the service's drain bound
  // (ServiceShared::drain_until_ns): what is left fails now and is held until the endpoint
  // closes, so a bounded shutdown still delivers every completion.
  bool drain_overdue();
  void intake(Message& message);
  void accept(TransferRequest&& request);
  // Steps 2 and 3: `again` is step 3's second pass (on shm it leaves reads for the next step);
  // reap() says whether the completion queue ran dry.
  void post(bool again = false);
  bool reap();
  // The transfers the poster and reaper found over.
  void finish_ended();
  void finish(Op* op, Outcome outcome);
  // Whether `op`'s checksum is computed here rather than on the pool (step 5).
  bool checksum_here(const Op& op) const noexcept;
  // Whether `op` (being taken in, checksummed) is checksummed as it lands (step 5).
  bool stream_due(const Op& op) const noexcept;
  // Retires the endpoint: every transfer taken in and not finished fails now with "endpoint
  // replaced: <reason>" (held like an expired one where the provider still has it), and later
  // ones fail at intake. `tell_service`: the worker found the endpoint unusable itself, so the
  // service must open a new one (ServiceShared::on_retired).
  void retire(const std::string& reason, bool tell_service);
  // Shutdown only, once nothing live is in flight: closes the endpoint, after which the provider
  // no longer touches the held operands, and delivers the expired transfers' completions.
  void release_held();

  std::unique_ptr<Endpoint> endpoint_;
  std::unique_ptr<LocalRegions> regions_;
  std::unique_ptr<PeerAddresses> peers_;
  std::shared_ptr<ServiceShared> shared_;
  bool efa_addresses_ = false;
  bool yield_in_spin_ = false;  // shm: the peer's process copies, perhaps queued on our core
  bool checksum_pieces_here_ = true;  // not shm: small streams are checksummed piece by piece
  std::chrono::milliseconds held_poll_interval_;
  std::chrono::microseconds idle_poll_;  // Configuration::worker_idle_poll
  std::size_t checksum_max_;             // Configuration::worker_checksum_max
  std::uint64_t checksums_here_ = 0;
  Poster poster_;
  Reaper reaper_;
  Expiry expiry_;
  Delivery delivery_;
  ClientCounts clients_;
  OpTable table_;  // before the peers and regions its ops hold entries and leases of
  std::vector<Message> inbox_;
  std::vector<Op*> ended_;
  std::vector<LandedPiece> landed_;  // pieces of streamed transfers reaped this pass
  bool closed_ = false;
  std::uint32_t quiet_passes_ = 0;
  std::uint64_t quiet_batches_ = 0;  // table_.batches at the end of the last pass
  std::chrono::steady_clock::time_point quiet_since_{};
  std::uint64_t naps_ = 0;
  std::uint64_t idle_passes_ = 0;  // idle passes in a row (blocking ones), since the last work
  std::chrono::steady_clock::time_point idle_since_{};  // the second of them
  std::uint64_t idle_polls_ = 0;
  std::uint64_t turns_ = 0;
  bool retired_ = false;
  bool wedge_reported_ = false;  // told the service once; it retires this endpoint after
  std::string retired_reason_;
};

}  // namespace dma::internal
