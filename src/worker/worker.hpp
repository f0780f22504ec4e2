// Private: the fabric worker, the event loop behind FabricService.
//
// One ordered channel carries Transfer, AddPeer, RemovePeer and Register messages. Because it is
// one channel, a RemovePeer is handled after every transfer its client submitted before it, and
// the client's address-vector entry is released only once that client's outstanding count
// (counted from intake, not from post) is zero. Each step():
//   1. takes in everything queued, resolving each transfer's local operand;
//   2. posts pieces while fewer than max_in_flight are on the wire; -FI_EAGAIN sends the
//      transfer to the back of the queue, and past progress_deadline since its first EAGAIN it
//      fails as unreachable;
//   3. reaps the completion queue in batches; the op context is the Piece itself (a fi_context2
//      as its first member), so a completion needs no lookup, and an error entry fails exactly
//      that transfer;
//   4. hands completions to the batch completer, one call per step; checksummed ones go to the
//      CRC pool in batches, a partial batch flushed whenever the queue runs dry or the worker is
//      about to park;
//   5. fails, as timed out, every posted transfer that has had no completion for
//      completion_deadline. Such an "expired" transfer leaves the in-flight cap (so others keep
//      flowing) but not the worker: its pieces may still be in the provider's hands, so its
//      context (the operand's owner) and its client's address entry are held until they are
//      reaped late or the endpoint closes. They still occupy the provider's transmit queue: if
//      held operations ever filled it, new posts would answer -FI_EAGAIN and fail at the
//      progress deadline (errors, never a hang). The client is not refused afterwards: on shm
//      an innocent client's operations queued behind a dead peer's expire too (PROVIDERS.md);
//   6. parks on the channel when nothing is queued or live in flight (no spinning while idle;
//      with expired pieces held it wakes every kHeldPollInterval to reap them).
// The loop can be stepped from a test (step(false)); the thread is a detail.
//
// Ownership: the worker owns the endpoint and every libfabric object under it; it is used only
// by the thread that opened it. Members are declared so that peers and registrations go before
// the endpoint, and the endpoint's domain last.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <variant>
#include <vector>

#include "dma/service.hpp"
#include "fabric/endpoint.hpp"
#include "fabric/local_regions.hpp"
#include "worker/one_shot.hpp"
#include "fabric/peer_addresses.hpp"

namespace dma::internal {

struct AddPeerMessage {
  std::uint64_t client_id;
  FabricAddress address;
  Answer<Status> reply;
};
struct RemovePeerMessage {
  std::uint64_t client_id;
};
struct RegisterMessage {
  std::uintptr_t base;
  std::size_t length;
  Answer<Status> reply;
};
using Message = std::variant<TransferRequest, AddPeerMessage, RemovePeerMessage, RegisterMessage>;

// Multi-producer, single-consumer queue with close and wake. Producers append under a lock; the
// consumer swaps the whole batch out (capacity is kept, so a warm channel does not allocate).
class Channel {
 public:
  // Appends unless closed. Returns false (and leaves `message` alone) when closed.
  template <typename M>
  bool push(M&& message) {
    {
      std::lock_guard lock(mutex_);
      if (closed_.load(std::memory_order_relaxed)) return false;
      queue_.emplace_back(std::forward<M>(message));
      pending_.store(true, std::memory_order_release);
    }
    ready_.notify_one();
    return true;
  }
  // Moves everything queued into `out` (which must be empty). With `block`, waits until there is
  // something, a wake(), close(), or (if non-zero) `timeout`. Returns false once closed (and
  // nothing was taken).
  bool take(std::vector<Message>& out, bool block,
            std::chrono::milliseconds timeout = std::chrono::milliseconds(0));
  void close();
  void wake();
  bool closed() const;

 private:
  mutable std::mutex mutex_;
  std::condition_variable ready_;
  std::vector<Message> queue_;
  std::atomic<bool> pending_{false};
  bool woken_ = false;
  // Written under mutex_, also read without it by take()'s lock-free fast path.
  std::atomic<bool> closed_{false};
};

// Counters shared between the worker and readers.
struct AtomicCounters {
  std::atomic<std::uint64_t> submitted{0};
  std::atomic<std::uint64_t> completed{0};
  std::atomic<std::uint64_t> failed{0};
  std::atomic<std::uint64_t> bytes_to_peer{0};
  std::atomic<std::uint64_t> bytes_from_peer{0};
  std::atomic<std::uint64_t> eagain{0};
  std::atomic<std::uint64_t> expired{0};
  std::atomic<std::uint64_t> unattributed_errors{0};
  ServiceCounters snapshot() const;
};

// What the service and its worker (and the worker's pool jobs) share. Outlives all of them.
struct ServiceShared {
  Channel channel;
  std::atomic<std::size_t> outstanding{0};
  AtomicCounters counters;
  BatchCompleter complete_batch;
  std::shared_ptr<Pool> pool;
  // Pool jobs not yet finished; the worker waits for zero before it closes the endpoint, so
  // every completion is delivered before the service's destructor returns.
  std::mutex jobs_mutex;
  std::condition_variable jobs_done;
  std::size_t jobs = 0;
};

// The checksum-batch flush policy: a full batch goes at once; a partial one goes as soon as the
// completion queue runs dry (a lone checksummed transfer must not wait for unrelated traffic)
// and always before the worker parks (or it would wait for an unrelated message).
inline constexpr std::size_t kChecksumBatch = 32;
bool checksum_flush_due(std::size_t batched, bool queue_dry, bool parking) noexcept;

// How often a worker whose only operations in flight have expired wakes to reap them.
inline constexpr std::chrono::milliseconds kHeldPollInterval{20};
// How old an answer to "has the shm peer's process exited?" may be when an operation retries
// after -FI_EAGAIN (a new operation always asks afresh; peer_process.hpp).
inline constexpr std::chrono::milliseconds kOwnerRecheck{1};

class Worker {
 public:
  static Result<std::unique_ptr<Worker>> open(const Configuration& configuration,
                                              const std::string& domain,
                                              std::shared_ptr<ServiceShared> shared);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // One pass of the loop. With `may_block`, parks on the channel while idle. Returns false once
  // the channel is closed and everything taken in has completed and been delivered.
  bool step(bool may_block);
  // Steps until done, then waits for the pool jobs this worker started.
  void run();

  const Endpoint& endpoint() const noexcept { return *endpoint_; }
  std::size_t in_flight() const noexcept { return in_flight_; }
  // Pieces of expired transfers still in the provider's hands (counted in in_flight()).
  std::size_t held() const noexcept { return held_pieces_; }
  std::size_t queued() const noexcept { return pending_.size(); }
  std::size_t checksums_batched() const noexcept { return checksum_batch_.size(); }
  const PeerAddresses& peers() const noexcept { return *peers_; }

 private:
  struct Op;
  struct Piece {
    fi_context2 context;  // first member: the CQ entry's op_context is this Piece
    Op* op;               // the transfer it belongs to while posted; nullptr while free
  };
  struct Op {
    TransferRequest request;
    fi_addr_t peer = FI_ADDR_UNSPEC;
    // Keeps the address-vector entry `peer` names until the op finishes, so a client
    // re-advertising a new address cannot remove (and let the next insert reuse) the slot its
    // queued and posted transfers still target. Not on efa (see prepare()).
    std::shared_ptr<RegisteredAddress> peer_entry;
    std::byte* local = nullptr;
    std::size_t length = 0;
    LocalOperand operand;
    std::size_t region = 0;         // posting cursor: which remote region
    std::size_t region_offset = 0;  // and how far into it
    std::size_t local_offset = 0;   // bytes of the local operand posted so far
    std::size_t in_flight = 0;      // pieces posted and not yet reaped
    bool posting_done = false;
    bool queued = false;  // in pending_
    bool owner_asked = false;  // whether the peer's process was asked about before its posts
    bool eagain = false;   // efa only (no peer_entry): the op's own progress clock runs
    bool expired = false;  // failed at the completion deadline; held until its pieces are reaped
    std::chrono::steady_clock::time_point first_eagain;
    std::chrono::steady_clock::time_point posted_at;  // its first piece's post
    std::optional<Error> error;
  };
  struct ChecksumItem {
    Completion completion;
    const std::byte* data;
    std::size_t size;
  };

  Worker(std::unique_ptr<Endpoint> endpoint, const Configuration& configuration,
         std::shared_ptr<ServiceShared> shared);
  void intake(Message& message);
  void accept(TransferRequest&& request);
  Status prepare(Op& op);
  void post();
  // 0, -FI_EAGAIN, or another negative libfabric error.
  long post_piece(Op& op, Piece& piece, std::size_t size);
  // Called on -FI_EAGAIN: whether `op`'s peer has refused every post for the progress deadline
  // (with nothing of it in flight), so the op fails as unreachable.
  bool past_progress_deadline(Op& op, std::chrono::steady_clock::time_point now);
  std::size_t reap();
  // One piece is back from the provider (reaped, or its endpoint closed): frees it and finishes
  // its transfer if that was the last piece and nothing more is to be posted.
  void piece_done(Piece* piece);
  // Fails every live transfer posted at least completion_deadline ago (see the steps above).
  void expire_overdue(std::chrono::steady_clock::time_point now);
  std::size_t live_in_flight() const noexcept { return in_flight_ - held_pieces_; }
  void finish(Op* op, Outcome outcome);
  void flush(bool queue_dry, bool parking);
  void deliver_now();
  void dispatch_checksums();
  // Shutdown only, once nothing live is in flight: closes the endpoint, after which the provider
  // no longer touches the held operands, and delivers the expired transfers' completions.
  void release_held();
  Op* acquire_op();
  Piece* acquire_piece(Op* op);
  void release_piece(Piece* piece);

  std::unique_ptr<Endpoint> endpoint_;
  std::unique_ptr<LocalRegions> regions_;
  std::unique_ptr<PeerAddresses> peers_;
  std::shared_ptr<ServiceShared> shared_;
  Configuration configuration_;
  bool efa_addresses_ = false;
  std::size_t cap_;
  std::size_t max_piece_;
  std::vector<Message> inbox_;
  std::deque<Op*> pending_;
  std::size_t in_flight_ = 0;
  std::size_t held_pieces_ = 0;
  std::chrono::steady_clock::time_point next_expiry_check_{};
  std::vector<std::unique_ptr<Op>> ops_;  // every Op ever made; reused through free_ops_
  std::vector<Op*> free_ops_;
  std::vector<std::unique_ptr<Piece>> pieces_;
  std::vector<Piece*> free_pieces_;
  std::vector<Completion> batch_;
  std::vector<ChecksumItem> checksum_batch_;
  std::unordered_map<std::uint64_t, std::size_t> client_outstanding_;
  std::unordered_set<std::uint64_t> removal_pending_;
  bool closed_ = false;
};

}  // namespace dma::internal
