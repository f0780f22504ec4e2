// The command-line tools as real processes: `dma-cli target` in a child process against a
// FabricService in this one (tcp, net and shm over loopback), `dma-cli initiator` against it,
// and dma-info. Every read from a child has a deadline (poll), and every child is killed and
// reaped when its test ends, pass or fail.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "dma/protocol.hpp"
#include "dma/service.hpp"
#include "fixtures.hpp"

extern char** environ;

namespace dma {
namespace {

using testing::Buffer;
using testing::pattern;
using Clock = std::chrono::steady_clock;

constexpr auto kReplyDeadline = std::chrono::seconds(30);
const std::string kCli = DMA_BINARY_DIR "/bin/dma-cli";
const std::string kInfo = DMA_BINARY_DIR "/bin/dma-info";

// A child process with pipes on its stdin and stdout (and stderr merged into stdout if asked).
// The destructor kills and reaps it unless finish() already has.
class Child {
 public:
  Child(const std::vector<std::string>& argv, bool merge_stderr = false) {
    ::signal(SIGPIPE, SIG_IGN);  // a dead child must fail our write, not kill the test
    int to_child[2];
    int from_child[2];
    if (pipe2(to_child, O_CLOEXEC) != 0 || pipe2(from_child, O_CLOEXEC) != 0) {
      ADD_FAILURE() << "pipe2: " << std::strerror(errno);
      return;
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, to_child[0], STDIN_FILENO);
    posix_spawn_file_actions_adddup2(&actions, from_child[1], STDOUT_FILENO);
    if (merge_stderr) posix_spawn_file_actions_adddup2(&actions, from_child[1], STDERR_FILENO);
    std::vector<char*> args;
    for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
    args.push_back(nullptr);
    const int spawned = posix_spawn(&pid_, args[0], &actions, nullptr, args.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    ::close(to_child[0]);
    ::close(from_child[1]);
    to_child_ = to_child[1];
    from_child_ = from_child[0];
    if (spawned != 0) {
      pid_ = -1;
      ADD_FAILURE() << "cannot start " << argv[0] << ": " << std::strerror(spawned);
    }
  }
  ~Child() {
    close_input();
    if (from_child_ >= 0) ::close(from_child_);
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      int status = 0;
      while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
      }
    }
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  bool running() const { return pid_ > 0; }

  void write_line(const std::string& line) {
    const std::string framed = line + "\n";
    ASSERT_EQ(static_cast<ssize_t>(framed.size()), ::write(to_child_, framed.data(), framed.size()))
        << std::strerror(errno);
  }
  void close_input() {
    if (to_child_ >= 0) ::close(to_child_);
    to_child_ = -1;
  }

  // The next line of output, or "" with a test failure at the deadline or EOF.
  std::string read_line(std::chrono::milliseconds deadline = kReplyDeadline) {
    const auto until = Clock::now() + deadline;
    while (true) {
      if (const auto end = pending_.find('\n'); end != std::string::npos) {
        std::string line = pending_.substr(0, end);
        pending_.erase(0, end + 1);
        return line;
      }
      if (!read_some(until)) {
        ADD_FAILURE() << "no line from the child (so far: '" << pending_ << "')";
        return {};
      }
    }
  }

  std::string ask(const std::string& command) {
    write_line(command);
    return read_line();
  }

  // Closes stdin, collects all output until EOF (at most `deadline`), reaps the child and
  // returns its exit status (-1 on timeout; the destructor then kills it).
  int finish(std::string* output = nullptr, std::chrono::milliseconds deadline = kReplyDeadline) {
    close_input();
    const auto until = Clock::now() + deadline;
    while (read_some(until)) {
    }
    if (output) *output = pending_;
    if (!eof_) {
      ADD_FAILURE() << "the child did not exit before the deadline";
      return -1;
    }
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

 private:
  // Appends available output to pending_; false at EOF or the deadline.
  bool read_some(Clock::time_point until) {
    while (!eof_) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
      if (left.count() <= 0) return false;
      pollfd ready{from_child_, POLLIN, 0};
      const int polled = ::poll(&ready, 1, static_cast<int>(left.count()));
      if (polled <= 0) continue;  // EINTR or the deadline: rechecked above
      char chunk[4096];
      const ssize_t got = ::read(from_child_, chunk, sizeof(chunk));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        eof_ = true;
        return false;
      }
      pending_.append(chunk, static_cast<std::size_t>(got));
      return true;
    }
    return false;
  }

  pid_t pid_ = -1;
  int to_child_ = -1;
  int from_child_ = -1;
  std::string pending_;
  bool eof_ = false;
};

std::string range(std::size_t offset, std::size_t length) {
  return " " + std::to_string(offset) + " " + std::to_string(length);
}

constexpr std::size_t kTargetBytes = 64 << 20;

class ToolsLoopback : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    target_ = std::make_unique<Child>(std::vector<std::string>{
        kCli, "target", "--provider", GetParam(), "--bind", "127.0.0.1", "--size",
        std::to_string(kTargetBytes)});
    ASSERT_TRUE(target_->running());
    wire_ = target_->read_line();
    auto advertisement = parse_advertisement(wire_);
    ASSERT_TRUE(advertisement) << "'" << wire_ << "': " << advertisement.error().describe();
    advertisement_ = *advertisement;
    auto service = FabricService::start(testing::loopback(GetParam()), nullptr, nullptr);
    ASSERT_TRUE(service) << service.error().describe();
    service_ = std::move(*service);
    ASSERT_EQ("ok", target_->ask("initiator " + hex_encode(service_->local_address())));
  }
  void TearDown() override {
    service_.reset();
    if (target_ && target_->running()) {
      target_->write_line("quit");
      EXPECT_EQ(0, target_->finish()) << "the target must exit cleanly on quit";
    }
    target_.reset();
  }

  TransferRequest request(Direction direction, std::size_t offset, std::size_t length,
                          std::unique_ptr<Operands> context) {
    auto out = TransferRequest::single(1, testing::address_of(advertisement_.address),
                                       advertisement_.key, advertisement_.remote_address + offset,
                                       direction, length, std::move(context));
    out.want_checksum = true;
    return out;
  }

  Outcome run(TransferRequest request) {
    auto handle = service_->transfer(std::move(request));
    if (!handle) return fail(handle.error());
    return handle->wait_for(testing::kDeadline);
  }

  std::unique_ptr<Child> target_;
  std::string wire_;
  Advertisement advertisement_;
  std::unique_ptr<FabricService> service_;
};

TEST_P(ToolsLoopback, bytes_written_from_here_land_in_the_target_process) {
  // If this fails, a write that reports success left other bytes in the client's buffer: the
  // two processes disagree on what was moved.
  std::uint32_t seed = 100;
  for (std::size_t size : {std::size_t{1}, std::size_t{4096}, std::size_t{1} << 20, kTargetBytes}) {
    SCOPED_TRACE("size " + std::to_string(size));
    const auto value = pattern(size, seed);
    Outcome outcome = run(request(Direction::kToPeer, 0, size, std::make_unique<Buffer>(value)));
    ASSERT_TRUE(outcome) << outcome.error().describe();
    EXPECT_EQ(size, outcome->bytes);
    EXPECT_EQ(crc32c(value), outcome->checksum.value());
    EXPECT_EQ("ok", target_->ask("verify " + std::to_string(seed) + range(0, size)));
    EXPECT_EQ(std::to_string(crc32c(value)), target_->ask("crc" + range(0, size)));
    ++seed;
  }
}

TEST_P(ToolsLoopback, bytes_the_target_process_fills_are_the_bytes_read_here) {
  // If this fails, a read returned stale or misplaced bytes from another process's buffer.
  std::uint32_t seed = 200;
  for (std::size_t size : {std::size_t{1}, std::size_t{4096}, std::size_t{1} << 20, kTargetBytes}) {
    SCOPED_TRACE("size " + std::to_string(size));
    ASSERT_EQ("ok", target_->ask("fill " + std::to_string(seed) + range(0, size)));
    const std::string their_crc = target_->ask("crc" + range(0, size));
    Outcome outcome = run(request(Direction::kFromPeer, 0, size, std::make_unique<Buffer>()));
    ASSERT_TRUE(outcome) << outcome.error().describe();
    EXPECT_EQ(size, outcome->bytes);
    EXPECT_EQ(their_crc, std::to_string(outcome->checksum.value()));
    EXPECT_EQ(crc32c(pattern(size, seed)), outcome->checksum.value());
    ++seed;
  }
}

TEST_P(ToolsLoopback, concurrent_transfers_each_land_in_their_own_range) {
  // If this fails, transfers in flight together overwrite each other's ranges in the target.
  constexpr std::size_t kCount = 16;
  constexpr std::size_t kSize = 256 << 10;
  std::vector<Transfer> handles;
  for (std::size_t index = 0; index < kCount; ++index) {
    auto handle = service_->transfer(
        request(Direction::kToPeer, index * kSize, kSize,
                std::make_unique<Buffer>(pattern(kSize, 300 + static_cast<std::uint32_t>(index)))));
    ASSERT_TRUE(handle) << handle.error().describe();
    handles.push_back(std::move(*handle));
  }
  for (Transfer& handle : handles) {
    Outcome outcome = handle.wait_for(testing::kDeadline);
    ASSERT_TRUE(outcome) << outcome.error().describe();
  }
  for (std::size_t index = 0; index < kCount; ++index) {
    EXPECT_EQ("ok", target_->ask("verify " + std::to_string(300 + index) + range(index * kSize, kSize)))
        << "range " << index;
  }
}

TEST_P(ToolsLoopback, the_initiator_tool_moves_bytes_the_target_tool_verifies) {
  // If this fails, the two halves of dma-cli cannot talk to each other on this provider.
  constexpr std::size_t kSize = 1 << 20;
  Child initiator({kCli, "initiator", "--provider", GetParam(), "--bind", "127.0.0.1", "--op",
                   "write", "--length", std::to_string(kSize), "--offset", "4096", "--seed", "77",
                   "--advertisement", wire_});
  const std::string line = initiator.read_line();
  EXPECT_EQ("bytes=" + std::to_string(kSize) + " crc32c=" + std::to_string(crc32c(pattern(kSize, 77))),
            line.substr(0, line.find(" seconds=")));
  EXPECT_NE(std::string::npos, line.find(" gbps=")) << line;
  EXPECT_EQ(0, initiator.finish());
  EXPECT_EQ("ok", target_->ask("verify 77" + range(4096, kSize)));

  // And a read through the tool, with the advertisement on its stdin.
  ASSERT_EQ("ok", target_->ask("fill 78" + range(0, kSize)));
  Child reader({kCli, "initiator", "--provider", GetParam(), "--bind", "127.0.0.1", "--op", "read",
                "--length", std::to_string(kSize)});
  reader.write_line(wire_);
  const std::string read = reader.read_line();
  EXPECT_EQ("bytes=" + std::to_string(kSize) + " crc32c=" + std::to_string(crc32c(pattern(kSize, 78))),
            read.substr(0, read.find(" seconds=")));
  EXPECT_EQ(0, reader.finish());
}

INSTANTIATE_TEST_SUITE_P(Providers, ToolsLoopback, ::testing::Values("tcp", "net", "shm"),
                         [](const auto& param_info) { return param_info.param; });

TEST(DmaCli, a_malformed_advertisement_exits_2_naming_the_field) {
  // If this fails, a typo in a pasted advertisement fails later and vaguely (or not at all).
  Child initiator({kCli, "initiator", "--provider", "tcp", "--op", "read", "--length", "8",
                   "--advertisement", "0200abcd x1 0"},
                  /*merge_stderr=*/true);
  std::string output;
  EXPECT_EQ(2, initiator.finish(&output));
  EXPECT_NE(std::string::npos, output.find("rkey")) << output;

  Child spaced({kCli, "initiator", "--provider", "tcp", "--op", "read", "--length", "8",
                "--advertisement", "0200abcd 1 -5"},
               /*merge_stderr=*/true);
  EXPECT_EQ(2, spaced.finish(&output));
  EXPECT_NE(std::string::npos, output.find("remote address")) << output;
}

TEST(DmaCli, the_target_answers_bad_commands_with_an_error_line_and_keeps_serving) {
  // If this fails, one bad command desynchronises (or kills) a script driving the target.
  Child target({kCli, "target", "--provider", "tcp", "--size", "64", "--fill", "5"});
  ASSERT_TRUE(parse_advertisement(target.read_line()));
  EXPECT_EQ(0u, target.ask("bogus").find("error:"));
  EXPECT_EQ(0u, target.ask("crc 0 65").find("error:"));
  EXPECT_EQ(0u, target.ask("verify").find("error:"));
  EXPECT_EQ("ok", target.ask("verify 5"));
  EXPECT_EQ("mismatch at 0", target.ask("verify 6"));
  EXPECT_EQ(std::to_string(crc32c(pattern(64, 5))), target.ask("crc"));
  EXPECT_EQ(0, target.finish()) << "EOF on stdin must exit 0";
}

TEST(DmaInfo, reports_the_tcp_provider_and_exits_0) {
  // If this fails, dma-info cannot open the provider every deployment falls back to.
  Child info({kInfo, "--provider", "tcp", "--bind", "127.0.0.1"});
  std::string output;
  EXPECT_EQ(0, info.finish(&output));
  EXPECT_NE(std::string::npos, output.find("tcp;ofi_rxm")) << output;
}

}  // namespace
}  // namespace dma
