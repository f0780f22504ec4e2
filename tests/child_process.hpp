// Child: support::ChildProcess (support/child_process.hpp) for tests. The same process with
// pipes on its stdin and stdout and deadlines on every read, but a failure is a test failure
// (ADD_FAILURE) instead of a Result, and the destructor gives the child kExitGrace to exit on
// EOF before killing it, so no test leaves a process behind.
//
// Ownership: owns the child. Thread-safety: none; the test's thread.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "support/child_process.hpp"

namespace dma::testing {

inline constexpr auto kReplyDeadline = std::chrono::seconds(30);

class Child {
 public:
  static constexpr auto kExitGrace = std::chrono::seconds(2);

  explicit Child(const std::vector<std::string>& argv, bool merge_stderr = false) {
    support::ChildProcess::Options options;
    options.merge_stderr = merge_stderr;
    options.exit_grace = kExitGrace;
    auto spawned = support::ChildProcess::spawn(argv, options);
    if (!spawned) {
      ADD_FAILURE() << spawned.error().describe();
      return;
    }
    child_ = std::move(*spawned);
  }

  // True from a successful start until finish() or kill_now().
  bool running() const { return child_ != nullptr && !ended_; }
  pid_t pid() const { return child_ ? child_->pid() : -1; }

  // Kills the child now (SIGKILL) and reaps it: a crash, as far as its peers can tell.
  void kill_now() {
    if (!child_) return;
    child_->kill_now();
    ended_ = true;
  }

  // Stops every thread of the child (a hung peer) and returns once they have stopped; thaw()
  // lets it run again. Each fails the test if the child is gone.
  void freeze() {
    Status frozen = child_ ? child_->freeze() : fail(ErrorCode::kWorkerGone, "no child");
    ASSERT_TRUE(frozen) << frozen.error().describe();
  }
  void thaw() {
    Status thawed = child_ ? child_->thaw() : fail(ErrorCode::kWorkerGone, "no child");
    ASSERT_TRUE(thawed) << thawed.error().describe();
  }

  void write_line(const std::string& line) {
    if (!child_) {
      ADD_FAILURE() << "no child to write to";
      return;
    }
    Status written = child_->write_line(line);
    EXPECT_TRUE(written) << written.error().describe();
  }
  void close_input() {
    if (child_) child_->close_input();
  }

  // The next line of output, or "" with a test failure at the deadline or EOF.
  std::string read_line(std::chrono::milliseconds deadline = kReplyDeadline) {
    if (!child_) {
      ADD_FAILURE() << "no child to read from";
      return {};
    }
    auto line = child_->read_line(deadline);
    if (!line) {
      ADD_FAILURE() << "no line from the child (" << line.error().describe() << "; so far: '"
                    << child_->pending_output() << "')";
      return {};
    }
    return std::move(*line);
  }

  std::string ask(const std::string& command) {
    write_line(command);
    return read_line();
  }

  // Closes stdin, collects all output until EOF (at most `deadline`), reaps the child and
  // returns its exit status (-1, with a test failure, on timeout; the destructor then kills it).
  int finish(std::string* output = nullptr, std::chrono::milliseconds deadline = kReplyDeadline) {
    if (!child_) {
      ADD_FAILURE() << "no child to finish";
      return -1;
    }
    auto status = child_->finish(deadline);
    if (output) *output = child_->pending_output();
    if (!status) {
      ADD_FAILURE() << "the child did not exit before the deadline: " << status.error().describe();
      return -1;
    }
    ended_ = true;
    return *status;
  }

 private:
  std::unique_ptr<support::ChildProcess> child_;
  bool ended_ = false;
};

}  // namespace dma::testing
