// The shm provider's /dev/shm regions: named per process incarnation, and swept when their
// process is gone. A SIGKILLed process leaves its 16 MiB region behind; without the sweep they
// pile up in RAM, and when the kernel recycles the dead process's pid, the new process's first
// shm endpoint fails (fi_enable: -FI_EBUSY) because "its" region name is taken.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "dma/protocol.hpp"
#include "dma/target.hpp"
#include "child_process.hpp"
#include "fixtures.hpp"
#include "shm_regions.hpp"

namespace dma {
namespace {

namespace fs = std::filesystem;
using internal::process_start_time;
using internal::shm_source_address;
using internal::sweep_stale_shm_regions;

const std::string kCli = DMA_BINARY_DIR "/bin/dma-cli";

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
  ASSERT_TRUE(target.running());
  const std::string wire = target.read_line();
  auto advertisement = parse_advertisement(wire);
  ASSERT_TRUE(advertisement) << "'" << wire << "': " << advertisement.error().describe();
  const fs::path region = region_file(advertisement->address);
  ASSERT_TRUE(fs::exists(region)) << region;
  target.kill_now();
  ASSERT_TRUE(fs::exists(region)) << "shm unlinked a SIGKILLed process's region itself";

  auto opened = Target::open(testing::loopback("shm"));
  ASSERT_TRUE(opened) << opened.error().describe();
  EXPECT_FALSE(fs::exists(region)) << region << " outlived its process";
  EXPECT_TRUE(fs::exists(region_file((*opened)->local_address())));
}

}  // namespace
}  // namespace dma
