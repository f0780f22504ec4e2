// A child process for tests: pipes on its stdin and stdout, line-oriented reads with deadlines
// (poll), and a destructor that kills and reaps it, so no test leaves a process behind.
#pragma once

#include <gtest/gtest.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

extern char** environ;

namespace dma::testing {

inline constexpr auto kReplyDeadline = std::chrono::seconds(30);

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
  // Closes the child's stdin (our tools exit on EOF, cleaning up after themselves: shm unlinks
  // its /dev/shm region) and waits up to kExitGrace for it to exit before killing it.
  ~Child() {
    close_input();
    if (from_child_ >= 0) ::close(from_child_);
    if (pid_ > 0) {
      if (!exits_within(kExitGrace)) ::kill(pid_, SIGKILL);
      int status = 0;
      while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
      }
    }
  }
  static constexpr auto kExitGrace = std::chrono::seconds(2);
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  bool running() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }

  // Kills the child now (SIGKILL) and reaps it: a crash, as far as its peers can tell.
  void kill_now() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
  }

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
    const auto until = std::chrono::steady_clock::now() + deadline;
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
    const auto until = std::chrono::steady_clock::now() + deadline;
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
  // True once the child has exited (not yet reaped), waiting at most `grace` (a pidfd polled
  // with that deadline).
  bool exits_within(std::chrono::milliseconds grace) const {
    const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0));
    if (pidfd < 0) return false;
    pollfd exited{pidfd, POLLIN, 0};
    int polled = 0;
    do {
      polled = ::poll(&exited, 1, static_cast<int>(grace.count()));
    } while (polled < 0 && errno == EINTR);
    ::close(pidfd);
    return polled > 0;
  }

  // Appends available output to pending_; false at EOF or the deadline.
  bool read_some(std::chrono::steady_clock::time_point until) {
    while (!eof_) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
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

}  // namespace dma::testing
