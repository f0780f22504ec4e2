// `dma-bench redis --cpu-check N` and `--memory-check N`: see redis_bench.hpp.
#include <hiredis/hiredis.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "commands.hpp"
#include "redis_bench.hpp"
#include "redis_clients.hpp"

namespace dma::bench {

using namespace redis;

namespace {

// `operations` DMA.GETs on one client; the first failure ends them.
Status dma_gets(Peer& peer, Share& share, Tally& tally, std::uint64_t operations) {
  for (std::uint64_t done = 0; done < operations; ++done) {
    if (!one_operation(Kind::kDma, true, peer, share, tally)) {
      return fail(ErrorCode::kFabric, tally.first_problem);
    }
  }
  return {};
}

}  // namespace

// `--cpu-check N`: the server's CPU time per DMA.GET of the first size, over N GETs on one
// client after a warm-up of N/10 (nothing else runs on the server meanwhile).
Status cpu_check(const RedisOptions& options, std::uint64_t count, Progress& progress) {
  DMA_TRY_ASSIGN(Connected connected, connect_run(options, 1));
  Peer& peer = connected.peers[0];
  const std::size_t size = options.sizes.front();
  DMA_TRY_ASSIGN(Share share, make_share(peer, size, std::clamp<std::size_t>(
                                                         kWorkingSetBytes / size, 1, 8),
                                         0, 4343));
  Tally tally;
  auto run = [&](std::uint64_t operations) { return dma_gets(peer, share, tally, operations); };
  DMA_TRY(run(std::max<std::uint64_t>(count / 10, 1)));
  DMA_TRY_ASSIGN(const double before, server_cpu_seconds(*peer.plain));
  progress.note("cpu check: " + std::to_string(count) + " DMA.GETs of " + format_size(size));
  const auto started = Clock::now();
  DMA_TRY(run(count));
  const double seconds = std::chrono::duration<double>(Clock::now() - started).count();
  DMA_TRY_ASSIGN(const double after, server_cpu_seconds(*peer.plain));
  std::printf("cpu check (%s): %llu DMA.GETs of %s in %.2f s; server CPU %.3f s, %.1f us per GET "
              "(%.0f %% of a core); %llu mismatches\n",
              options.provider.c_str(), static_cast<unsigned long long>(count),
              format_size(size).c_str(), seconds, after - before,
              (after - before) * 1e6 / static_cast<double>(count),
              seconds > 0 ? 100.0 * (after - before) / seconds : 0.0,
              static_cast<unsigned long long>(tally.mismatches));
  std::fflush(stdout);
  DMA_TRY(delete_share(peer, share));
  if (tally.mismatches != 0) {
    return fail(ErrorCode::kCorrupted, std::to_string(tally.mismatches) + " mismatches");
  }
  return {};
}

// `--memory-check N`: the server's RSS (VmRSS of the server started here, else INFO's
// used_memory_rss) before, during (after each tenth) and after N 4 KiB DMA.GETs on one client,
// after a warm-up of N/10, so allocator growth that settles is not counted as a leak.
Status memory_check(const RedisOptions& options, std::uint64_t count, Progress& progress) {
  DMA_TRY_ASSIGN(Connected connected, connect_run(options, 1));
  Peer& peer = connected.peers[0];
  DMA_TRY_ASSIGN(Share share, make_share(peer, 4096, kMaxKeysPerClient, 0, 4242));
  Tally tally;
  auto run = [&](std::uint64_t operations) { return dma_gets(peer, share, tally, operations); };
  auto rss = [&]() -> std::uint64_t {
    if (connected.server) return connected.server->rss_bytes().value_or(0);
    return static_cast<std::uint64_t>(peer.plain->info_field("memory", "used_memory_rss").value_or(0));
  };
  progress.note("memory check: warm-up of " + std::to_string(count / 10) + " DMA.GETs of 4k");
  DMA_TRY(run(count / 10));
  const std::uint64_t before = rss();
  const auto used_before = peer.plain->info_field("memory", "used_memory").value_or(0);
  progress.note("memory check: " + std::to_string(count) + " DMA.GETs of 4k");
  // RSS after each tenth: a leak grows in steps with the count, allocator growth levels off.
  std::string samples = std::to_string(before >> 10);
  const auto started = Clock::now();
  for (std::uint64_t tenth = 0; tenth < 10; ++tenth) {
    const std::uint64_t chunk = count / 10 + (tenth < count % 10 ? 1 : 0);
    DMA_TRY(run(chunk));
    samples += " " + std::to_string(rss() >> 10);
    progress.note("memory check: " + std::to_string(tenth + 1) + "/10, server RSS KiB: " + samples);
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - started).count();
  const std::uint64_t after = rss();
  const auto used_after = peer.plain->info_field("memory", "used_memory").value_or(0);
  std::printf(
      "memory check (%s): %llu DMA.GETs of 4k in %.1f s (%.0f ops/s), %llu mismatches; "
      "server RSS %.1f MiB -> %.1f MiB (%+.1f MiB), used_memory %.1f MiB -> %.1f MiB; "
      "RSS KiB at each tenth: %s\n",
      options.provider.c_str(), static_cast<unsigned long long>(count), seconds,
      seconds > 0 ? count / seconds : 0.0, static_cast<unsigned long long>(tally.mismatches),
      before / 1048576.0, after / 1048576.0,
      (static_cast<double>(after) - static_cast<double>(before)) / 1048576.0,
      used_before / 1048576.0, used_after / 1048576.0, samples.c_str());
  std::fflush(stdout);
  DMA_TRY(delete_share(peer, share));
  if (tally.mismatches != 0) {
    return fail(ErrorCode::kCorrupted, std::to_string(tally.mismatches) + " mismatches");
  }
  return {};
}
}  // namespace dma::bench
