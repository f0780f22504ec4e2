#include "shm_regions.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <charconv>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string_view>
#include <system_error>

namespace dma::internal {
namespace {

constexpr std::string_view kPrefix = "dma.";

// Parses the decimal run at the start of `text`, advancing past it.
std::optional<std::uint64_t> take_number(std::string_view& text) {
  std::uint64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end == text.data()) return std::nullopt;
  text.remove_prefix(static_cast<std::size_t>(end - text.data()));
  return value;
}

}  // namespace

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
    if (rest.substr(0, kPrefix.size()) != kPrefix) continue;
    rest.remove_prefix(kPrefix.size());
    const auto pid = take_number(rest);
    if (!pid || rest.empty() || rest.front() != '.') continue;
    rest.remove_prefix(1);
    const auto start = take_number(rest);
    if (!start) continue;
    struct stat status {};
    if (::stat(entry.path().c_str(), &status) != 0 || status.st_uid != uid) continue;
    if (process_start_time(static_cast<long>(*pid)) == start) continue;  // alive: its own region
    if (std::filesystem::remove(entry.path(), error)) ++removed;
  }
  return removed;
}

}  // namespace dma::internal
