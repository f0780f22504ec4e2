// The soak's client process (`dma-soak client ...`, spawned by ClientPool): random DMA.SET and
// DMA.GET of log-uniform sizes against the keys of its slot, every GET checked against the CRC32C
// of what it last stored there, its counters on stdout (tally.hpp) until its stdin closes. What
// counts as a mismatch, and why a broken connection makes it forget what it expected, is in
// main.cpp's header.
//
// Ownership: run_client owns everything it uses; one thread runs the loop, another only waits
// for EOF on stdin.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace dma::soak {

// A client process does one operation at a time, so when it is SIGKILLed at most one of its
// operations is in flight: the server can fail at most that one transfer per client kill, and
// when the server is killed each client loses at most that one operation.
inline constexpr std::uint64_t kInFlightPerClient = 1;

struct ClientOptions {
  std::string provider = "tcp";
  int port = 0;
  int slot = 0;  // the client owns the keys soak-<slot>-0..7
  std::size_t max_size = 1 << 20;
  std::uint64_t seed = 0;
};

// Runs one client until its stdin closes, then prints its last report and "done"; returns the
// process's exit status.
int run_client(const ClientOptions& options);

}  // namespace dma::soak
