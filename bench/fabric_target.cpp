#include "fabric_target.hpp"

#include <poll.h>
#include <rdma/fi_eq.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <span>
#include <thread>

#include "support/cpu.hpp"
#include "dma/protocol.hpp"
#include "dma/target.hpp"
#include "support/pattern.hpp"
#include "raw_fabric.hpp"

namespace dma::bench {
namespace {

// Lines from stdin without blocking longer than asked. Owned by the target's main thread.
class StdinLines {
 public:
  // The next complete line, waiting at most `timeout_ms` (-1: forever); nullopt if none yet.
  // After EOF, eof() is true.
  std::optional<std::string> next(int timeout_ms) {
    while (true) {
      if (const auto end = pending_.find('\n'); end != std::string::npos) {
        std::string line = pending_.substr(0, end);
        pending_.erase(0, end + 1);
        return line;
      }
      if (eof_) return std::nullopt;
      pollfd ready{STDIN_FILENO, POLLIN, 0};
      const int polled = ::poll(&ready, 1, timeout_ms);
      if (polled < 0 && errno == EINTR) continue;
      if (polled <= 0) return std::nullopt;
      char chunk[1024];
      const ssize_t got = ::read(STDIN_FILENO, chunk, sizeof chunk);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        eof_ = true;
        return std::nullopt;
      }
      pending_.append(chunk, static_cast<std::size_t>(got));
      timeout_ms = 0;  // got something: only finish the line if it is already there
    }
  }
  bool eof() const noexcept { return eof_; }

 private:
  std::string pending_;
  bool eof_ = false;
};

void reply(const std::string& line) {
  std::fputs((line + "\n").c_str(), stdout);
  std::fflush(stdout);
}

// Page-aligned, pattern-filled target memory. Owned by the target process.
struct Buffer {
  struct Free {
    void operator()(std::byte* p) const noexcept { std::free(p); }
  };
  std::unique_ptr<std::byte, Free> data;
  std::size_t length = 0;
};

std::optional<Buffer> make_buffer(std::size_t bytes, std::uint32_t seed) {
  const std::size_t rounded = (bytes + 4095) / 4096 * 4096;
  Buffer buffer;
  buffer.data.reset(static_cast<std::byte*>(std::aligned_alloc(4096, rounded)));
  if (!buffer.data) return std::nullopt;
  buffer.length = bytes;
  support::fill_pattern(std::span(buffer.data.get(), bytes), seed);
  return buffer;
}

// Answers one command; `add_initiator` inserts an address. Returns false on quit.
template <typename AddInitiator>
bool serve(const std::string& line, const Buffer& buffer, AddInitiator&& add_initiator) {
  if (line == "quit") return false;
  if (line.rfind("initiator ", 0) == 0) {
    auto address = hex_decode(std::string_view(line).substr(10));
    if (!address) {
      reply("error " + address.error().message());
      return true;
    }
    Status added = add_initiator(*address);
    reply(added ? "ok" : "error " + added.error().message());
    return true;
  }
  if (line.rfind("crc ", 0) == 0) {
    const std::string_view rest = std::string_view(line).substr(4);
    const auto space = rest.find(' ');
    auto offset = parse_decimal(rest.substr(0, space), "offset");
    auto length = parse_decimal(space == std::string_view::npos ? "" : rest.substr(space + 1), "length");
    if (!offset || !length || *offset > buffer.length || *length > buffer.length - *offset) {
      reply("error bad crc range");
      return true;
    }
    reply(std::to_string(crc32c(std::span<const std::byte>(buffer.data.get() + *offset, *length))));
    return true;
  }
  reply("error unknown command");
  return true;
}

int run_ours(const TargetOptions& options, const Buffer& buffer) {
  Configuration configuration;
  configuration.providers = {options.provider};
  configuration.bind = options.bind;
  Target::Options target_options;
  target_options.poll_interval = options.poll_interval;
  auto target = Target::open(configuration, {}, target_options);
  if (!target) {
    std::fprintf(stderr, "fabric-target: %s\n", target.error().describe().c_str());
    return 1;
  }
  auto exposed = (*target)->expose(buffer.data.get(), buffer.length);
  if (!exposed) {
    std::fprintf(stderr, "fabric-target: %s\n", exposed.error().describe().c_str());
    return 1;
  }
  reply(to_wire(exposed->advertisement()));
  StdinLines lines;
  while (!lines.eof()) {
    auto line = lines.next(-1);
    if (!line) continue;
    (*target)->synchronize();  // order the provider's copies before our crc reads
    const bool more = serve(*line, buffer, [&](const std::vector<std::uint8_t>& address) {
      return (*target)->add_initiator(address);
    });
    if (!more) break;
  }
  return 0;
}

int run_raw(const TargetOptions& options, const Buffer& buffer) {
  auto endpoint = RawEndpoint::open(options.provider, RawRole::kTarget, options.bind);
  if (!endpoint) {
    std::fprintf(stderr, "fabric-target: %s\n", endpoint.error().describe().c_str());
    return 1;
  }
  auto region = (*endpoint)->expose(buffer.data.get(), buffer.length);
  if (!region) {
    std::fprintf(stderr, "fabric-target: %s\n", region.error().describe().c_str());
    return 1;
  }
  Advertisement advertisement;
  advertisement.address = (*endpoint)->address();
  advertisement.key = (*region)->key();
  advertisement.remote_address =
      (*endpoint)->virtual_addresses() ? reinterpret_cast<std::uint64_t>(buffer.data.get()) : 0;
  reply(to_wire(advertisement));
  StdinLines lines;
  std::array<fi_cq_entry, 16> entries;
  // Drive progress; look at stdin every 1024 polls (a poll(2) with no wait), or every poll
  // when sleeping between polls anyway.
  for (std::uint64_t turn = 0; !lines.eof(); ++turn) {
    const ssize_t count = fi_cq_read((*endpoint)->completion_queue(), entries.data(), entries.size());
    if (count == -FI_EAVAIL) {
      fi_cq_err_entry failure{};
      fi_cq_readerr((*endpoint)->completion_queue(), &failure, 0);
    }
    if (options.poll_interval.count() > 0) {
      std::this_thread::sleep_for(options.poll_interval);
    } else if (turn % 1024 != 0) {
      continue;
    }
    auto line = lines.next(0);
    if (!line) continue;
    const bool more = serve(*line, buffer, [&](const std::vector<std::uint8_t>& address) -> Status {
      DMA_TRY((*endpoint)->insert(address));
      return {};
    });
    if (!more) break;
  }
  return 0;
}

}  // namespace

int run_fabric_target(const TargetOptions& options) {
  if (options.parent > 0) {
    // Dies with the benchmark that started it: a benchmark killed while this target was frozen
    // (SIGSTOP while the other side measures, fabric_bench.cpp) left it stopped for good,
    // holding its buffer and, on shm, its region in /dev/shm. SIGKILL ends a stopped process.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != static_cast<pid_t>(options.parent)) return 1;  // it died before that
  }
  if (options.cpu >= 0) {
    // Before any thread exists, so the progress threads (ours, rxm's, xnet's) inherit it.
    if (Status pinned = support::pin_to_cpu(options.cpu); !pinned) {
      std::fprintf(stderr, "fabric-target: %s\n", pinned.error().describe().c_str());
      return 1;
    }
  }
  if (options.bytes == 0) {
    std::fprintf(stderr, "fabric-target: --bytes must be positive\n");
    return 1;
  }
  auto buffer = make_buffer(options.bytes, options.seed);
  if (!buffer) {
    std::fprintf(stderr, "fabric-target: cannot allocate %zu bytes\n", options.bytes);
    return 1;
  }
  if (options.kind == "ours") return run_ours(options, *buffer);
  if (options.kind == "raw") return run_raw(options, *buffer);
  std::fprintf(stderr, "fabric-target: --kind must be ours or raw\n");
  return 1;
}

}  // namespace dma::bench
