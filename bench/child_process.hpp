// A dma-bench child (a fabric target): pipes on its stdin and stdout, line-oriented requests and
// replies with deadlines (poll), and a destructor that kills and reaps it, so no exit path of the
// benchmark leaves a process behind or waits forever.
//
// Ownership: owns the child's pid and both pipe ends. Thread-safety: none; one thread uses it.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "dma/result.hpp"

namespace dma::bench {

class ChildProcess {
 public:
  // Starts argv[0] (a path) with argv; stderr is inherited so the child's diagnostics show.
  static Result<std::unique_ptr<ChildProcess>> spawn(const std::vector<std::string>& argv);
  // Kills (SIGKILL) and reaps the child unless finish() already reaped it.
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // The next line of the child's stdout (no newline), waiting at most `timeout`. Fails with
  // kWorkerGone at EOF (the child died) and kTimedOut at the deadline.
  Result<std::string> read_line(std::chrono::milliseconds timeout);
  // Sends `command` and returns its one-line reply.
  Result<std::string> ask(const std::string& command, std::chrono::milliseconds timeout);
  // True while the child has not exited (checked without blocking).
  bool alive();
  // Sends "quit", waits at most `timeout` for EOF, reaps the child and returns its exit status
  // (128 + signal if it was killed). On timeout the destructor kills it.
  Result<int> finish(std::chrono::milliseconds timeout);

 private:
  ChildProcess(pid_t pid, int to_child, int from_child)
      : pid_(pid), to_child_(to_child), from_child_(from_child) {}
  Status write_line(const std::string& line);
  // Appends what the child wrote to pending_; returns 0 at EOF.
  Result<std::size_t> read_some(std::chrono::steady_clock::time_point deadline);

  pid_t pid_;
  int to_child_;
  int from_child_;
  std::string pending_;
};

}  // namespace dma::bench
