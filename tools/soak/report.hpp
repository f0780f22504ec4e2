// The soak's report: what a finished run did, on stdout, and PASS or FAIL with the rule that was
// applied (main.cpp's header lists the rules), so a failure says which one did not hold. On a
// FAIL the module's lines in the server's log follow on stderr, for why an endpoint was replaced.
//
// Ownership: plain values; the report reads a RunSummary the parent filled.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "soak/options.hpp"
#include "soak/recovery.hpp"
#include "soak/tally.hpp"

namespace dma::soak {

// What a finished run leaves to report: taken after the clients stopped, so nothing is in
// flight, and before the server was stopped (its log and exit status are the last things taken).
struct RunSummary {
  Tally sum;
  double elapsed = 0;       // seconds since the clients started
  std::uint64_t kills = 0;  // clients SIGKILLed, or with --kill-server-every servers
  Recovery recovery;
  int port = 0;
  std::optional<long long> failed_transfers;  // INFO dma, dma_errors (the last incarnation's)
  std::optional<std::size_t> rss_at_start;    // the last incarnation's
  std::optional<std::size_t> rss_end;
  bool server_died = false;     // exited without our killing it
  bool restart_failed = false;  // a killed server's successor did not start
  std::string server_log;
  std::optional<int> server_exit;  // nullopt: no server to stop
  std::uint64_t client_crashes = 0;
};

// Prints the report; the process's exit status: 0 on PASS, 1 on FAIL.
int report(const Options& options, const RunSummary& run);

// "2.5 s"
std::string seconds(double value);
// "12.3 MiB", or "?" when unknown.
std::string megabytes(std::optional<std::size_t> bytes);

}  // namespace dma::soak
