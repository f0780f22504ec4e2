// Private: names for the shm provider's shared-memory regions, and the sweep of regions that
// dead processes left behind.
//
// shm backs each endpoint with a file in /dev/shm named after the source address, by default
// "<pid>:<uid>:<endpoint index>". A process killed with SIGKILL never unlinks it: 16 MiB of
// tmpfs (RAM) leak per endpoint, and when the kernel later hands the same pid to a new process,
// that process's first shm endpoint finds "its" name taken by a region whose recorded owner pid
// is alive (itself) and fi_enable fails with -FI_EBUSY (reproduced here; it failed a CI run).
// We therefore name regions "dma.<pid>.<start time>" (the start time in clock ticks since boot,
// from /proc/<pid>/stat, which a recycled pid does not share), and before opening one we unlink
// every region of ours whose process is gone or is a different incarnation of the pid.
//
// Thread-safety: both functions may be called from any thread.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>

namespace dma::internal {

// "fi_shm://dma.<pid>.<start time>": the source address for this process's shm endpoints.
// shm appends ":<uid>:<endpoint index>" so endpoints of one process stay distinct.
std::string shm_source_address();

// When process `pid` started (clock ticks since boot), or nullopt if it does not exist or is a
// zombie.
std::optional<std::uint64_t> process_start_time(long pid);

// The pid (and, for our own "dma.<pid>.<start time>" names, the start time) that an shm address
// names: "fi_shm://dma.<pid>.<start>[:<uid>:<index>]" as we name regions, or
// "fi_shm://<pid>[:...]" as shm names them by default. nullopt for any other address (another
// provider's, or an shm name that does not lead with a pid).
struct ShmOwner {
  long pid = 0;
  std::optional<std::uint64_t> start_time;
  friend bool operator==(const ShmOwner&, const ShmOwner&) = default;
};
std::optional<ShmOwner> shm_address_owner(std::span<const std::uint8_t> address);

// Unlinks every "dma.<pid>.<start>..." region in `directory` owned by this user whose process
// no longer exists or is another incarnation of the pid. Returns how many it removed. Regions
// of live processes (this one included) are left alone; a peer that still maps a removed
// region keeps its mapping (unlink removes only the name).
std::size_t sweep_stale_shm_regions(const std::filesystem::path& directory = "/dev/shm");

}  // namespace dma::internal
