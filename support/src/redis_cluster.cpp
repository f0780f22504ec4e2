#include "support/redis_cluster.hpp"

#include <hiredis/hiredis.h>

#include <filesystem>
#include <thread>

#include "support/redis_connection.hpp"

namespace dma::support {
namespace {

using Clock = std::chrono::steady_clock;

Result<std::string> text_reply(RedisConnection& connection,
                               std::initializer_list<std::string_view> command) {
  DMA_TRY_ASSIGN(const Reply reply, connection.command(command));
  if (reply->type != REDIS_REPLY_STRING && reply->type != REDIS_REPLY_STATUS) {
    return fail(ErrorCode::kInvalidArgument, "a reply that is not text");
  }
  return std::string(reply->str, reply->len);
}

// Whether a node's CLUSTER INFO says the cluster is whole: state ok, every node known, every
// slot assigned.
bool whole(const std::string& info, std::size_t nodes) {
  return info.find("cluster_state:ok") != std::string::npos &&
         info.find("cluster_slots_assigned:" + std::to_string(kClusterSlots)) != std::string::npos &&
         info.find("cluster_known_nodes:" + std::to_string(nodes) + "\r") != std::string::npos;
}

}  // namespace

int RedisCluster::first_slot(std::size_t index) const noexcept {
  return static_cast<int>(index * kClusterSlots / nodes_.size());
}

int RedisCluster::last_slot(std::size_t index) const noexcept {
  return static_cast<int>((index + 1) * kClusterSlots / nodes_.size()) - 1;
}

std::size_t RedisCluster::owner_at_start(int slot) const noexcept {
  for (std::size_t index = 0; index < nodes_.size(); ++index) {
    if (slot <= last_slot(index)) return index;
  }
  return nodes_.size() - 1;
}

Result<std::unique_ptr<RedisCluster>> RedisCluster::start(const Options& options) {
  if (options.masters == 0) return fail(ErrorCode::kInvalidArgument, "a cluster needs a master");
  std::unique_ptr<RedisCluster> cluster(new RedisCluster);
  for (std::size_t index = 0; index < options.masters; ++index) {
    RedisServer::Options node = options.node;
    node.cluster = true;
    node.directory = options.directory + "/node-" + std::to_string(index);
    std::error_code error;
    std::filesystem::create_directories(node.directory, error);
    if (error) {
      return fail(ErrorCode::kInvalidArgument,
                  "cannot create " + node.directory + ": " + error.message());
    }
    DMA_TRY_ASSIGN(auto server, RedisServer::start(node));
    cluster->nodes_.push_back(std::move(server));
  }
  std::vector<std::unique_ptr<RedisConnection>> connections;
  for (std::size_t index = 0; index < cluster->size(); ++index) {
    RedisServer& server = cluster->node(index);
    DMA_TRY_ASSIGN(auto connection,
                   RedisConnection::open(server.host(), server.port(), std::chrono::seconds(10)));
    DMA_TRY_ASSIGN(std::string id, text_reply(*connection, {"CLUSTER", "MYID"}));
    cluster->ids_.push_back(std::move(id));
    const std::string epoch = std::to_string(index + 1);
    DMA_TRY(connection->command({"CLUSTER", "SET-CONFIG-EPOCH", epoch}));
    const std::string first = std::to_string(cluster->first_slot(index));
    const std::string last = std::to_string(cluster->last_slot(index));
    DMA_TRY(connection->command({"CLUSTER", "ADDSLOTSRANGE", first, last}));
    connections.push_back(std::move(connection));
  }
  for (std::size_t index = 1; index < cluster->size(); ++index) {
    RedisServer& server = cluster->node(index);
    const std::string port = std::to_string(server.port());
    const std::string bus = std::to_string(server.cluster_port());
    DMA_TRY(connections[0]->command({"CLUSTER", "MEET", server.host(), port, bus}));
  }
  const auto deadline = Clock::now() + options.ready_deadline;
  std::string last_info;
  for (std::size_t index = 0; index < cluster->size();) {
    auto info = text_reply(*connections[index], {"CLUSTER", "INFO"});
    if (info && whole(*info, cluster->size())) {
      ++index;
      continue;
    }
    if (info) last_info = *info;
    if (Clock::now() > deadline) {
      return fail(ErrorCode::kTimedOut, "node " + std::to_string(index) +
                                            " never saw the whole cluster:\n" + last_info);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // gossip cannot notify us
  }
  return cluster;
}

}  // namespace dma::support
