#include "fabric/endpoint.hpp"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <set>
#include <sstream>
#include <string_view>

#include "dma/memory.hpp"
#include "fabric/shm_regions.hpp"

namespace dma::internal {
namespace {

char* duplicate(const std::string& text) { return ::strdup(text.c_str()); }

bool is_ip_provider(const std::string& provider) {
  return provider != "shm" && provider.rfind("efa", 0) != 0;
}

// The provider name fi_getinfo reports and the fabric name to match for a configured name.
struct ProviderName {
  std::string provider;  // exact fi_info prov_name to accept
  std::string fabric;    // required fabric name, or empty
};

ProviderName resolve(const std::string& configured) {
  if (configured == "efa-direct") return {"efa", "efa-direct"};
  return {canonical_provider(configured), {}};
}

}  // namespace

Result<InfoPtr> query_provider(const Configuration& configuration, const std::string& provider,
                               Role role) {
  const ProviderName name = resolve(provider);
  InfoPtr hints(fi_allocinfo());
  if (!hints) return fail(ErrorCode::kResourceExhausted, "fi_allocinfo failed");
  hints->ep_attr->type = FI_EP_RDM;
  hints->caps = role == Role::kInitiator ? (FI_RMA | FI_READ | FI_WRITE)
                                         : (FI_RMA | FI_REMOTE_READ | FI_REMOTE_WRITE);
  // Every op context is a fi_context2 at the start of our per-op object (efa-direct needs it).
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  // Ask for every mode we can honour, then honour what comes back: leaving it 0 makes efa hand
  // back a variant that fails at run time (docs/PROVIDERS.md, "Memory registration").
  hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_VIRT_ADDR;
  hints->domain_attr->threading = FI_THREAD_DOMAIN;
  hints->domain_attr->av_type = FI_AV_TABLE;
  if (role == Role::kTarget && name.provider == "tcp;ofi_rxm") {
    // A passive rxm target makes progress on its own thread when asked for automatic data
    // progress with FI_ATOMIC in its caps; without it every delivery-complete write waits for
    // our polling thread to come round several times (docs/PROVIDERS.md, "tcp").
    hints->caps |= FI_ATOMIC;
    hints->domain_attr->data_progress = FI_PROGRESS_AUTO;
  }
  if (provider == "sockets") {
    // sockets' default auto progress costs ~6 ms per op; manual is ~7.6 us (docs/PROVIDERS.md,
    // "sockets").
    hints->domain_attr->data_progress = FI_PROGRESS_MANUAL;
  }
  hints->fabric_attr->prov_name = duplicate(name.provider);
  if (!name.fabric.empty()) hints->fabric_attr->name = duplicate(name.fabric);

  const char* node = nullptr;
  std::uint64_t flags = 0;
  if (configuration.bind && is_ip_provider(name.provider)) {
    node = configuration.bind->c_str();
    flags = FI_SOURCE;
  }
  fi_info* list = nullptr;
  const int code = fi_getinfo(kFabricVersion, node, nullptr, flags, hints.get(), &list);
  InfoPtr all(list);
  if (code != 0) return fail(fabric_error("fi_getinfo(" + provider + ")", code, ErrorCode::kNotFound));
  return all;
}

bool offers(const std::string& provider, const fi_info& info) {
  const ProviderName name = resolve(provider);
  if (name.provider != info.fabric_attr->prov_name) return false;
  return name.fabric.empty() ||
         (info.fabric_attr->name != nullptr && name.fabric == info.fabric_attr->name);
}

Result<const fi_info*> choose(const fi_info* list, const std::string& provider,
                              const Configuration& configuration, const std::string& domain) {
  std::set<std::string> seen_domains;
  for (const fi_info* info = list; info != nullptr; info = info->next) {
    if (!offers(provider, *info)) continue;
    const std::string domain_name = info->domain_attr->name ? info->domain_attr->name : "";
    seen_domains.insert(domain_name);
    if (!domain.empty() && domain != domain_name) continue;
    if (domain.empty() && !configuration.interfaces.empty() &&
        std::find(configuration.interfaces.begin(), configuration.interfaces.end(),
                  domain_name) == configuration.interfaces.end()) {
      continue;
    }
    return info;
  }
  if (seen_domains.empty()) {
    return fail(ErrorCode::kNotFound,
                "no " + resolve(provider).provider + " endpoint with RMA offered");
  }
  std::string offered;
  for (const auto& seen : seen_domains) offered += " " + seen;
  return fail(ErrorCode::kNotFound, "no domain named " +
                                        (domain.empty() ? "in interfaces" : "\"" + domain + "\"") +
                                        " (has:" + offered + ")");
}

Result<FidPtr<fid_eq>> open_progress_event_queue(fid_fabric* fabric, const fi_info& info) {
  if (std::string_view(info.fabric_attr->prov_name) != "net") return FidPtr<fid_eq>();
  fi_eq_attr eq_attr{};
  eq_attr.wait_obj = FI_WAIT_POLLFD;
  fid_eq* event_queue = nullptr;
  DMA_TRY(fabric_status(fi_eq_open(fabric, &eq_attr, &event_queue, nullptr), "fi_eq_open"));
  return FidPtr<fid_eq>(event_queue);
}

Result<FidPtr<fid_av>> open_address_vector(fid_domain* domain) {
  fi_av_attr av_attr{};
  av_attr.type = FI_AV_TABLE;
  fid_av* av = nullptr;
  DMA_TRY(fabric_status(fi_av_open(domain, &av_attr, &av, nullptr), "fi_av_open"));
  return FidPtr<fid_av>(av);
}

Result<FidPtr<fid_cq>> open_completion_queue(fid_domain* domain, const fi_info& info) {
  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_CONTEXT;
  cq_attr.wait_obj = FI_WAIT_NONE;
  cq_attr.size = std::max<std::size_t>(info.tx_attr->size, 64) + info.rx_attr->size;
  fid_cq* cq = nullptr;
  DMA_TRY(fabric_status(fi_cq_open(domain, &cq_attr, &cq, nullptr), "fi_cq_open"));
  return FidPtr<fid_cq>(cq);
}

void name_shm_region(fi_info& info) {
  if (std::string_view(info.fabric_attr->prov_name) != "shm") return;
  sweep_stale_shm_regions();
  const std::string source = shm_source_address();
  std::free(info.src_addr);
  info.src_addr = duplicate(source);
  info.src_addrlen = source.size() + 1;
}

Result<std::unique_ptr<Endpoint>> Endpoint::open(const Configuration& configuration, Role role,
                                                 const std::string& domain, DomainOwner owner) {
  DMA_TRY(configuration.validate());
  std::ostringstream reasons;
  for (const std::string& provider : configuration.providers) {
    Result<std::unique_ptr<Endpoint>> opened = [&]() -> Result<std::unique_ptr<Endpoint>> {
      DMA_TRY_ASSIGN(InfoPtr all, query_provider(configuration, provider, role));
      DMA_TRY_ASSIGN(const fi_info* chosen, choose(all.get(), provider, configuration, domain));
      return open_on(*chosen, configuration, owner);
    }();
    if (opened) return opened;
    // Whatever this provider opened has been closed again (each object is in a FidPtr of the
    // half-built Endpoint); the next one starts from nothing.
    reasons << "; " << provider << ": " << opened.error().message();
  }
  std::string why = reasons.str();
  if (why.size() > 2) why.erase(0, 2);
  return fail(ErrorCode::kNotFound, "no configured provider could open an endpoint: " + why);
}

Result<std::unique_ptr<Endpoint>> Endpoint::open_on(const fi_info& chosen,
                                                    const Configuration& configuration,
                                                    DomainOwner owner) {
  std::unique_ptr<Endpoint> endpoint(new Endpoint());
  endpoint->info_.reset(fi_dupinfo(&chosen));
  if (!endpoint->info_) return fail(ErrorCode::kResourceExhausted, "fi_dupinfo failed");
  fi_info* info = endpoint->info_.get();

  fid_fabric* fabric = nullptr;
  DMA_TRY(fabric_status(fi_fabric(info->fabric_attr, &fabric, nullptr), "fi_fabric"));
  endpoint->fabric_.reset(fabric);
  DMA_TRY_ASSIGN(endpoint->event_queue_, open_progress_event_queue(fabric, *info));

  fid_domain* opened_domain = nullptr;
  DMA_TRY(fabric_status(fi_domain(fabric, info, &opened_domain, nullptr), "fi_domain"));
  endpoint->domain_.reset(opened_domain);
  endpoint->closes_ = std::make_shared<DeferredCloses>(std::move(owner));

  DMA_TRY_ASSIGN(endpoint->address_vector_, open_address_vector(opened_domain));
  DMA_TRY_ASSIGN(endpoint->completion_queue_, open_completion_queue(opened_domain, *info));

  name_shm_region(*info);
  fid_ep* ep = nullptr;
  DMA_TRY(fabric_status(fi_endpoint(opened_domain, info, &ep, nullptr), "fi_endpoint"));
  endpoint->endpoint_.reset(ep);
  DMA_TRY(fabric_status(fi_ep_bind(ep, &endpoint->address_vector_->fid, 0), "fi_ep_bind(av)"));
  DMA_TRY(fabric_status(
      fi_ep_bind(ep, &endpoint->completion_queue_->fid, FI_TRANSMIT | FI_RECV), "fi_ep_bind(cq)"));
  DMA_TRY(fabric_status(fi_enable(ep), "fi_enable"));

  std::size_t length = 0;
  fi_getname(&ep->fid, nullptr, &length);
  endpoint->address_.resize(length);
  DMA_TRY(fabric_status(fi_getname(&ep->fid, endpoint->address_.data(), &length), "fi_getname"));
  endpoint->address_.resize(length);

  EndpointDescription& description = endpoint->description_;
  description.provider = info->fabric_attr->prov_name;
  description.fabric = info->fabric_attr->name ? info->fabric_attr->name : "";
  description.domain = info->domain_attr->name ? info->domain_attr->name : "";
  description.address_format_value = info->addr_format;
  description.address_format = address_format_to_string(info->addr_format);
  description.mr_mode = static_cast<std::uint64_t>(info->domain_attr->mr_mode);
  description.mr_mode_flags = mr_mode_to_string(description.mr_mode);
  description.caps = info->caps;
  description.caps_flags = caps_to_string(info->caps);
  description.tx_size = info->tx_attr->size;
  description.max_msg_size = info->ep_attr->max_msg_size;
  description.virtual_addresses = (info->domain_attr->mr_mode & FI_MR_VIRT_ADDR) != 0;
  description.provider_keys = (info->domain_attr->mr_mode & FI_MR_PROV_KEY) != 0;
  const std::size_t tx = info->tx_attr->size == 0 ? 64 : info->tx_attr->size;
  description.max_in_flight =
      configuration.max_in_flight == 0 ? tx : std::min(configuration.max_in_flight, tx);
  return endpoint;
}

Endpoint::~Endpoint() {
  // Regions are domain objects: retire this domain's cached registrations and close whatever
  // other threads queued, before the members close the endpoint and then the domain.
  if (domain_) registry::clear_domain(domain_key());
  if (closes_) closes_->drain();
}

static std::atomic<std::uint64_t>& registrations_counter() noexcept {
  // Process-wide like the registry: DMA.INFO's registrations per operation counts them all.
  static std::atomic<std::uint64_t> made{0};
  return made;
}

Result<Lease> Endpoint::register_memory(std::uintptr_t base, std::size_t length,
                                        std::uint64_t access) {
  if (length == 0) return fail(ErrorCode::kInvalidArgument, "cannot register 0 bytes");
  if (base + length < base) {
    return fail(ErrorCode::kInvalidArgument, "registered range overflows the address space");
  }
  const std::uint64_t requested_key =
      description_.provider_keys ? 0 : next_key_.fetch_add(1, std::memory_order_relaxed);
  fid_mr* opened = nullptr;
  const int code = fi_mr_reg(domain_.get(), reinterpret_cast<const void*>(base), length, access,
                             0, requested_key, 0, &opened, nullptr);
  if (code != 0) return fail(registration_error(length, code, memlock_limit()));
  registrations_counter().fetch_add(1, std::memory_order_relaxed);
  FidPtr<fid_mr> region(opened);
  return std::make_shared<Registration>(std::move(region), closes_);
}

}  // namespace dma::internal

namespace dma {
std::uint64_t registrations_made() noexcept {
  return internal::registrations_counter().load(std::memory_order_relaxed);
}
}  // namespace dma
