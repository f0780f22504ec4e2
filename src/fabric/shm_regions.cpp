#include "fabric/shm_regions.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <charconv>
#include <fstream>
#include <limits>
#include <mutex>
#include <sstream>
#include <string_view>
#include <system_error>

namespace dma::internal {
namespace {

constexpr std::string_view kPrefix = "dma.";
constexpr std::uint64_t kMaxPid = std::numeric_limits<pid_t>::max();

// Parses the decimal run at the start of `text`, advancing past it.
std::optional<std::uint64_t> take_number(std::string_view& text) {
  std::uint64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end == text.data()) return std::nullopt;
  text.remove_prefix(static_cast<std::size_t>(end - text.data()));
  return value;
}

// Parses "dma.<pid>.<start time>" at the start of `text`, advancing past it.
std::optional<ShmOwner> take_our_name(std::string_view& text) {
  if (text.substr(0, kPrefix.size()) != kPrefix) return std::nullopt;
  text.remove_prefix(kPrefix.size());
  const auto pid = take_number(text);
  if (!pid || *pid > kMaxPid || text.empty() || text.front() != '.') return std::nullopt;
  text.remove_prefix(1);
  const auto start = take_number(text);
  if (!start) return std::nullopt;
  return ShmOwner{static_cast<long>(*pid), *start};
}

}  // namespace

std::optional<ShmOwner> shm_address_owner(std::span<const std::uint8_t> address) {
  constexpr std::string_view kScheme = "fi_shm://";
  std::string_view text(reinterpret_cast<const char*>(address.data()), address.size());
  if (text.substr(0, kScheme.size()) != kScheme) return std::nullopt;
  text.remove_prefix(kScheme.size());
  std::string_view as_ours = text;
  if (std::optional<ShmOwner> ours = take_our_name(as_ours)) {
    if (ours->pid == 0) return std::nullopt;
    return ours;
  }
  // shm's default name: "<pid>:<uid>:<endpoint index>".
  const auto pid = take_number(text);
  if (!pid || *pid == 0 || *pid > kMaxPid || text.empty() || text.front() != ':') {
    return std::nullopt;
  }
  return ShmOwner{static_cast<long>(*pid), std::nullopt};
}

std::optional<std::uint64_t> process_start_time(long pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!stat || !std::getline(stat, line)) return std::nullopt;
  // Field 2 (comm) may hold spaces and parentheses; the fields after it start past the last ')'.
  const std::size_t close = line.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream rest(line.substr(close + 1));
  std::string field;
  // Field 3 is the state: a zombie (Z) or dying (X) process no longer maps anything.
  if (!(rest >> field) || field == "Z" || field == "X") return std::nullopt;
  // Fields 4..21 precede starttime (field 22).
  for (int index = 4; index <= 21; ++index) {
    if (!(rest >> field)) return std::nullopt;
  }
  std::uint64_t start = 0;
  if (!(rest >> start)) return std::nullopt;
  return start;
}

std::string shm_source_address() {
  static const std::string address = [] {
    const long pid = static_cast<long>(::getpid());
    return "fi_shm://" + std::string(kPrefix) + std::to_string(pid) + "." +
           std::to_string(process_start_time(pid).value_or(0));
  }();
  return address;
}

std::size_t sweep_stale_shm_regions(const std::filesystem::path& directory) {
  std::error_code error;
  std::filesystem::directory_iterator entries(directory, error);
  if (error) return 0;
  std::size_t removed = 0;
  const uid_t uid = ::getuid();
  for (const auto& entry : entries) {
    const std::string name = entry.path().filename().string();
    std::string_view rest(name);
    const std::optional<ShmOwner> owner = take_our_name(rest);
    if (!owner) continue;
    struct stat status {};
    if (::stat(entry.path().c_str(), &status) != 0 || status.st_uid != uid) continue;
    if (process_start_time(owner->pid) == owner->start_time) continue;  // alive: its own region
    if (std::filesystem::remove(entry.path(), error)) ++removed;
  }
  return removed;
}

}  // namespace dma::internal
