// The parent's side of the client processes: one per slot, each spawned as `dma-soak client`
// (client.hpp) with pipes on its stdin and stdout, its reports read as they come, and the last
// reports of those killed kept, so the totals still count the work of a client that is gone.
//
// A client whose output ends without our killing it exited on its own (crashed): counted, not
// replaced, so that the report fails the run instead of hiding the crash behind a replacement.
//
// Ownership: the pool owns its processes (killed and reaped on destruction) and refers to the
// Options it was made with, which must outlive it. Thread-safety: none; the parent's one thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "soak/options.hpp"
#include "soak/tally.hpp"

namespace dma::soak {

class ClientProcess;

class ClientPool {
 public:
  ClientPool(const Options& options, int port);
  ~ClientPool();

  // Starts options.clients clients; false (said on stderr) if one cannot start.
  bool start();
  // Waits at most `timeout` for reports and takes whatever arrived.
  void collect(std::chrono::milliseconds timeout);
  // SIGKILLs the client in `slot` and starts a replacement there; false if it cannot start.
  bool kill_and_replace(int slot);
  // Stops every client (EOF on its stdin) and takes its last report; one that does not stop
  // within a minute is killed.
  void stop();
  // The live clients' last reports plus the killed clients' last ones.
  Tally total() const;
  std::uint64_t crashed() const { return crashed_; }

 private:
  const Options& options_;
  int port_;
  std::uint64_t next_seed_ = 1;
  std::vector<std::unique_ptr<ClientProcess>> clients_;
  Tally retired_;  // the killed clients' last reports
  std::uint64_t crashed_ = 0;
};

}  // namespace dma::soak
