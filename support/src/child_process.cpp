#include "support/child_process.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string_view>
#include <utility>

extern char** environ;

namespace dma::support {
namespace {

using Clock = std::chrono::steady_clock;

Unexpected errno_failure(const char* what) {
  return fail(ErrorCode::kResourceExhausted, std::string(what) + ": " + std::strerror(errno));
}

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

// The inherited environment with `added` in place of same-named entries.
std::vector<std::string> environment_with(const std::vector<std::string>& added) {
  std::vector<std::string> environment;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string_view inherited(*entry);
    const auto name = inherited.substr(0, inherited.find('=') + 1);
    const bool replaced = std::any_of(added.begin(), added.end(), [&](const std::string& mine) {
      return name == std::string_view(mine).substr(0, mine.find('=') + 1);
    });
    if (!replaced) environment.emplace_back(inherited);
  }
  environment.insert(environment.end(), added.begin(), added.end());
  return environment;
}

std::vector<char*> pointers_to(std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  for (std::string& text : strings) pointers.push_back(text.data());
  pointers.push_back(nullptr);
  return pointers;
}

// Both ends of a pipe, closed on destruction unless released.
struct Pipe {
  int ends[2] = {-1, -1};
  ~Pipe() {
    close_fd(ends[0]);
    close_fd(ends[1]);
  }
  int release(int end) { return std::exchange(ends[end], -1); }
};

}  // namespace

Result<std::unique_ptr<ChildProcess>> ChildProcess::spawn(const std::vector<std::string>& argv,
                                                          const Options& options) {
  if (argv.empty()) return fail(ErrorCode::kInvalidArgument, "no program to start");
  Pipe to_child;
  Pipe from_child;
  if (options.pipe_stdin) {
    // A child that dies must fail our next write to it, not kill us with SIGPIPE.
    ::signal(SIGPIPE, SIG_IGN);
    if (::pipe2(to_child.ends, O_CLOEXEC) != 0) return errno_failure("pipe2");
  }
  const bool stdout_pipe = options.pipe_stdout && options.output_file.empty();
  if (stdout_pipe && ::pipe2(from_child.ends, O_CLOEXEC) != 0) return errno_failure("pipe2");

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (options.pipe_stdin) posix_spawn_file_actions_adddup2(&actions, to_child.ends[0], STDIN_FILENO);
  if (stdout_pipe) {
    posix_spawn_file_actions_adddup2(&actions, from_child.ends[1], STDOUT_FILENO);
  } else if (!options.output_file.empty()) {
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, options.output_file.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
  }
  if (options.merge_stderr) posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);

  std::vector<std::string> arguments = argv;
  std::vector<std::string> environment = environment_with(options.environment);
  std::vector<char*> argument_pointers = pointers_to(arguments);
  std::vector<char*> environment_pointers = pointers_to(environment);
  pid_t pid = -1;
  const int spawned =
      options.search_path
          ? ::posix_spawnp(&pid, argv[0].c_str(), &actions, nullptr, argument_pointers.data(),
                           environment_pointers.data())
          : ::posix_spawn(&pid, argv[0].c_str(), &actions, nullptr, argument_pointers.data(),
                          environment_pointers.data());
  posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0) {
    return fail(ErrorCode::kNotFound, "cannot start " + argv[0] + ": " + std::strerror(spawned));
  }
  close_fd(to_child.ends[0]);
  close_fd(from_child.ends[1]);
  return std::unique_ptr<ChildProcess>(
      new ChildProcess(pid, to_child.release(1), from_child.release(0), options.exit_grace));
}

ChildProcess::~ChildProcess() {
  close_input();
  close_fd(from_child_);
  if (reaped_) return;
  if (!wait_exit(exit_grace_)) kill_now();
}

Status ChildProcess::write_line(const std::string& line) {
  if (to_child_ < 0) return fail(ErrorCode::kWorkerGone, "the child's stdin is closed");
  const std::string framed = line + "\n";
  std::size_t done = 0;
  while (done < framed.size()) {
    const ssize_t wrote = ::write(to_child_, framed.data() + done, framed.size() - done);
    if (wrote < 0 && errno == EINTR) continue;
    if (wrote < 0) {
      if (errno == EPIPE) return fail(ErrorCode::kWorkerGone, "the child has exited");
      return errno_failure("write to child");
    }
    done += static_cast<std::size_t>(wrote);
  }
  return {};
}

void ChildProcess::close_input() { close_fd(to_child_); }

Result<std::size_t> ChildProcess::read_some(Clock::time_point deadline) {
  if (from_child_ < 0) return fail(ErrorCode::kInvalidArgument, "the child's stdout is not a pipe");
  if (eof_) return std::size_t{0};
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return fail(ErrorCode::kTimedOut, "the child did not answer in time");
    pollfd ready{from_child_, POLLIN, 0};
    const int polled = ::poll(&ready, 1, static_cast<int>(left.count()));
    if (polled < 0 && errno == EINTR) continue;
    if (polled < 0) return errno_failure("poll");
    if (polled == 0) continue;  // the deadline: rechecked above
    char chunk[4096];
    const ssize_t got = ::read(from_child_, chunk, sizeof chunk);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return errno_failure("read from child");
    if (got == 0) eof_ = true;
    pending_.append(chunk, static_cast<std::size_t>(got));
    return static_cast<std::size_t>(got);
  }
}

std::optional<std::string> ChildProcess::take_line() {
  const auto end = pending_.find('\n');
  if (end == std::string::npos) return std::nullopt;
  std::string line = pending_.substr(0, end);
  pending_.erase(0, end + 1);
  return line;
}

bool ChildProcess::read_available() {
  while (!eof_ && from_child_ >= 0) {
    pollfd ready{from_child_, POLLIN, 0};
    const int polled = ::poll(&ready, 1, 0);
    if (polled < 0 && errno == EINTR) continue;
    if (polled <= 0) return true;
    auto got = read_some(Clock::now() + std::chrono::seconds(1));
    if (!got) return false;
  }
  return !eof_;
}

Result<std::string> ChildProcess::read_line(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (true) {
    if (auto line = take_line()) return std::move(*line);
    DMA_TRY_ASSIGN(const std::size_t got, read_some(deadline));
    if (got == 0) return fail(ErrorCode::kWorkerGone, "the child exited (closed its stdout)");
  }
}

Result<std::string> ChildProcess::ask(const std::string& command, std::chrono::milliseconds timeout) {
  DMA_TRY(write_line(command));
  return read_line(timeout);
}

Result<int> ChildProcess::finish(std::chrono::milliseconds timeout) {
  close_input();
  const auto deadline = Clock::now() + timeout;
  if (from_child_ >= 0) {
    while (true) {
      DMA_TRY_ASSIGN(const std::size_t got, read_some(deadline));
      if (got == 0) break;
    }
  }
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  if (auto status = wait_exit(std::max(left, std::chrono::milliseconds(0)))) return *status;
  return fail(ErrorCode::kTimedOut, "the child did not exit in time");
}

void ChildProcess::record_exit(int status) {
  reaped_ = true;
  status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

bool ChildProcess::exited() {
  if (reaped_) return true;
  int status = 0;
  if (::waitpid(pid_, &status, WNOHANG) == pid_) record_exit(status);
  return reaped_;
}

std::optional<int> ChildProcess::wait_exit(std::chrono::milliseconds timeout) {
  if (exited()) return status_;
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0));
  if (pidfd >= 0) {
    pollfd exit_event{pidfd, POLLIN, 0};
    const auto deadline = Clock::now() + timeout;
    while (true) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      const int polled = ::poll(&exit_event, 1, static_cast<int>(std::max<long>(0, left.count())));
      if (polled < 0 && errno == EINTR) continue;
      break;
    }
    ::close(pidfd);
  }
  if (exited()) return status_;
  return std::nullopt;
}

void ChildProcess::signal(int signal) {
  if (!reaped_) ::kill(pid_, signal);
}

namespace {

// Waits for `pid` to report a state change among `flags` (WUNTRACED, WCONTINUED; exits are always
// reported). The raw status, or -1 if waitpid failed.
int wait_for_change(pid_t pid, int flags) {
  int status = 0;
  while (::waitpid(pid, &status, flags) < 0) {
    if (errno != EINTR) return -1;
  }
  return status;
}

}  // namespace

Status ChildProcess::signal_and_wait(int signal, int flags, const char* instead) {
  if (reaped_) return fail(ErrorCode::kWorkerGone, "the child has already exited");
  ::kill(pid_, signal);
  const int status = wait_for_change(pid_, flags);
  if (status == -1) {
    return fail(ErrorCode::kWorkerGone, std::string("waitpid: ") + std::strerror(errno));
  }
  if ((flags == WUNTRACED && WIFSTOPPED(status)) || (flags == WCONTINUED && WIFCONTINUED(status))) {
    return {};
  }
  if (WIFEXITED(status) || WIFSIGNALED(status)) record_exit(status);
  // How it went, so that a flake in a long run can be told apart (a crash, an exit, or a state
  // change waitpid should not have reported).
  std::string how;
  if (WIFEXITED(status)) {
    how = "exited with status " + std::to_string(WEXITSTATUS(status));
  } else if (WIFSIGNALED(status)) {
    how = std::string("was killed by signal ") + std::to_string(WTERMSIG(status)) + " (" +
          strsignal(WTERMSIG(status)) + ")";
  } else {
    how = "reported wait status " + std::to_string(status);
  }
  return fail(ErrorCode::kWorkerGone, "the child " + how + " instead of " + instead);
}

Status ChildProcess::freeze() { return signal_and_wait(SIGSTOP, WUNTRACED, "stopping"); }

Status ChildProcess::thaw() { return signal_and_wait(SIGCONT, WCONTINUED, "continuing"); }

void ChildProcess::kill_now() {
  if (reaped_) return;
  ::kill(pid_, SIGKILL);
  int status = 0;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  record_exit(status);
}

}  // namespace dma::support
