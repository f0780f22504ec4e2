// Private: RAII owners for libfabric objects and error helpers. Every fid_* the library opens
// lives in a FidPtr; the owning struct's member order is its teardown order (members are
// destroyed in reverse declaration order, so declare the fabric before the domain before the
// endpoint).
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "dma/result.hpp"

namespace dma::internal {

// Closes any fid_* (fabric, domain, av, cq, ep, mr, eq) through its embedded `struct fid`.
struct FidCloser {
  template <typename T>
  void operator()(T* object) const noexcept {
    if (object != nullptr) fi_close(&object->fid);
  }
};
template <typename T>
using FidPtr = std::unique_ptr<T, FidCloser>;

struct InfoDeleter {
  void operator()(fi_info* info) const noexcept { fi_freeinfo(info); }
};
using InfoPtr = std::unique_ptr<fi_info, InfoDeleter>;

// The libfabric API version we ask for: the headers we were built against (1.17 on Debian 12).
inline constexpr std::uint32_t kFabricVersion = FI_VERSION(1, 17);

// "<call> failed: <fi_strerror> (<code>)", with code the negative libfabric return.
Error fabric_error(std::string_view call, long code, ErrorCode kind = ErrorCode::kFabric);
// A libfabric return code (0 or a negative error) as a Status naming the call, for DMA_TRY.
Status fabric_status(long code, std::string_view call);

// The error for a failed fi_mr_reg of `length` bytes. Providers that pin memory (verbs, efa)
// fail with -FI_ENOMEM (or -FI_EAGAIN) once the process's locked memory would exceed
// RLIMIT_MEMLOCK; the message then names the limit (`memlock_limit`, or "unlimited" for
// RLIM_INFINITY) and how to raise it, and the kind is kResourceExhausted.
Error registration_error(std::size_t length, long code, std::uint64_t memlock_limit);
// The calling process's RLIMIT_MEMLOCK soft limit in bytes (RLIM_INFINITY if unlimited).
std::uint64_t memlock_limit() noexcept;

// Human-readable flag sets, via fi_tostr_r.
std::string caps_to_string(std::uint64_t caps);
std::string mr_mode_to_string(std::uint64_t mr_mode);
std::string address_format_to_string(std::uint32_t address_format);

}  // namespace dma::internal
