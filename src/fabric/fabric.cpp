// dma/fabric.hpp: fabric addresses, endpoint descriptions and domain discovery.
#include "dma/fabric.hpp"

#include <algorithm>
#include <set>
#include <sstream>

#include "fabric/endpoint.hpp"

namespace dma {

Result<FabricAddress> FabricAddress::from(std::span<const std::uint8_t> bytes) {
  if (bytes.size() > kCapacity) {
    return fail(ErrorCode::kInvalidArgument, "fabric address is " + std::to_string(bytes.size()) +
                                                 " bytes; at most " + std::to_string(kCapacity) +
                                                 " are supported");
  }
  FabricAddress address;
  std::copy(bytes.begin(), bytes.end(), address.bytes_.begin());
  address.size_ = bytes.size();
  return address;
}

std::string EndpointDescription::to_string() const {
  std::ostringstream out;
  out << "provider=" << provider << " fabric=" << fabric << " domain=" << domain
      << " addr_format=" << address_format << " mr_mode=" << mr_mode_flags
      << " caps=" << caps_flags << " tx_size=" << tx_size << " max_msg_size=" << max_msg_size
      << " max_in_flight=" << max_in_flight
      << " remote_addresses=" << (virtual_addresses ? "virtual" : "offset")
      << " keys=" << (provider_keys ? "provider" : "application");
  return out.str();
}

Result<std::vector<DomainChoice>> discover_domains(const Configuration& configuration) {
  DMA_TRY(configuration.validate());
  std::vector<DomainChoice> found;
  std::ostringstream reasons;
  for (const std::string& provider : configuration.providers) {
    Result<internal::InfoPtr> all =
        internal::query_provider(configuration, provider, internal::Role::kInitiator);
    if (!all) {
      reasons << "; " << all.error().message();
      continue;
    }
    std::set<std::string> seen;
    for (const fi_info* info = all->get(); info != nullptr; info = info->next) {
      if (!internal::offers(provider, *info)) continue;
      const std::string domain = info->domain_attr->name ? info->domain_attr->name : "";
      if (!configuration.interfaces.empty() &&
          std::find(configuration.interfaces.begin(), configuration.interfaces.end(), domain) ==
              configuration.interfaces.end()) {
        continue;
      }
      if (seen.insert(domain).second) found.push_back(DomainChoice{provider, domain});
    }
  }
  if (found.empty()) {
    std::string why = reasons.str();
    return fail(ErrorCode::kNotFound,
                "no domain matches the configuration" + (why.empty() ? "" : ": " + why.substr(2)));
  }
  return found;
}

}  // namespace dma
