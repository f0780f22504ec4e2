// ChildProcess: a child process started with posix_spawn, for tests, tools and the benchmark
// (dma-cli targets, the benchmark's fabric targets, dma-soak's clients, redis-server). Its stdin
// and stdout can be pipes read line by line with deadlines (poll), or its output can go to a
// file; every wait has a deadline, because a child cannot notify us.
//
// The failure it prevents: a helper process left behind, or a caller blocked forever on a child
// that hung or died. The destructor closes the child's stdin (our tools exit on EOF, cleaning
// up: shm unlinks its /dev/shm region), waits at most `exit_grace` for it to exit, then SIGKILLs
// it, and always reaps it.
//
// Ownership: owns the child's pid and the pipe ends. Thread-safety: none; one owner thread.
// SIGPIPE is ignored process-wide once a child with a stdin pipe is spawned, so writing to a
// dead child fails with EPIPE instead of killing the caller.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dma/result.hpp"

namespace dma::support {

class ChildProcess {
 public:
  struct Options {
    bool pipe_stdin = true;     // false: the child inherits ours
    bool pipe_stdout = true;    // false: the child inherits ours (unless output_file is set)
    bool merge_stderr = false;  // stderr goes where stdout goes (the pipe or output_file)
    // Non-empty: stdout (and with merge_stderr, stderr) to this file, truncated; no pipe.
    std::string output_file;
    // NAME=VALUE entries added to the inherited environment, replacing inherited ones of the
    // same name (getenv sees the first of duplicates).
    std::vector<std::string> environment;
    bool search_path = false;  // look argv[0] up in PATH (posix_spawnp)
    // How long the destructor waits for the child to exit after closing its stdin.
    std::chrono::milliseconds exit_grace{0};
  };

  // Starts argv[0] with argv. Fails (kNotFound) if it cannot be started.
  static Result<std::unique_ptr<ChildProcess>> spawn(const std::vector<std::string>& argv,
                                                     const Options& options);
  static Result<std::unique_ptr<ChildProcess>> spawn(const std::vector<std::string>& argv) {
    return spawn(argv, Options{});
  }
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const noexcept { return pid_; }

  // Writes `line` and a newline to the child's stdin. kWorkerGone once the child has exited.
  Status write_line(const std::string& line);
  // Closes the child's stdin (idempotent); our tools take EOF as "quit".
  void close_input();
  // The next line of the child's stdout (no newline), waiting at most `timeout`. Fails with
  // kWorkerGone at EOF (the child closed its stdout) and kTimedOut at the deadline.
  Result<std::string> read_line(std::chrono::milliseconds timeout);
  // Sends `command` and returns its one-line reply.
  Result<std::string> ask(const std::string& command, std::chrono::milliseconds timeout);

  // For callers polling several children: the stdout pipe (-1 without one), what is there to
  // read now without blocking (false at EOF), and the next complete line read so far.
  int output_fd() const noexcept { return from_child_; }
  bool read_available();
  std::optional<std::string> take_line();
  // What was read from stdout and not yet taken as a line.
  const std::string& pending_output() const noexcept { return pending_; }

  // Closes stdin, reads stdout until EOF (at most `timeout`), reaps the child and returns its
  // exit status (128 + signal if it was killed). kTimedOut if it did not close its stdout in
  // time (the destructor then kills it).
  Result<int> finish(std::chrono::milliseconds timeout);

  // True once the child has exited (reaped here; checked without blocking).
  bool exited();
  // Waits at most `timeout` for the child to exit (a pidfd polled with that deadline); its exit
  // status, or nullopt if it is still running.
  std::optional<int> wait_exit(std::chrono::milliseconds timeout);
  // The exit status once exited() (128 + signal if killed), else -1.
  int exit_status() const noexcept { return status_; }
  // Sends `signal` unless the child has been reaped.
  void signal(int signal);
  // SIGKILLs and reaps the child now: a crash, as far as its peers can tell.
  void kill_now();
  // SIGSTOPs the child and returns once every thread of it has stopped (waitpid WUNTRACED):
  // kill() alone returns before the stop reaches the other threads, which can still run (and,
  // say, complete a transfer) meanwhile. Fails (kWorkerGone) if the child exited instead.
  Status freeze();
  // SIGCONTs a frozen child and returns once it runs again (waitpid WCONTINUED).
  Status thaw();

 private:
  ChildProcess(pid_t pid, int to_child, int from_child, std::chrono::milliseconds exit_grace)
      : pid_(pid), to_child_(to_child), from_child_(from_child), exit_grace_(exit_grace) {}
  // Appends what the child wrote to pending_, waiting until `deadline`; 0 at EOF.
  Result<std::size_t> read_some(std::chrono::steady_clock::time_point deadline);
  void record_exit(int status);
  // Sends `signal` and waits for the state change `flags` asks for (WUNTRACED: stopped,
  // WCONTINUED: continued); an exit instead fails naming what it did not do.
  Status signal_and_wait(int signal, int flags, const char* instead);

  pid_t pid_;
  int to_child_;
  int from_child_;
  std::chrono::milliseconds exit_grace_;
  std::string pending_;
  bool eof_ = false;
  bool reaped_ = false;
  int status_ = -1;
};

}  // namespace dma::support
