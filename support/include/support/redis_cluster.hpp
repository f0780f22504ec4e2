// RedisCluster: a Redis Cluster of `masters` redis-servers with the dma module, on loopback, for
// the module's cluster tests. Failures are Results, never test assertions.
//
// start() starts every node in cluster mode (RedisServer::Options::cluster, each in its own
// directory under Options::directory), gives each a distinct config epoch
// (CLUSTER SET-CONFIG-EPOCH, as `redis-cli --cluster create` does, so no epoch collision has to
// be resolved), assigns node i the i-th equal range of the 16384 slots (CLUSTER ADDSLOTSRANGE),
// introduces every node to the first (CLUSTER MEET with the bus port), and polls every node's
// CLUSTER INFO until each reports cluster_state:ok with every node known and every slot
// assigned, or the deadline passes (the gossip that spreads the slot map cannot notify us).
//
// Ownership: owns its servers; destroying it stops them (RedisServer's destructor). The
// directory is the caller's. Thread-safety: none; one owner thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "dma/result.hpp"
#include "support/redis_server.hpp"

namespace dma::support {

inline constexpr int kClusterSlots = 16384;

class RedisCluster {
 public:
  struct Options {
    RedisServer::Options node;  // for every node; its directory and cluster flag are set here
    std::size_t masters = 3;
    std::string directory;  // must exist; node i lives in <directory>/node-<i>
    std::chrono::milliseconds ready_deadline{60000};
  };
  static Result<std::unique_ptr<RedisCluster>> start(const Options& options);

  std::size_t size() const noexcept { return nodes_.size(); }
  RedisServer& node(std::size_t index) { return *nodes_.at(index); }
  const std::string& node_id(std::size_t index) const { return ids_.at(index); }
  // The first and last slot node `index` was given at start.
  int first_slot(std::size_t index) const noexcept;
  int last_slot(std::size_t index) const noexcept;
  // The node that was given `slot` at start.
  std::size_t owner_at_start(int slot) const noexcept;

 private:
  RedisCluster() = default;
  std::vector<std::unique_ptr<RedisServer>> nodes_;
  std::vector<std::string> ids_;
};

}  // namespace dma::support
