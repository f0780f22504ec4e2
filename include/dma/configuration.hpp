// How a service or target opens its endpoint: which providers, which domains, and the limits of
// the transfer loop; and the Redis module's load arguments, which are a Configuration and two
// limits of the module's own.
//
// Both ways in, a TOML file (Configuration::load/parse_toml) and the module's name/value load
// arguments (parse_module_arguments), are driven by one schema (src/protocol/settings.hpp): the
// same names (snake_case in files, kebab-case as arguments), types, ranges and help text, and
// README.md's "Configuration" section is that schema rendered (tests/test_configuration.cpp
// checks it). Plain values and pure functions; copy them freely between threads.
#pragma once

#include <chrono>
#include <cstddef>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dma/export.hpp"
#include "dma/result.hpp"

namespace dma {

struct DMA_EXPORT Configuration {
  // libfabric providers in preference order, each really tried in turn until one opens. Short
  // names are accepted: "tcp" means "tcp;ofi_rxm", "verbs" means "verbs;ofi_rxm"; "efa-direct"
  // is the efa provider's efa-direct fabric.
  std::vector<std::string> providers{"tcp"};
  // Domain (interface) names to open, e.g. "lo", "eth0", "rdmap0s6-rdm". Empty: any domain.
  std::vector<std::string> interfaces;
  // The local address to bind to (a node name for fi_getinfo with FI_SOURCE), e.g. "127.0.0.1".
  // Ignored by providers without IP addresses (shm).
  std::optional<std::string> bind;
  // Most RMA operations posted at once on one endpoint. 0 means "the provider's tx queue size";
  // a non-zero value is clamped to it.
  std::size_t max_in_flight = 64;
  // How long a peer may refuse every post (-FI_EAGAIN, with nothing of it in flight) before its
  // queued transfers fail as unreachable.
  std::chrono::milliseconds progress_deadline{1000};
  // How long a posted transfer may go without a completion before it fails as timed out (a
  // peer that died after the post; shm's never-completing bad write). The service keeps serving
  // everyone else: the expired transfer leaves the in-flight cap and its operand is held (see
  // Operands::on_expired) until the provider lets go or the endpoint closes at shutdown, which
  // then takes no longer than this either. 0 waits forever.
  std::chrono::milliseconds completion_deadline{30000};
  // How long a fabric worker may sit inside one libfabric call before the service's watchdog
  // gives up on it, answers its transfers' callers and replaces its endpoint (FabricService,
  // "Endpoint replacement").
  std::chrono::milliseconds stuck_deadline{5000};
  // How long a service's shutdown (its destructor) may take: past it, what has not drained is
  // abandoned (FabricService::shutdown). 0: fail what is in flight at once.
  std::chrono::milliseconds shutdown_deadline{3000};
  // Threads computing CRC32C of completed transfers off the fabric worker.
  std::size_t crc_threads = 1;
  // Register local operands even where the provider does not require it (no FI_MR_LOCAL, as on
  // tcp, net and shm). Off by default, since skipping registration is faster there; on, it
  // exercises the registration cache exactly as FI_MR_LOCAL providers (efa, verbs) do.
  bool always_register_operands = false;
  // Largest single RMA the service posts, read or write; larger pieces are split. 0 means the
  // service's default: a write over tcp in pieces of 512 KiB, in flight together (faster there
  // than whole, docs/PROVIDERS.md), and otherwise the provider's max_msg_size.
  std::size_t max_piece_bytes = 0;
  // How long a fabric worker that has run out of work keeps polling for more (yielding its core
  // between polls) before it sleeps. A transfer submitted within it is posted at once, without
  // waking a sleeping thread (on the project's VM a wake costs 20-50 us: 1 MiB DMA.GETs over
  // shm ran 1.5x as many per second with 300 us; docs/PERFORMANCE.md, "Speed, sixth pass"). It
  // costs up to this much CPU after each burst of work; an idle service still sleeps. 0: sleep
  // at once.
  std::chrono::microseconds worker_idle_poll{300};
  // Largest transfer whose CRC32C a fabric worker with nothing else to do (nothing queued, in
  // flight or on its channel) computes itself instead of handing it to the CRC pool: the hand-off
  // wakes a pool thread and costs more than the checksum (1 MiB DMA.SETs over shm ran 15 % more
  // per second; docs/PERFORMANCE.md, "Speed, eighth pass"). Except on shm, such a transfer into
  // one region is read in pieces of 256 KiB that the worker checksums as each lands (1 MiB
  // DMA.SETs over tcp: 1.4k -> 2.2k per second at one client, "Speed, ninth pass"). Larger ones
  // always go to the pool, so a worker is never held from its next transfer for long. 0: always
  // the pool.
  std::size_t worker_checksum_max = std::size_t{1} << 20;

  // Reads a TOML file whose keys are the fields above (durations in milliseconds, named
  // progress_deadline_ms, completion_deadline_ms, stuck_deadline_ms and shutdown_deadline_ms). Unknown keys, wrong types, values out of
  // their range and non-ASCII bytes are errors that name the key and the position.
  static Result<Configuration> load(const std::filesystem::path& path);
  static Result<Configuration> parse_toml(std::string_view text);
  // Checks the ranges: non-empty providers, none empty; crc_threads 1..256; progress deadline
  // 1..2^31-1 ms, completion deadline 0..2^31-1 ms (why: src/protocol/settings.hpp).
  Status validate() const;
};

inline constexpr std::size_t kDefaultMaxValueSize = std::size_t{512} << 20;
// The value store's reservation (module argument arena-bytes): default and least.
inline constexpr std::size_t kDefaultArenaBytes = std::size_t{1} << 30;
inline constexpr std::size_t kMinArenaBytes = std::size_t{16} << 20;
// Values up to this many bytes go in the command's reply rather than over the fabric when the
// client asks (DMA.GET ... INLINE) and are set with DMA.SETPLAIN by dma::Client (module
// argument inline-max; 0: never). Default and most: docs/PERFORMANCE.md, "Inline values".
inline constexpr std::size_t kDefaultInlineMax = std::size_t{16} << 10;
inline constexpr std::size_t kMaxInlineMax = std::size_t{4} << 20;

// What the Redis module's load arguments (`--loadmodule dma.so [name value]...`) configure.
struct ModuleOptions {
  Configuration configuration;
  // Fabric services (endpoints) opened on each domain; transfers go to the least loaded.
  std::size_t services_per_domain = 1;
  // Largest value DMA.SET accepts, in bytes.
  std::size_t max_value_size = kDefaultMaxValueSize;
  // Bytes reserved for stored values, registered once on every service.
  std::size_t arena_bytes = kDefaultArenaBytes;
  // Back the reservation with transparent huge pages (madvise MADV_HUGEPAGE): the copy of a
  // 1 MiB DMA.GET on shm pins and walks 2 MiB pages instead of 4 KiB ones (docs/PERFORMANCE.md,
  // "Speed, fifth pass"). Costs at fork: a value written while a BGSAVE child lives copies its
  // whole 2 MiB page (README, "Stored values").
  bool arena_huge_pages = true;
  // Largest value answered inline (in a DMA.GET's reply); 0: never.
  std::size_t inline_max = kDefaultInlineMax;
  // DMA.DEBUG (test-only commands such as REPLACE-ENDPOINT) is accepted; refused otherwise.
  bool enable_debug = false;
};

// Parses the module's load arguments as name/value pairs: every Configuration field under its
// kebab-case name (providers and interfaces as comma lists, always-register-operands as true or
// false), plus services-per-domain and max-value-size. The last of a repeated name wins. An
// unknown name, a missing value, a bad number or one out of its range fails with kConfiguration,
// naming the argument (quoted with quote_for_log and clipped, since the message is logged).
DMA_EXPORT Result<ModuleOptions> parse_module_arguments(std::span<const std::string> arguments);

// The libfabric provider name a configuration name stands for ("tcp" -> "tcp;ofi_rxm").
DMA_EXPORT std::string canonical_provider(std::string_view name);

}  // namespace dma
