// The recovery judge (issue 13): did throughput come back after each kill? A server that stays
// slow after a client's or its own predecessor's death passes every other check of the soak, so
// this is the one that catches it.
//
// Every rate is taken over a kWindow-long window of the series. The level is the median rate of
// the windows stepping by kWindowStep (one sample) that start after the first kLevelSkipsStart
// seconds (clients starting, the server's arena warming) and end before the last kLevelSkipsEnd
// (clients being stopped). A kill at t has recovered if the rate over [t + kRecoveryFrom,
// t + kRecoveryTo] is at least kRecovered x the level: the first second leaves a replacement
// client (or every client, after a server restart) time to start, connect and say hello; a
// whole second of rate is steady enough to compare; 0.75 leaves room for the noise of a shared
// machine and still catches a server that stays slow after a kill. A window that runs past the
// end of the series is not judged.
//
// Ownership: plain values; pure functions.
#pragma once

#include <cstddef>
#include <optional>
#include <utility>
#include <vector>

#include "soak/series.hpp"
#include "soak/tally.hpp"

namespace dma::soak {

inline constexpr double kWindow = 1.0;
inline constexpr double kWindowStep = kReportSeconds;
inline constexpr double kLevelSkipsStart = 2.0;
inline constexpr double kLevelSkipsEnd = 1.0;
inline constexpr double kRecoveryFrom = 1.0;
inline constexpr double kRecoveryTo = kRecoveryFrom + kWindow;
inline constexpr double kRecovered = 0.75;

// The throughput level and, for each kill, the rate after it relative to the level.
struct Recovery {
  std::optional<double> level;  // ops/s; nullopt if the run is too short to have one
  std::vector<double> ratios;   // one per judged kill
  std::vector<std::pair<double, double>> slow;  // the kills not recovered: time, ratio
  std::size_t not_judged = 0;   // kills whose window runs past the end

  std::size_t not_recovered() const { return slow.size(); }
};

// `kills`: seconds since the start at which each kill happened (see kRecovered).
Recovery judge_recovery(const Series& series, const std::vector<double>& kills);

double median(std::vector<double> values);

}  // namespace dma::soak
