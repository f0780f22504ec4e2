// What a soak client process tells its parent: cumulative counters (Tally), one "stats ..." line
// on stdout every kReportInterval, which the parent parses and sums. Cumulative, so a report the
// parent misses costs nothing, and a killed client's last report still counts its work.
//
// Ownership: plain values. Thread-safety: none needed (each process has its own).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "dma/result.hpp"

namespace dma::soak {

using namespace std::chrono_literals;

// How often a client reports and the parent samples the total operation count: four samples in
// each 1 s window of the recovery rule (recovery.hpp). A report is one short line, so this costs
// nothing.
inline constexpr auto kReportInterval = 250ms;
inline constexpr double kReportSeconds = 0.25;

using Counts = std::map<std::string, std::uint64_t>;  // cause -> count

std::uint64_t sum_of(const Counts& counts);

// Counters one client process reports; summed by the parent.
struct Tally {
  std::uint64_t gets = 0;
  std::uint64_t sets = 0;
  std::uint64_t bytes = 0;
  std::uint64_t mismatches = 0;
  Counts errors;      // failed DMA.GET/DMA.SET
  Counts reconnects;  // failed reconnect attempts: "<delete|connect|hello>/<cause>"

  // "stats gets sets bytes mismatches op:cause=count ... reconnect:cause=count ..." (causes
  // have no spaces, ':' or '=': cause_of makes sure).
  std::string line() const;
  static std::optional<Tally> parse(const std::string& text);
  void add(const Tally& other);
  std::uint64_t operations() const { return gets + sets; }
  std::uint64_t error_count() const { return sum_of(errors); }
  std::uint64_t reconnect_failures() const { return sum_of(reconnects); }
};

// A short, space-free name for an error's cause: its kind plus the first words of the message.
std::string cause_of(const Error& error);

}  // namespace dma::soak
