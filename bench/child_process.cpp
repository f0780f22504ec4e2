#include "child_process.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

extern char** environ;

namespace dma::bench {
namespace {

using Clock = std::chrono::steady_clock;

Unexpected errno_failure(const char* what) {
  return fail(ErrorCode::kResourceExhausted, std::string(what) + ": " + std::strerror(errno));
}

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

}  // namespace

Result<std::unique_ptr<ChildProcess>> ChildProcess::spawn(const std::vector<std::string>& argv) {
  // A child that dies must fail our next write to it, not kill us with SIGPIPE.
  ::signal(SIGPIPE, SIG_IGN);
  int to_child[2];
  int from_child[2];
  if (::pipe2(to_child, O_CLOEXEC) != 0) return errno_failure("pipe2");
  if (::pipe2(from_child, O_CLOEXEC) != 0) {
    ::close(to_child[0]);
    ::close(to_child[1]);
    return errno_failure("pipe2");
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, to_child[0], STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&actions, from_child[1], STDOUT_FILENO);
  std::vector<char*> args;
  for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  const int spawned = ::posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(to_child[0]);
  ::close(from_child[1]);
  if (spawned != 0) {
    ::close(to_child[1]);
    ::close(from_child[0]);
    return fail(ErrorCode::kNotFound, "cannot start " + argv[0] + ": " + std::strerror(spawned));
  }
  return std::unique_ptr<ChildProcess>(new ChildProcess(pid, to_child[1], from_child[0]));
}

ChildProcess::~ChildProcess() {
  close_fd(to_child_);
  close_fd(from_child_);
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
  }
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

Result<std::size_t> ChildProcess::read_some(Clock::time_point deadline) {
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return fail(ErrorCode::kTimedOut, "the child did not answer in time");
    pollfd ready{from_child_, POLLIN, 0};
    const int polled = ::poll(&ready, 1, static_cast<int>(left.count()));
    if (polled < 0 && errno == EINTR) continue;
    if (polled < 0) return errno_failure("poll");
    if (polled == 0) continue;
    char chunk[4096];
    const ssize_t got = ::read(from_child_, chunk, sizeof chunk);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return errno_failure("read from child");
    pending_.append(chunk, static_cast<std::size_t>(got));
    return static_cast<std::size_t>(got);
  }
}

Result<std::string> ChildProcess::read_line(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (true) {
    if (const auto end = pending_.find('\n'); end != std::string::npos) {
      std::string line = pending_.substr(0, end);
      pending_.erase(0, end + 1);
      return line;
    }
    auto more = read_some(deadline);
    if (!more) return fail(std::move(more).error());
    if (*more == 0) return fail(ErrorCode::kWorkerGone, "the child exited (closed its stdout)");
  }
}

Result<std::string> ChildProcess::ask(const std::string& command, std::chrono::milliseconds timeout) {
  if (Status sent = write_line(command); !sent) return fail(std::move(sent).error());
  return read_line(timeout);
}

bool ChildProcess::alive() {
  if (pid_ <= 0) return false;
  int status = 0;
  const pid_t reaped = ::waitpid(pid_, &status, WNOHANG);
  if (reaped == pid_) {
    pid_ = -1;
    return false;
  }
  return true;
}

Result<int> ChildProcess::finish(std::chrono::milliseconds timeout) {
  (void)write_line("quit");
  close_fd(to_child_);
  const auto deadline = Clock::now() + timeout;
  while (true) {
    auto more = read_some(deadline);
    if (!more) return fail(std::move(more).error());
    if (*more == 0) break;
  }
  if (pid_ <= 0) return fail(ErrorCode::kWorkerGone, "the child had already exited");
  int status = 0;
  while (::waitpid(pid_, &status, 0) < 0) {
    if (errno != EINTR) return errno_failure("waitpid");
  }
  pid_ = -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace dma::bench
