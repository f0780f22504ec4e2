#include "fabric_bench.hpp"

#include <CLI/CLI.hpp>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>
#include <thread>

#include "commands.hpp"
#include "dma/protocol.hpp"
#include "fabric_target.hpp"
#include "ours_loop.hpp"
#include "raw_fabric.hpp"
#include "support/child_process.hpp"
#include "support/command_line.hpp"
#include "support/cpu.hpp"
#include "support/pattern.hpp"

namespace dma::bench {
namespace {

using support::ChildProcess;

using Clock = std::chrono::steady_clock;
constexpr auto kReplyTimeout = std::chrono::seconds(30);
// Hot: the slots of a case fit in cache together; cold: they span this much, cycled through.
constexpr std::size_t kHotBytes = std::size_t{1} << 20;
constexpr std::size_t kMaxHotSlots = 64;
constexpr std::size_t kColdBytes = std::size_t{256} << 20;
constexpr auto kWarmup = std::chrono::milliseconds(150);
constexpr auto kRound = std::chrono::milliseconds(200);
constexpr std::size_t kMinRounds = 5, kMaxRounds = 16;
// Distinct patterns per buffer, so bytes from the wrong side or a stale slot do not verify.
constexpr std::uint32_t kOursLocalSeed = 11, kRawLocalSeed = 12;
constexpr std::uint32_t kOursTargetSeed = 21, kRawTargetSeed = 22;

std::size_t slots_for(std::size_t size, bool cold) {
  if (cold) return std::max<std::size_t>(2, (kColdBytes + size - 1) / size);
  return std::clamp<std::size_t>(kHotBytes / size, 1, kMaxHotSlots);
}

std::size_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  std::size_t total = 0, resident = 0;
  statm >> total >> resident;
  return resident * static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
}

// Page-aligned initiator memory, filled with a pattern. Owned by run_fabric.
class LocalBuffer {
 public:
  static Result<LocalBuffer> create(std::size_t bytes, std::uint32_t seed) {
    const std::size_t rounded = (bytes + 4095) / 4096 * 4096;
    auto* data = static_cast<std::byte*>(std::aligned_alloc(4096, rounded));
    if (data == nullptr) {
      return fail(ErrorCode::kResourceExhausted, "cannot allocate " + std::to_string(bytes) + " bytes");
    }
    support::fill_pattern(std::span(data, bytes), seed);
    return LocalBuffer(data);
  }
  std::byte* data() const noexcept { return data_.get(); }

 private:
  struct Free {
    void operator()(std::byte* p) const noexcept { std::free(p); }
  };
  explicit LocalBuffer(std::byte* data) : data_(data) {}
  std::unique_ptr<std::byte, Free> data_;
};

// One target child: its process and what it advertised.
struct TargetChild {
  std::unique_ptr<ChildProcess> process;
  Advertisement advertisement;
};

Result<TargetChild> start_target(const FabricOptions& options, const std::string& kind,
                                 std::size_t bytes, std::uint32_t seed) {
  std::error_code error;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", error);
  if (error) return fail(ErrorCode::kNotFound, "cannot find my own executable: " + error.message());
  // stderr is inherited so the child's diagnostics show.
  DMA_TRY_ASSIGN(
      auto process,
      ChildProcess::spawn({self.string(), "fabric-target", "--kind", kind, "--provider",
                           options.provider, "--bind", options.bind, "--bytes",
                           std::to_string(bytes), "--seed", std::to_string(seed), "--poll-us",
                           std::to_string(options.target_poll_interval.count()), "--cpu",
                           options.pin ? "1" : "-1", "--parent", std::to_string(::getpid())}));
  auto wire = process->read_line(kReplyTimeout);
  if (!wire) {
    return fail(wire.error().code(), "the " + kind + " target did not start: " + wire.error().message());
  }
  auto advertisement = parse_advertisement(*wire);
  if (!advertisement) {
    return fail(ErrorCode::kFabric, "the " + kind + " target printed '" + *wire + "': " +
                                        advertisement.error().message());
  }
  return TargetChild{std::move(process), std::move(*advertisement)};
}

Status introduce(TargetChild& target, std::span<const std::uint8_t> initiator, const char* kind) {
  DMA_TRY_ASSIGN(const std::string answer,
                 target.process->ask("initiator " + hex_encode(initiator), kReplyTimeout));
  if (answer != "ok") {
    return fail(ErrorCode::kFabric, std::string("the ") + kind + " target refused our address: " + answer);
  }
  return {};
}

// CRC32C of the target's bytes for `slot` against ours: true when they match.
Result<bool> verify_slot(TargetChild& target, const std::byte* local, std::size_t size,
                         std::size_t slot) {
  DMA_TRY_ASSIGN(const std::string theirs,
                 target.process->ask("crc " + std::to_string(slot * size) + " " +
                                         std::to_string(size),
                                     kReplyTimeout));
  const std::uint32_t ours = crc32c(std::span<const std::byte>(local + slot * size, size));
  return theirs == std::to_string(ours);
}

// Runs `body` with the other side's target frozen (SIGSTOP until every thread has stopped):
// a busy-polling target spins whether or not anything comes to it, and on two cores the idle
// side's spinning took a core from the side being measured.
template <typename Body>
Status with_frozen(TargetChild& idle, Body&& body) {
  DMA_TRY(idle.process->freeze());
  Status status = body();
  DMA_TRY(idle.process->thaw());
  return status;
}

// Everything one run holds; member order is teardown order (the initiators go before the
// children they talk to, so nothing in flight outlives its peer).
struct Bench {
  explicit Bench(const FabricOptions& o) : options(o), write(o.op == "write") {}
  const FabricOptions& options;
  bool write;
  std::optional<LocalBuffer> ours_local;
  std::optional<LocalBuffer> raw_local;
  TargetChild ours_target;
  TargetChild raw_target;
  std::unique_ptr<RawEndpoint> raw;
  fi_addr_t raw_peer = FI_ADDR_UNSPEC;
  std::unique_ptr<OursLoop> ours;
  std::size_t ours_slot = 0;
  std::size_t raw_slot = 0;
  std::size_t rss_before = 0;
  std::size_t rss_after = 0;
};

struct Side {
  Measurement measurement;
  LatencySamples samples;
  std::uint64_t allocations = 0;
};

Status ours_round(Bench& bench, std::size_t size, std::size_t depth, std::size_t slots,
                  std::chrono::nanoseconds duration, Side* side) {
  OursJob job;
  job.direction = bench.write ? Direction::kToPeer : Direction::kFromPeer;
  job.local = bench.ours_local->data();
  job.size = size;
  job.slots = slots;
  job.depth = depth;
  job.remote = bench.ours_target.advertisement.remote_address;
  job.key = bench.ours_target.advertisement.key;
  job.first_slot = bench.ours_slot % slots;
  job.duration = duration;
  LatencySamples discard;
  LatencySamples round;
  if (side != nullptr) round.reserve(std::max<std::size_t>(1 << 16, 4'000'000 * duration.count() / 1'000'000'000));
  if (bench.rss_before == 0) bench.rss_before = resident_bytes();
  OursRun run;
  double cpu = 0;
  DMA_TRY(with_frozen(bench.raw_target, [&]() -> Status {
    const double cpu_before = process_cpu_seconds();
    DMA_TRY_ASSIGN(run, bench.ours->run_window(job, side != nullptr ? round : discard));
    cpu = process_cpu_seconds() - cpu_before;
    return {};
  }));
  bench.rss_after = resident_bytes();
  bench.ours_slot = run.next_slot;
  if (run.first_error) {
    std::fprintf(stderr, "dma-bench fabric: ours: %s\n", run.first_error->describe().c_str());
  }
  if (bench.ours_target.process->exited()) return fail(ErrorCode::kWorkerGone, "our target process died");
  bool verified = true;
  if (run.last_slot) {
    DMA_TRY_ASSIGN(verified, verify_slot(bench.ours_target, bench.ours_local->data(), size, *run.last_slot));
  }
  if (side == nullptr) return {};
  Measurement& m = side->measurement;
  m.operations += run.operations;
  m.bytes += run.bytes;
  m.errors += run.errors;
  m.seconds += run.seconds;
  m.mismatches += verified ? 0 : 1;
  side->allocations += run.allocations;
  m.eagain = m.eagain.value_or(0) + run.eagain;
  m.cpu_seconds = m.cpu_seconds.value_or(0) + cpu;
  side->samples.merge(round);
  return {};
}

Status raw_round(Bench& bench, std::size_t size, std::size_t depth, std::size_t slots,
                 std::chrono::nanoseconds duration, Side* side) {
  RawJob job;
  job.write = bench.write;
  job.local = bench.raw_local->data();
  job.size = size;
  job.slots = slots;
  job.depth = depth;
  job.remote = bench.raw_target.advertisement.remote_address;
  job.key = bench.raw_target.advertisement.key;
  job.peer = bench.raw_peer;
  job.first_slot = bench.raw_slot % slots;
  job.duration = duration;
  LatencySamples round;
  round.reserve(side != nullptr ? std::max<std::size_t>(1 << 16, 4'000'000 * duration.count() / 1'000'000'000) : 0);
  RawRun run;
  double cpu = 0;
  DMA_TRY(with_frozen(bench.ours_target, [&]() -> Status {
    const double cpu_before = process_cpu_seconds();
    DMA_TRY_ASSIGN(run, run_raw_window(*bench.raw, job, round));
    cpu = process_cpu_seconds() - cpu_before;
    return {};
  }));
  bench.raw_slot = run.next_slot;
  if (bench.raw_target.process->exited()) return fail(ErrorCode::kWorkerGone, "the raw target process died");
  bool verified = true;
  if (run.last_slot) {
    DMA_TRY_ASSIGN(verified, verify_slot(bench.raw_target, bench.raw_local->data(), size, *run.last_slot));
  }
  if (side == nullptr) return {};
  Measurement& m = side->measurement;
  m.operations += run.operations;
  m.bytes += run.bytes;
  m.errors += run.errors;
  m.seconds += run.seconds;
  m.mismatches += verified ? 0 : 1;
  m.eagain = m.eagain.value_or(0) + run.eagain;
  m.cpu_seconds = m.cpu_seconds.value_or(0) + cpu;
  side->samples.merge(round);
  return {};
}

// What `now` counted since `before` (one round's operations, bytes and time).
Measurement since(const Measurement& now, const Measurement& before) {
  Measurement delta;
  delta.operations = now.operations - before.operations;
  delta.bytes = now.bytes - before.bytes;
  delta.seconds = now.seconds - before.seconds;
  return delta;
}

void finish_side(Side& side) {
  side.measurement.p50_us = side.samples.quantile_us(0.50);
  side.measurement.p99_us = side.samples.quantile_us(0.99);
}

Result<Case> run_case(Bench& bench, std::size_t size, std::size_t depth) {
  const std::size_t slots = slots_for(size, bench.options.cold);
  // Unmeasured warm-up: connections, the channel's and the worker's pools, the caches' state.
  DMA_TRY(ours_round(bench, size, depth, slots, kWarmup, nullptr));
  DMA_TRY(raw_round(bench, size, depth, slots, kWarmup, nullptr));

  const auto total = bench.options.duration;
  // Short rounds interleave better, but a round must outlast two waves of `depth` transfers
  // (at ~1 GB/s, the slow end here) or it counts nothing (a transfer completing after the
  // window is not counted): 16m x 64 is 1 GiB per wave. At least kMinRounds, so the median and
  // spread of the round ratios mean something, even if the case then outlasts --duration.
  const auto wave = std::chrono::milliseconds(size * depth / 1'000'000);
  const auto shortest = std::max<std::chrono::milliseconds>(kRound, 2 * wave);
  const std::size_t rounds =
      std::clamp<std::size_t>(total / shortest, kMinRounds, kMaxRounds);
  const auto each = std::max<std::chrono::nanoseconds>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(total) / rounds, shortest);
  Side ours;
  Side raw;
  std::vector<Round> round_figures;
  for (std::size_t round = 0; round < rounds; ++round) {
    // Alternate which side goes first, so a drift in machine load hits both alike.
    const bool ours_first = round % 2 == 0;
    const Measurement ours_before = ours.measurement;
    const Measurement raw_before = raw.measurement;
    for (int turn = 0; turn < 2; ++turn) {
      const bool ours_turn = (turn == 0) == ours_first;
      DMA_TRY(ours_turn ? ours_round(bench, size, depth, slots, each, &ours)
                        : raw_round(bench, size, depth, slots, each, &raw));
    }
    round_figures.push_back(round_of(since(ours.measurement, ours_before),
                                     since(raw.measurement, raw_before), size));
  }
  finish_side(ours);
  finish_side(raw);
  if (ours.measurement.operations > 0) {
    ours.measurement.allocations_per_op =
        static_cast<double>(ours.allocations) / static_cast<double>(ours.measurement.operations);
  }
  Case row;
  row.mode = "fabric";
  row.provider = bench.options.provider;
  row.op = bench.options.op;
  row.size = size;
  row.depth = depth;
  row.label = "dma";
  row.baseline_label = "raw libfabric";
  row.ours = ours.measurement;
  row.baseline = raw.measurement;
  row.rounds = std::move(round_figures);
  return row;
}

Status validate(const FabricOptions& options) {
  if (options.op != "write" && options.op != "read") {
    return fail(ErrorCode::kInvalidArgument, "--op must be write or read, not '" + options.op + "'");
  }
  if (options.sizes.empty() || options.depths.empty()) {
    return fail(ErrorCode::kInvalidArgument, "--sizes and --depth need at least one entry");
  }
  if (options.duration.count() <= 0) return fail(ErrorCode::kInvalidArgument, "--duration must be positive");
  if (options.ours_target != "ours" && options.ours_target != "raw") {
    return fail(ErrorCode::kInvalidArgument, "--ours-target must be ours or raw");
  }
  return {};
}

}  // namespace

Result<FabricRun> run_fabric_detailed(const FabricOptions& options, Progress& progress) {
  DMA_TRY(validate(options));
  std::optional<support::ScopedCpuPin> pinned;  // until the run ends: what follows is not pinned
  if (options.pin) {
    // This thread starts the service's worker and runs the raw loop: both inherit CPU 0.
    if (std::thread::hardware_concurrency() < 2) {
      return fail(ErrorCode::kInvalidArgument, "--pin needs at least two CPUs");
    }
    DMA_TRY_ASSIGN(auto pin, support::ScopedCpuPin::pin(0));
    pinned.emplace(std::move(pin));
  }
  std::size_t bytes = 0;
  for (std::size_t size : options.sizes) bytes = std::max(bytes, size * slots_for(size, options.cold));
  const std::size_t max_depth = *std::max_element(options.depths.begin(), options.depths.end());

  Bench bench(options);
  DMA_TRY_ASSIGN(bench.ours_local, LocalBuffer::create(bytes, kOursLocalSeed));
  DMA_TRY_ASSIGN(bench.raw_local, LocalBuffer::create(bytes, kRawLocalSeed));
  DMA_TRY_ASSIGN(bench.ours_target, start_target(options, options.ours_target, bytes, kOursTargetSeed));
  DMA_TRY_ASSIGN(bench.raw_target, start_target(options, "raw", bytes, kRawTargetSeed));

  DMA_TRY_ASSIGN(bench.raw, RawEndpoint::open(options.provider, RawRole::kInitiator, options.bind));
  DMA_TRY_ASSIGN(bench.raw_peer, bench.raw->insert(bench.raw_target.advertisement.address));
  DMA_TRY(introduce(bench.raw_target, bench.raw->address(), "raw"));

  Configuration configuration;
  configuration.providers = {options.provider};
  configuration.bind = options.bind;
  configuration.max_in_flight = max_depth;
  // A transfer that never completes must not hold the service's destructor for 30 s.
  configuration.completion_deadline = std::chrono::milliseconds(5000);
  // Whole transfers, as the raw loop posts them: the same piece sizes on both sides. (By default
  // the service splits a write over tcp into 512 KiB pieces, which moves it faster; the raw
  // loop has no pieces, and a baseline without them would flatter ours.)
  configuration.max_piece_bytes = std::numeric_limits<std::size_t>::max();
  DMA_TRY_ASSIGN(bench.ours,
                 OursLoop::start(configuration, bench.ours_target.advertisement.address, max_depth));
  if (bench.ours->describe().max_in_flight < max_depth) {
    return fail(ErrorCode::kInvalidArgument,
                "depth " + std::to_string(max_depth) + " exceeds the provider's queue (" +
                    std::to_string(bench.ours->describe().max_in_flight) + ")");
  }
  DMA_TRY(introduce(bench.ours_target, bench.ours->local_address(), "ours"));

  FabricRun result;
  for (std::size_t size : options.sizes) {
    for (std::size_t depth : options.depths) {
      progress.start_case("fabric " + options.provider + " " + options.op + " " + format_size(size) +
                          " depth " + std::to_string(depth));
      DMA_TRY_ASSIGN(Case row, run_case(bench, size, depth));
      result.cases.push_back(std::move(row));
      progress.finish_case();
    }
  }
  result.rss_before_bytes = bench.rss_before;
  result.rss_after_bytes = bench.rss_after;

  // Orderly shutdown: initiators first, then ask each target to quit (shm unlinks its region).
  bench.ours.reset();
  bench.raw.reset();
  for (TargetChild* child : {&bench.ours_target, &bench.raw_target}) {
    (void)child->process->write_line("quit");  // it may have exited already: finish() says so
    auto status = child->process->finish(kReplyTimeout);
    if (!status || *status != 0) {
      return fail(ErrorCode::kWorkerGone,
                  "a target did not exit cleanly: " +
                      (status ? "status " + std::to_string(*status) : status.error().message()));
    }
  }
  return result;
}

Result<std::vector<Case>> run_fabric(const FabricOptions& options, Progress& progress) {
  DMA_TRY_ASSIGN(FabricRun run, run_fabric_detailed(options, progress));
  return std::move(run.cases);
}

void add_fabric_commands(CLI::App& app, int* status) {
  struct Arguments {
    FabricOptions options;
    double seconds = 2.0;
    long target_poll_us = 0;
    bool json = false;
    bool show_progress = false;
    TargetOptions target;
    long target_poll = 0;
  };
  auto arguments = std::make_shared<Arguments>();

  CLI::App* fabric = app.add_subcommand(
      "fabric", "FabricService against raw libfabric, same provider, sizes, depth and working set");
  fabric->add_option("--provider", arguments->options.provider, "tcp, net, shm, ...")->capture_default_str();
  fabric->add_option("--op", arguments->options.op, "write (fi_writemsg, delivery complete) or read (fi_read)")
      ->capture_default_str();
  support::add_size_list(*fabric, "--sizes", arguments->options.sizes, "transfer sizes");
  support::add_count_list(*fabric, "--depth", arguments->options.depths, "operations kept in flight");
  fabric->add_option("--duration", arguments->seconds, "seconds per side per case")->capture_default_str();
  fabric->add_flag("--cold", arguments->options.cold, "cycle through >= 256 MiB so caches are cold");
  fabric->add_option("--bind", arguments->options.bind, "local address for IP providers")->capture_default_str();
  fabric->add_option("--target-poll-us", arguments->target_poll_us,
                     "targets sleep this long between progress polls (0 spins; ours on shm polls when rung)")
      ->capture_default_str();
  fabric->add_option("--ours-target", arguments->options.ours_target,
                     "what our initiator runs against: ours (dma::Target) or raw (isolates the initiator)")
      ->capture_default_str();
  fabric->add_flag("--pin", arguments->options.pin,
                   "initiators (our worker, the raw loop) on CPU 0, both targets on CPU 1");
  fabric->add_flag("--json", arguments->json, "one JSON object per case on stdout");
  fabric->add_flag("--progress", arguments->show_progress, "progress lines on stderr even when it is not a terminal");
  fabric->callback([arguments, status] {
    FabricOptions options = arguments->options;
    if (!(arguments->seconds > 0) || arguments->target_poll_us < 0) {
      std::fprintf(stderr, "dma-bench fabric: %s\n",
                   !(arguments->seconds > 0) ? "--duration must be positive"
                                             : "--target-poll-us must not be negative");
      *status = 2;
      return;
    }
    options.duration = std::chrono::milliseconds(static_cast<long>(arguments->seconds * 1000));
    options.target_poll_interval = std::chrono::microseconds(arguments->target_poll_us);
    std::optional<FabricRun> run;
    {
      Progress progress(options.sizes.size() * options.depths.size(), arguments->show_progress);
      auto result = run_fabric_detailed(options, progress);
      if (!result) {
        std::fprintf(stderr, "dma-bench fabric: %s\n", result.error().describe().c_str());
        *status = 1;
        return;
      }
      run = std::move(*result);
    }
    bool clean = true;
    for (const Case& row : run->cases) {
      clean = clean && row.ours.errors + row.baseline.errors + row.ours.mismatches + row.baseline.mismatches == 0;
    }
    if (arguments->json) {
      for (const Case& row : run->cases) std::printf("%s\n", to_json(row).dump().c_str());
    } else {
      std::printf("%s", to_table(run->cases).c_str());
      std::printf("-FI_EAGAIN per completed op (ours / raw):");
      for (const Case& row : run->cases) {
        const auto per_op = [](const Measurement& m) {
          return m.operations > 0 ? static_cast<double>(m.eagain.value_or(0)) / m.operations : 0.0;
        };
        std::printf(" %s/d%zu %.2f/%.2f", format_size(row.size).c_str(), row.depth.value_or(0),
                    per_op(row.ours), per_op(row.baseline));
      }
      std::printf("\n%s", cpu_lines(run->cases, "initiator").c_str());
      std::printf("initiator RSS: %.1f MiB before our first window, %.1f MiB after our last "
                  "(includes the latency sample buffers)\n",
                  run->rss_before_bytes / 1048576.0, run->rss_after_bytes / 1048576.0);
      std::printf("machine: %s\n", describe_machine().c_str());
    }
    std::fflush(stdout);
    if (!clean) std::fprintf(stderr, "dma-bench fabric: errors or mismatches (see the table)\n");
    *status = clean ? 0 : 1;
  });

  CLI::App* target = app.add_subcommand("fabric-target", "");  // hidden: an empty group
  target->group("");
  target->add_option("--kind", arguments->target.kind)->required();
  target->add_option("--provider", arguments->target.provider)->required();
  target->add_option("--bind", arguments->target.bind);
  target->add_option("--bytes", arguments->target.bytes)->required();
  target->add_option("--seed", arguments->target.seed);
  target->add_option("--poll-us", arguments->target_poll);
  target->add_option("--cpu", arguments->target.cpu);
  target->add_option("--parent", arguments->target.parent);
  target->callback([arguments, status] {
    TargetOptions options = arguments->target;
    options.poll_interval = std::chrono::microseconds(std::max<long>(0, arguments->target_poll));
    *status = run_fabric_target(options);
  });
}

}  // namespace dma::bench
