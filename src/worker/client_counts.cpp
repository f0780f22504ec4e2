#include "worker/client_counts.hpp"

namespace dma::internal {

bool ClientCounts::closed(std::uint64_t client_id) {
  auto counted = outstanding_.find(client_id);
  if (counted != outstanding_.end() && --counted->second == 0 &&
      removal_pending_.erase(client_id) != 0) {
    outstanding_.erase(counted);
    return true;
  }
  return false;
}

bool ClientCounts::remove(std::uint64_t client_id) {
  auto counted = outstanding_.find(client_id);
  if (counted == outstanding_.end() || counted->second == 0) {
    if (counted != outstanding_.end()) outstanding_.erase(counted);
    return true;
  }
  removal_pending_.insert(client_id);
  return false;
}

std::size_t ClientCounts::outstanding(std::uint64_t client_id) const {
  auto counted = outstanding_.find(client_id);
  return counted == outstanding_.end() ? 0 : counted->second;
}

}  // namespace dma::internal
