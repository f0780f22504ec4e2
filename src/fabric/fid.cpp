#include "fabric/fid.hpp"

#include <sys/resource.h>

#include <array>

namespace dma::internal {

Error fabric_error(std::string_view call, long code, ErrorCode kind) {
  const int positive = static_cast<int>(code < 0 ? -code : code);
  return Error(kind, std::string(call) + " failed: " + fi_strerror(positive) + " (" +
                         std::to_string(code) + ")");
}

Status fabric_status(long code, std::string_view call) {
  if (code != 0) return fail(fabric_error(call, code));
  return {};
}

namespace {
// fi_tostr_r output is "FI_A, FI_B" (sometimes with a trailing separator); normalise to
// "FI_A|FI_B".
std::string tidy(const char* text) {
  std::string out;
  std::string_view view(text);
  std::size_t start = 0;
  while (start < view.size()) {
    std::size_t stop = view.find(',', start);
    if (stop == std::string_view::npos) stop = view.size();
    std::string_view token = view.substr(start, stop - start);
    while (!token.empty() && (token.front() == ' ' || token.front() == '\n')) token.remove_prefix(1);
    while (!token.empty() && (token.back() == ' ' || token.back() == '\n')) token.remove_suffix(1);
    if (!token.empty()) {
      if (!out.empty()) out += '|';
      out += token;
    }
    start = stop + 1;
  }
  return out.empty() ? "0" : out;
}
}  // namespace

std::string caps_to_string(std::uint64_t caps) {
  std::array<char, 1024> buffer{};
  return tidy(fi_tostr_r(buffer.data(), buffer.size(), &caps, FI_TYPE_CAPS));
}

std::string mr_mode_to_string(std::uint64_t mr_mode) {
  std::array<char, 512> buffer{};
  int mode = static_cast<int>(mr_mode);  // FI_TYPE_MR_MODE reads an int
  return tidy(fi_tostr_r(buffer.data(), buffer.size(), &mode, FI_TYPE_MR_MODE));
}

std::string address_format_to_string(std::uint32_t address_format) {
  std::array<char, 128> buffer{};
  return tidy(fi_tostr_r(buffer.data(), buffer.size(), &address_format, FI_TYPE_ADDR_FORMAT));
}

Error registration_error(std::size_t length, long code, std::uint64_t memlock_limit) {
  const std::string call = "fi_mr_reg of " + std::to_string(length) + " bytes";
  if (code != -FI_ENOMEM && code != -FI_EAGAIN) return fabric_error(call, code);
  const std::string limit = memlock_limit == RLIM_INFINITY
                                ? std::string("unlimited")
                                : std::to_string(memlock_limit) + " bytes";
  Error base = fabric_error(call, code, ErrorCode::kResourceExhausted);
  return Error(ErrorCode::kResourceExhausted,
               base.message() + "; providers that pin memory stop at RLIMIT_MEMLOCK (here " +
                   limit + "): raise it (ulimit -l, LimitMEMLOCK= in a systemd unit) or register less");
}

std::uint64_t memlock_limit() noexcept {
  rlimit limit{};
  if (::getrlimit(RLIMIT_MEMLOCK, &limit) != 0) return RLIM_INFINITY;
  return limit.rlim_cur;
}

}  // namespace dma::internal
