// The shm provider's /dev/shm regions: named per process incarnation, and swept when their
// process is gone. A SIGKILLed process leaves its 16 MiB region behind; without the sweep they
// pile up in RAM, and when the kernel recycles the dead process's pid, the new process's first
// shm endpoint fails (fi_enable: -FI_EBUSY) because "its" region name is taken.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <chrono>
#include <csignal>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "dma/protocol.hpp"
#include "dma/target.hpp"
#include "child_process.hpp"
#include "fixtures.hpp"
#include "fabric/liveness_mark.hpp"
#include "fabric/peer_process.hpp"
#include "fabric/shm_regions.hpp"

namespace dma {
namespace {

namespace fs = std::filesystem;
using internal::PeerProcess;
using internal::process_start_time;
using internal::shm_address_owner;
using internal::ShmOwner;
using internal::shm_source_address;
using internal::sweep_stale_shm_regions;

const std::string kCli = DMA_BINARY_DIR "/bin/dma-cli";

// The advertisement a `dma-cli target` child prints first (a fatal failure if it prints none).
void read_advertisement(testing::Child& target, Advertisement& advertisement) {
  ASSERT_TRUE(target.running());
  const std::string wire = target.read_line();
  auto parsed = parse_advertisement(wire);
  ASSERT_TRUE(parsed) << "'" << wire << "': " << parsed.error().describe();
  advertisement = *std::move(parsed);
}

// A scratch directory standing in for /dev/shm, removed at the end.
class ScratchDirectory {
 public:
  ScratchDirectory() {
    path_ = fs::temp_directory_path() / ("dma-shm-test." + std::to_string(::getpid()));
    fs::create_directories(path_);
  }
  ~ScratchDirectory() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  const fs::path& path() const { return path_; }
  fs::path touch(const std::string& name) const {
    std::ofstream(path_ / name) << "region";
    return path_ / name;
  }

 private:
  fs::path path_;
};

// The /dev/shm file behind a shm address ("fi_shm://NAME\0" -> /dev/shm/NAME).
fs::path region_file(std::span<const std::uint8_t> address) {
  std::string text(address.begin(), address.end());
  if (const auto nul = text.find('\0'); nul != std::string::npos) text.resize(nul);
  constexpr std::string_view kScheme = "fi_shm://";
  EXPECT_EQ(0u, text.rfind(kScheme, 0)) << text;
  return fs::path("/dev/shm") / text.substr(kScheme.size());
}

std::vector<std::uint8_t> bytes_of(std::string_view text) {
  return std::vector<std::uint8_t>(text.begin(), text.end());
}

TEST(ShmRegions, this_process_is_named_by_its_pid_and_start_time) {
  // If this fails, a recycled pid reuses a dead process's region name and shm cannot open.
  const auto start = process_start_time(::getpid());
  ASSERT_TRUE(start);
  EXPECT_EQ("fi_shm://dma." + std::to_string(::getpid()) + "." + std::to_string(*start),
            shm_source_address());
}

TEST(ShmRegions, a_region_of_a_recycled_pid_is_stale_and_a_live_one_is_kept) {
  // If this fails, either dead regions leak in /dev/shm or a live process loses its region.
  ScratchDirectory directory;
  const std::string pid = std::to_string(::getpid());
  const std::string start = std::to_string(process_start_time(::getpid()).value());
  const fs::path live = directory.touch("dma." + pid + "." + start + ":0:0");
  const fs::path live_second = directory.touch("dma." + pid + "." + start + ":0:1");
  const fs::path recycled = directory.touch("dma." + pid + "." + start + "1:0:0");
  const fs::path not_ours = directory.touch(pid + ":0:0");
  const fs::path malformed = directory.touch("dma.x.y:0:0");
  EXPECT_EQ(1u, sweep_stale_shm_regions(directory.path()));
  EXPECT_TRUE(fs::exists(live));
  EXPECT_TRUE(fs::exists(live_second));
  EXPECT_FALSE(fs::exists(recycled));
  EXPECT_TRUE(fs::exists(not_ours)) << "regions we did not name are left to their owners";
  EXPECT_TRUE(fs::exists(malformed));
}

TEST(ShmRegions, a_region_of_a_pid_that_no_longer_exists_is_removed) {
  // If this fails, every crashed process costs 16 MiB of RAM until reboot.
  ScratchDirectory directory;
  // A pid above pid_max's ceiling (2^22) never exists.
  const fs::path dead = directory.touch("dma.4194305.123:0:0");
  EXPECT_EQ(1u, sweep_stale_shm_regions(directory.path()));
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_EQ(0u, sweep_stale_shm_regions(directory.path() / "missing"));
}

TEST(ShmRegions, a_killed_target_s_region_is_swept_by_the_next_shm_endpoint) {
  // If this fails, SIGKILLed shm clients leave their regions in /dev/shm for good.
  testing::Child target({kCli, "target", "--provider", "shm", "--size", "4096"});
  Advertisement advertisement;
  ASSERT_NO_FATAL_FAILURE(read_advertisement(target, advertisement));
  const fs::path region = region_file(advertisement.address);
  ASSERT_TRUE(fs::exists(region)) << region;
  target.kill_now();
  ASSERT_TRUE(fs::exists(region)) << "shm unlinked a SIGKILLed process's region itself";

  auto opened = Target::open(testing::loopback("shm"));
  ASSERT_TRUE(opened) << opened.error().describe();
  EXPECT_FALSE(fs::exists(region)) << region << " outlived its process";
  EXPECT_TRUE(fs::exists(region_file((*opened)->local_address())));
}

TEST(PeerProcess, an_shm_address_names_its_owning_process_and_nothing_else_does) {
  // If this fails, the worker cannot tell a dead shm peer from a live one, and posts to a
  // process that died holding its queue lock, where the post never returns.
  using Owner = std::optional<ShmOwner>;
  EXPECT_EQ(Owner(ShmOwner{1234, 5678}), shm_address_owner(bytes_of("fi_shm://dma.1234.5678:0:0")));
  std::string with_nul = "fi_shm://dma.1234.5678:0:0";  // as fi_getname returns it
  with_nul.push_back('\0');
  EXPECT_EQ(Owner(ShmOwner{1234, 5678}), shm_address_owner(bytes_of(with_nul)));
  EXPECT_EQ(Owner(ShmOwner{42, std::nullopt}), shm_address_owner(bytes_of("fi_shm://42:0:3")));
  EXPECT_EQ(Owner(), shm_address_owner(bytes_of("fi_shm://42")));
  EXPECT_EQ(Owner(), shm_address_owner(bytes_of("fi_shm://dma.x.1:0:0")));
  EXPECT_EQ(Owner(), shm_address_owner(bytes_of("fi_shm://0:0:0")));
  EXPECT_EQ(Owner(), shm_address_owner(bytes_of("fi_shm://99999999999:0:0")));
  EXPECT_EQ(Owner(), shm_address_owner(bytes_of("fi_shm://named-by-hand")));
  EXPECT_EQ(Owner(), shm_address_owner(bytes_of("fi_sockets://127.0.0.1:5000")));
  EXPECT_EQ(Owner(), shm_address_owner(bytes_of("")));
  const std::uint8_t sockaddr_in[16] = {2, 0, 0x13, 0x88, 127, 0, 0, 1};
  EXPECT_EQ(Owner(), shm_address_owner(sockaddr_in));
}

TEST(PeerProcess, a_killed_peer_is_seen_as_exited_before_it_is_reaped) {
  // If this fails, transfers to a dead shm client are posted into its region, and one whose
  // owner died holding the region's lock hangs the fabric worker for good.
  testing::Child target({kCli, "target", "--provider", "shm", "--size", "4096"});
  Advertisement advertisement;
  ASSERT_NO_FATAL_FAILURE(read_advertisement(target, advertisement));
  const auto owner = shm_address_owner(advertisement.address);
  ASSERT_TRUE(owner) << to_wire(advertisement);
  EXPECT_EQ(target.pid(), owner->pid);
  PeerProcess watch(*owner);
  EXPECT_FALSE(watch.exited());
  EXPECT_FALSE(watch.exited()) << "asking twice changes nothing";
  const auto asked = std::chrono::steady_clock::now();
  EXPECT_FALSE(watch.exited(asked, std::chrono::hours(1))) << "the first timed question asks";
  // Dead but not reaped (a zombie): the parent (this test) has not waited for it yet.
  ASSERT_EQ(0, ::kill(target.pid(), SIGKILL));
  // An answer younger than max_age is reused without asking (the worker's retries after
  // -FI_EAGAIN skip the syscall), whatever happened since.
  EXPECT_FALSE(watch.exited(asked + std::chrono::minutes(59), std::chrono::hours(1)));
  const auto deadline = std::chrono::steady_clock::now() + testing::kDeadline;
  while (!watch.exited() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
  }
  EXPECT_TRUE(watch.exited()) << "a SIGKILLed peer was never seen to exit";
  EXPECT_TRUE(watch.exited(asked + std::chrono::minutes(1), std::chrono::hours(1)))
      << "once seen, an exit is never forgotten";
  target.kill_now();
  EXPECT_TRUE(watch.exited()) << "exited stays true";
}

TEST(PeerProcess, one_question_per_channel_batch_answers_every_transfer_taken_in_it) {
  // If this fails, either the worker asks the kernel once per transfer again (a poll(2) per
  // transfer, a third of the worker's time at 64 B on shm), or a transfer taken from the channel
  // after its peer died is answered "alive" from an older question and posted into a region
  // whose lock the dead peer may hold.
  testing::Child target({kCli, "target", "--provider", "shm", "--size", "4096"});
  Advertisement advertisement;
  ASSERT_NO_FATAL_FAILURE(read_advertisement(target, advertisement));
  const auto owner = shm_address_owner(advertisement.address);
  ASSERT_TRUE(owner) << to_wire(advertisement);
  PeerProcess watch(*owner);
  PeerProcess probe(*owner);  // asks afresh each time: tells when the kernel shows the exit
  // Batch 1: the first transfer asks; the question serves the rest of its batch.
  EXPECT_FALSE(watch.exited_for_batch(1, 1));
  ASSERT_EQ(0, ::kill(target.pid(), SIGKILL));
  const auto deadline = std::chrono::steady_clock::now() + testing::kDeadline;
  while (!probe.exited() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
  }
  ASSERT_TRUE(probe.exited()) << "a SIGKILLed peer was never seen to exit";
  EXPECT_FALSE(watch.exited_for_batch(1, 1))
      << "a transfer of batch 1 is answered by the question asked while handling batch 1";
  EXPECT_FALSE(watch.exited_for_batch(1, 2))
      << "a transfer of batch 1 still waiting in batch 2 was covered by batch 1's question";
  EXPECT_TRUE(watch.exited_for_batch(2, 2))
      << "batch 2 left the channel after the death could be seen: it must ask again";
  EXPECT_TRUE(watch.exited_for_batch(1, 3)) << "once seen, an exit is never forgotten";
  target.kill_now();
}

TEST(LivenessMark, a_targets_mark_says_alive_without_a_syscall_and_dead_as_soon_as_its_pidfd_does) {
  // If this fails, either every transfer to an shm client asks the kernel by poll(2) again
  // (a third of the worker's time at 64 B), or the mark answers "alive" for a process whose
  // exit could already be seen, and a transfer is posted into a dead peer's region.
  testing::Child target({kCli, "target", "--provider", "shm", "--size", "4096"});
  Advertisement advertisement;
  ASSERT_NO_FATAL_FAILURE(read_advertisement(target, advertisement));
  const auto owner = shm_address_owner(advertisement.address);
  ASSERT_TRUE(owner) << to_wire(advertisement);
  PeerProcess watch(*owner, advertisement.address);
  PeerProcess probe(*owner);  // no mark: asks the pidfd every time
  auto deadline = std::chrono::steady_clock::now() + testing::kDeadline;
  while (!watch.marked() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
  }
  ASSERT_TRUE(watch.marked()) << "the target's progress thread never held its mark";
  EXPECT_FALSE(watch.exited_for_batch(1, 1));
  ASSERT_EQ(0, ::kill(target.pid(), SIGKILL));
  deadline = std::chrono::steady_clock::now() + testing::kDeadline;
  while (!probe.exited() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
  }
  ASSERT_TRUE(probe.exited()) << "a SIGKILLed peer was never seen to exit";
  // Without the mark, batch 1's earlier answer would stand (see the test above); the mark is
  // read afresh and already shows the death the pidfd shows.
  EXPECT_TRUE(watch.exited_for_batch(1, 1)) << "the pidfd shows the exit and the mark does not";
  EXPECT_TRUE(watch.exited(std::chrono::steady_clock::now(), std::chrono::hours(1)));
  target.kill_now();
}

TEST(LivenessMark, a_closed_target_leaves_no_mark_and_its_watchers_fall_back_to_the_pidfd) {
  // If this fails, a closed Target leaks a file in /dev/shm, or a watcher keeps reading
  // "alive" from a mark nobody holds.
  const long self = ::getpid();
  const auto start = process_start_time(self);
  ASSERT_TRUE(start);
  Configuration configuration;
  configuration.providers = {"shm"};
  auto target = Target::open(configuration, {});
  ASSERT_TRUE(target) << target.error().describe();
  const std::vector<std::uint8_t> address((*target)->local_address().begin(),
                                          (*target)->local_address().end());
  const std::string name = internal::liveness_file_name(address);
  ASSERT_FALSE(name.empty());
  EXPECT_TRUE(std::filesystem::exists("/dev/shm/" + name));
  PeerProcess watch(ShmOwner{self, *start}, address);
  const auto deadline = std::chrono::steady_clock::now() + testing::kDeadline;
  while (!watch.marked() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
  }
  EXPECT_TRUE(watch.marked());
  EXPECT_FALSE(watch.exited_for_batch(1, 1));
  target->reset();
  EXPECT_FALSE(std::filesystem::exists("/dev/shm/" + name)) << "the mark's file outlived its target";
  EXPECT_FALSE(watch.marked()) << "released: the mark says nothing now";
  EXPECT_FALSE(watch.exited_for_batch(2, 2)) << "asked by the pidfd: this process is alive";
  EXPECT_EQ(nullptr, internal::LivenessWatch::open(address, ShmOwner{self, *start}));
  EXPECT_EQ("", internal::liveness_file_name(std::vector<std::uint8_t>{'f', 'i', '_', 's'}));
}

TEST(LivenessMark, each_ring_of_a_watcher_wakes_a_target_asleep_on_its_mark) {
  // If this fails, a transfer posted to an idle shm target waits for the target's next timed
  // poll: the doorbell does not wake it, or a ring is lost (here the interval is an hour, so a
  // lost ring fails at the test deadline).
  const long self = ::getpid();
  const auto start = process_start_time(self);
  ASSERT_TRUE(start);
  Configuration configuration;
  configuration.providers = {"shm"};
  // The test rings through a watch on the Target's own mark file, as a worker does.
  Target::Options options;
  options.poll_interval = std::chrono::hours(1);
  auto target = Target::open(configuration, {}, options);
  ASSERT_TRUE(target) << target.error().describe();
  auto watch = internal::LivenessWatch::open((*target)->local_address(), ShmOwner{self, *start});
  ASSERT_NE(nullptr, watch);
  auto deadline = std::chrono::steady_clock::now() + testing::kDeadline;
  while (watch->state() != internal::LivenessWatch::State::kAlive &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
  }
  ASSERT_EQ(internal::LivenessWatch::State::kAlive, watch->state());
  // Each ring makes the target poll: the count moves without any timer.
  for (int ring = 0; ring < 20; ++ring) {
    const std::uint64_t before = (*target)->progress_polls();
    watch->ring();
    deadline = std::chrono::steady_clock::now() + testing::kDeadline;
    while ((*target)->progress_polls() == before && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::yield();
    }
    ASSERT_GT((*target)->progress_polls(), before) << "ring " << ring << " did not wake the target";
    // Let it linger out and fall asleep again before the next ring, some of the time.
    if (ring % 2 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

TEST(PeerProcess, an_address_of_a_gone_or_recycled_process_is_exited_from_the_start) {
  // If this fails, a client whose pid the kernel gave to another process is taken for alive.
  const long self = ::getpid();
  const std::uint64_t start = process_start_time(self).value();
  EXPECT_FALSE(PeerProcess(ShmOwner{self, start}).exited());
  EXPECT_FALSE(PeerProcess(ShmOwner{self, std::nullopt}).exited());
  EXPECT_TRUE(PeerProcess(ShmOwner{self, start + 1}).exited()) << "another incarnation of the pid";
  // A pid above pid_max's ceiling (2^22) never exists.
  EXPECT_TRUE(PeerProcess(ShmOwner{4194305, std::nullopt}).exited());
}

}  // namespace
}  // namespace dma
