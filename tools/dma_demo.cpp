// dma-demo: a two-process loopback demonstration until the Redis module exists. It starts
// `dma-cli target` (next to its own executable) as a child with pipes on its stdin and stdout,
// reads the child's advertisement, opens a FabricService here, and for each size moves N rounds
// of writes then reads of a known pattern, checking every byte through the child's `verify` and
// `crc` commands and every read-back against the pattern's CRC32C. Prints a table to stdout and
// progress to stderr; exits non-zero on any mismatch or error. The child is always reaped.
#include <CLI/CLI.hpp>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "dma/protocol.hpp"
#include "dma/service.hpp"
#include "owned_bytes.hpp"
#include "pattern.hpp"

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kReplyTimeout = std::chrono::seconds(30);
constexpr auto kTransferTimeout = std::chrono::seconds(60);

// A child process with pipes on its stdin and stdout (stderr is inherited). Owned by one thread.
// Destroying it kills and reaps the child if finish() has not.
class ChildProcess {
 public:
  static dma::Result<std::unique_ptr<ChildProcess>> spawn(const std::vector<std::string>& argv) {
    int to_child[2];
    int from_child[2];
    if (pipe2(to_child, O_CLOEXEC) != 0) return errno_error("pipe2");
    if (pipe2(from_child, O_CLOEXEC) != 0) {
      ::close(to_child[0]);
      ::close(to_child[1]);
      return errno_error("pipe2");
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, to_child[0], STDIN_FILENO);
    posix_spawn_file_actions_adddup2(&actions, from_child[1], STDOUT_FILENO);
    std::vector<char*> args;
    for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
    args.push_back(nullptr);
    pid_t pid = -1;
    const int spawned = posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    ::close(to_child[0]);
    ::close(from_child[1]);
    if (spawned != 0) {
      ::close(to_child[1]);
      ::close(from_child[0]);
      return dma::fail(dma::ErrorCode::kNotFound,
                       "cannot start " + argv[0] + ": " + std::strerror(spawned));
    }
    return std::unique_ptr<ChildProcess>(new ChildProcess(pid, to_child[1], from_child[0]));
  }

  ~ChildProcess() {
    close_fd(to_child_);
    close_fd(from_child_);
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      int status = 0;
      while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
      }
    }
  }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  dma::Status write_line(const std::string& line) {
    const std::string framed = line + "\n";
    std::size_t done = 0;
    while (done < framed.size()) {
      const ssize_t wrote = ::write(to_child_, framed.data() + done, framed.size() - done);
      if (wrote < 0 && errno == EINTR) continue;
      if (wrote < 0) return errno_error("write to child");
      done += static_cast<std::size_t>(wrote);
    }
    return {};
  }

  // The next line of the child's stdout (without its newline), waiting at most `timeout`.
  dma::Result<std::string> read_line(std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    while (true) {
      if (const auto end = pending_.find('\n'); end != std::string::npos) {
        std::string line = pending_.substr(0, end);
        pending_.erase(0, end + 1);
        return line;
      }
      auto more = read_some(deadline);
      if (!more) return dma::fail(std::move(more).error());
      if (*more == 0) return dma::fail(dma::ErrorCode::kWorkerGone, "the child closed its stdout");
    }
  }

  // Sends `command` and returns its one-line reply.
  dma::Result<std::string> ask(const std::string& command) {
    if (dma::Status sent = write_line(command); !sent) return dma::fail(std::move(sent).error());
    return read_line(kReplyTimeout);
  }

  // Sends `quit`, waits (at most `timeout`) for the child to close its stdout, then reaps it.
  // Returns its exit status (128 + signal if killed).
  dma::Result<int> finish(std::chrono::milliseconds timeout) {
    (void)write_line("quit");
    close_fd(to_child_);
    const auto deadline = Clock::now() + timeout;
    while (true) {
      auto more = read_some(deadline);
      if (!more) return dma::fail(std::move(more).error());  // the destructor kills it
      if (*more == 0) break;
    }
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0) {
      if (errno != EINTR) return errno_error("waitpid");
    }
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

 private:
  ChildProcess(pid_t pid, int to_child, int from_child)
      : pid_(pid), to_child_(to_child), from_child_(from_child) {}

  static dma::Unexpected errno_error(const char* what) {
    return dma::fail(dma::ErrorCode::kResourceExhausted,
                     std::string(what) + ": " + std::strerror(errno));
  }
  static void close_fd(int& fd) {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }

  // Appends what the child has written to pending_; 0 at EOF.
  dma::Result<std::size_t> read_some(Clock::time_point deadline) {
    while (true) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) {
        return dma::fail(dma::ErrorCode::kTimedOut, "the child did not answer in time");
      }
      pollfd ready{from_child_, POLLIN, 0};
      const int polled = ::poll(&ready, 1, static_cast<int>(left.count()));
      if (polled < 0 && errno == EINTR) continue;
      if (polled < 0) return errno_error("poll");
      if (polled == 0) continue;
      char chunk[4096];
      const ssize_t got = ::read(from_child_, chunk, sizeof(chunk));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) return errno_error("read from child");
      pending_.append(chunk, static_cast<std::size_t>(got));
      return static_cast<std::size_t>(got);
    }
  }

  pid_t pid_;
  int to_child_;
  int from_child_;
  std::string pending_;
};

using dma::tools::OwnedBytes;

// "4k" -> 4096, "1m", "16M", "1g", or plain bytes.
dma::Result<std::size_t> parse_size(std::string text) {
  std::size_t scale = 1;
  if (!text.empty()) {
    switch (text.back()) {
      case 'k': case 'K': scale = std::size_t{1} << 10; break;
      case 'm': case 'M': scale = std::size_t{1} << 20; break;
      case 'g': case 'G': scale = std::size_t{1} << 30; break;
      default: break;
    }
    if (scale != 1) text.pop_back();
  }
  auto value = dma::parse_decimal(text, "size");
  if (!value) return dma::fail(std::move(value).error());
  if (*value == 0 || *value > SIZE_MAX / scale) {
    return dma::fail(dma::ErrorCode::kInvalidArgument, "size must be between 1 byte and 2^64");
  }
  return static_cast<std::size_t>(*value) * scale;
}

std::string human(std::size_t bytes) {
  if (bytes % (1u << 20) == 0) return std::to_string(bytes >> 20) + "MiB";
  if (bytes % (1u << 10) == 0) return std::to_string(bytes >> 10) + "KiB";
  return std::to_string(bytes) + "B";
}

struct Row {
  std::size_t size = 0;
  const char* op = "";
  std::size_t transfers = 0;
  double seconds = 0;
  std::vector<double> latencies;  // seconds
  bool verified = true;
};

void print_row(const Row& row) {
  std::vector<double> sorted = row.latencies;
  std::sort(sorted.begin(), sorted.end());
  const double p50 = sorted.empty() ? 0 : sorted[sorted.size() / 2];
  const double gbytes = static_cast<double>(row.size * row.transfers) / 1e9;
  std::printf("%10s  %-5s  %9zu  %8.3f  %10.1f  %s\n", human(row.size).c_str(), row.op,
              row.transfers, row.seconds > 0 ? gbytes / row.seconds : 0.0, p50 * 1e6,
              row.verified ? "verified" : "MISMATCH");
  std::fflush(stdout);
}

// Runs one transfer to completion; its latency in seconds goes to `row`.
dma::Result<std::unique_ptr<dma::Operands>> run_one(dma::FabricService& service,
                                                    dma::TransferRequest request, Row& row,
                                                    dma::TransferDone& done) {
  const auto started = Clock::now();
  auto handle = service.transfer(std::move(request));
  if (!handle) return dma::fail(handle.error());
  dma::Outcome outcome = handle->wait_for(kTransferTimeout);
  const double seconds = std::chrono::duration<double>(Clock::now() - started).count();
  if (!outcome) return dma::fail(std::move(outcome).error());
  row.latencies.push_back(seconds);
  row.seconds += seconds;
  ++row.transfers;
  done = *outcome;
  return handle->take_context();
}

struct Session {
  ChildProcess& child;
  dma::FabricService& service;
  dma::FabricAddress peer;
  dma::Advertisement advertisement;
};

dma::TransferRequest request_for(const Session& session, dma::Direction direction,
                                 std::size_t size, std::unique_ptr<dma::Operands> context) {
  auto request = dma::TransferRequest::single(1, session.peer, session.advertisement.key,
                                              session.advertisement.remote_address, direction,
                                              size, std::move(context));
  request.want_checksum = true;
  return request;
}

// N writes of fresh patterns, each verified byte for byte by the child.
dma::Result<Row> write_rounds(Session& session, std::size_t size, int rounds, std::uint32_t& seed) {
  Row row;
  row.size = size;
  row.op = "write";
  for (int round = 0; round < rounds; ++round) {
    const std::uint32_t this_seed = seed++;
    auto value = dma::tools::make_pattern(size, this_seed);
    const std::uint32_t expected = dma::crc32c(value);
    dma::TransferDone done;
    auto context = run_one(session.service,
                           request_for(session, dma::Direction::kToPeer, size,
                                       std::make_unique<OwnedBytes>(std::move(value))),
                           row, done);
    if (!context) return dma::fail(std::move(context).error());
    auto verdict =
        session.child.ask("verify " + std::to_string(this_seed) + " 0 " + std::to_string(size));
    if (!verdict) return dma::fail(std::move(verdict).error());
    if (done.bytes != size || done.checksum != expected || *verdict != "ok") {
      std::cerr << "dma-demo: write of " << size << " bytes (seed " << this_seed
                << "): target says '" << *verdict << "', moved " << done.bytes << " bytes\n";
      row.verified = false;
    }
  }
  return row;
}

// N reads of patterns the child wrote, each checked against the pattern and the child's CRC.
dma::Result<Row> read_rounds(Session& session, std::size_t size, int rounds, std::uint32_t& seed) {
  Row row;
  row.size = size;
  row.op = "read";
  for (int round = 0; round < rounds; ++round) {
    const std::uint32_t this_seed = seed++;
    const std::string range = " 0 " + std::to_string(size);
    auto filled = session.child.ask("fill " + std::to_string(this_seed) + range);
    if (!filled) return dma::fail(std::move(filled).error());
    if (*filled != "ok") return dma::fail(dma::ErrorCode::kInvalidArgument, "fill: " + *filled);
    auto their_crc = session.child.ask("crc" + range);
    if (!their_crc) return dma::fail(std::move(their_crc).error());
    dma::TransferDone done;
    auto context = run_one(session.service,
                           request_for(session, dma::Direction::kFromPeer, size,
                                       std::make_unique<OwnedBytes>()),
                           row, done);
    if (!context) return dma::fail(std::move(context).error());
    const auto& bytes = static_cast<OwnedBytes*>(context->get())->bytes();
    const auto mismatch = dma::tools::find_mismatch(bytes, this_seed);
    const std::string read_crc = std::to_string(done.checksum.value_or(0));
    if (done.bytes != size || bytes.size() != size || mismatch || read_crc != *their_crc) {
      std::cerr << "dma-demo: read of " << size << " bytes (seed " << this_seed
                << "): crc " << read_crc << " vs target's " << *their_crc
                << (mismatch ? ", first bad byte at " + std::to_string(*mismatch) : "") << "\n";
      row.verified = false;
    }
  }
  return row;
}

int run(const std::string& provider, const std::string& bind, const std::vector<std::size_t>& sizes,
        int rounds) {
  std::error_code error;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", error);
  if (error) {
    std::cerr << "dma-demo: cannot find my own executable: " << error.message() << "\n";
    return 1;
  }
  const std::string cli = (self.parent_path() / "dma-cli").string();
  const std::size_t largest = *std::max_element(sizes.begin(), sizes.end());
  std::cerr << "dma-demo: starting " << cli << " target (" << largest << " bytes, " << provider
            << ")\n";
  auto child = ChildProcess::spawn({cli, "target", "--provider", provider, "--bind", bind,
                                    "--size", std::to_string(largest)});
  if (!child) {
    std::cerr << "dma-demo: " << child.error().describe() << "\n";
    return 1;
  }
  auto wire = (*child)->read_line(kReplyTimeout);
  if (!wire) {
    std::cerr << "dma-demo: no advertisement from the target: " << wire.error().describe() << "\n";
    return 1;
  }
  auto advertisement = dma::parse_advertisement(*wire);
  if (!advertisement) {
    std::cerr << "dma-demo: bad advertisement '" << *wire << "': "
              << advertisement.error().message() << "\n";
    return 1;
  }
  auto peer = dma::FabricAddress::from(advertisement->address);
  if (!peer) {
    std::cerr << "dma-demo: " << peer.error().describe() << "\n";
    return 1;
  }

  dma::Configuration configuration;
  configuration.providers = {provider};
  configuration.bind = bind;
  auto service = dma::FabricService::start(configuration, nullptr, nullptr);
  if (!service) {
    std::cerr << "dma-demo: " << service.error().describe() << "\n";
    return 1;
  }
  std::cerr << "dma-demo: initiator " << (*service)->describe().to_string() << "\n";
  auto introduced = (*child)->ask("initiator " + dma::hex_encode((*service)->local_address()));
  if (!introduced || *introduced != "ok") {
    std::cerr << "dma-demo: the target refused our address: "
              << (introduced ? *introduced : introduced.error().describe()) << "\n";
    return 1;
  }

  Session session{**child, **service, *peer, *advertisement};
  // One unmeasured write first: tcp and net connect on the first operation, which would
  // otherwise dominate the smallest size's figures.
  std::uint32_t seed = 1;
  if (auto warm = write_rounds(session, 1, 1, seed); !warm || !warm->verified) {
    std::cerr << "dma-demo: the first transfer failed: "
              << (warm ? "mismatch" : warm.error().describe()) << "\n";
    return 1;
  }
  std::printf("%10s  %-5s  %9s  %8s  %10s  %s\n", "size", "op", "transfers", "GB/s", "p50 us",
              "check");
  bool all_verified = true;
  for (std::size_t size : sizes) {
    std::cerr << "dma-demo: " << human(size) << " x " << rounds << "\n";
    for (auto* rounds_of : {&write_rounds, &read_rounds}) {
      auto row = rounds_of(session, size, rounds, seed);
      if (!row) {
        std::cerr << "dma-demo: " << row.error().describe() << "\n";
        if (row.error().code() == dma::ErrorCode::kTimedOut) {
          // ~FabricService waits for what is in flight and a transfer that never completes
          // would hang it: reap the child and leave without it.
          (*child).reset();
          std::_Exit(1);
        }
        return 1;
      }
      print_row(*row);
      all_verified = all_verified && row->verified;
    }
  }

  service->reset();
  auto status = (*child)->finish(kReplyTimeout);
  if (!status || *status != 0) {
    std::cerr << "dma-demo: the target did not exit cleanly: "
              << (status ? "status " + std::to_string(*status) : status.error().describe())
              << "\n";
    return 1;
  }
  return all_verified ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dma-demo: write and read a verified pattern against a dma-cli target process"};
  std::string provider = "tcp";
  std::string bind = "127.0.0.1";
  std::string sizes_text = "4k,1m,16m";
  int rounds = 10;
  app.add_option("--provider", provider, "libfabric provider")->capture_default_str();
  app.add_option("--bind", bind, "local address to bind")->capture_default_str();
  app.add_option("--sizes", sizes_text, "comma-separated sizes (k, m, g suffixes)")
      ->capture_default_str();
  app.add_option("--rounds", rounds, "transfers per size and direction")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    const int code = app.exit(error);
    return code == 0 ? 0 : 2;
  }
  std::vector<std::size_t> sizes;
  for (std::size_t start = 0; start <= sizes_text.size();) {
    const std::size_t end = std::min(sizes_text.find(',', start), sizes_text.size());
    auto size = parse_size(sizes_text.substr(start, end - start));
    if (!size) {
      std::cerr << "dma-demo: --sizes: " << size.error().message() << "\n";
      return 2;
    }
    sizes.push_back(*size);
    start = end + 1;
  }
  // A child that dies must fail our next write to it, not kill us.
  ::signal(SIGPIPE, SIG_IGN);
  return run(provider, bind, sizes, rounds);
}
