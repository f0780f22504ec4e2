// The test-support library's promises that other tests lean on without checking them.

#include <gtest/gtest.h>

#include <dirent.h>

#include <fstream>
#include <string>
#include <vector>

#include "support/child_process.hpp"

namespace dma::support {
namespace {

const std::string kCli = DMA_BINARY_DIR "/bin/dma-cli";

// The state letter of every thread of `pid` (/proc/<pid>/task/<tid>/stat, the field after the
// parenthesised name).
std::vector<char> thread_states(pid_t pid) {
  std::vector<char> states;
  const std::string tasks = "/proc/" + std::to_string(pid) + "/task";
  DIR* directory = ::opendir(tasks.c_str());
  if (directory == nullptr) return states;
  while (const dirent* entry = ::readdir(directory)) {
    if (entry->d_name[0] == '.') continue;
    std::ifstream stat(tasks + "/" + entry->d_name + "/stat");
    std::string line;
    std::getline(stat, line);
    const auto name_end = line.rfind(')');
    if (name_end != std::string::npos && name_end + 2 < line.size()) {
      states.push_back(line[name_end + 2]);
    }
  }
  ::closedir(directory);
  return states;
}

TEST(ChildProcess, freeze_returns_only_once_every_thread_has_stopped_and_thaw_lets_it_answer) {
  // If this fails, a hung-peer test's first transfer can complete in the window between kill()
  // and the stop reaching the peer's progress thread (it did, on a loaded machine).
  auto child = ChildProcess::spawn({kCli, "target", "--provider", "tcp", "--bind", "127.0.0.1",
                                    "--size", "4096"});
  ASSERT_TRUE(child) << child.error().describe();
  auto advertisement = (*child)->read_line(std::chrono::seconds(30));
  ASSERT_TRUE(advertisement) << advertisement.error().describe();
  ASSERT_GT(thread_states((*child)->pid()).size(), 1u) << "the target should run several threads";

  for (int round = 0; round < 20; ++round) {
    ASSERT_TRUE((*child)->freeze()) << "round " << round;
    for (const char state : thread_states((*child)->pid())) {
      ASSERT_EQ('T', state) << "a thread still runs after freeze(), round " << round;
    }
    ASSERT_TRUE((*child)->thaw()) << "round " << round;
    auto reply = (*child)->ask("crc 0 0", std::chrono::seconds(30));
    ASSERT_TRUE(reply) << reply.error().describe();
    EXPECT_EQ("0", *reply) << "round " << round;
  }
  auto finished = (*child)->finish(std::chrono::seconds(30));
  ASSERT_TRUE(finished) << finished.error().describe();
  EXPECT_EQ(0, *finished);
}

TEST(ChildProcess, freezing_a_child_that_has_exited_says_so) {
  auto child = ChildProcess::spawn({"/bin/true"});
  ASSERT_TRUE(child) << child.error().describe();
  ASSERT_TRUE((*child)->wait_exit(std::chrono::seconds(30)));
  const Status frozen = (*child)->freeze();
  ASSERT_FALSE(frozen);
  EXPECT_EQ(ErrorCode::kWorkerGone, frozen.error().code());
  EXPECT_NE(std::string::npos, frozen.error().message().find("exited")) << frozen.error().message();
  EXPECT_FALSE((*child)->thaw());
}

}  // namespace
}  // namespace dma::support
