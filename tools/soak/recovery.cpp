// The throughput level and each kill's recovery (recovery.hpp).
#include "soak/recovery.hpp"

#include <algorithm>

namespace dma::soak {

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t middle = values.size() / 2;
  return values.size() % 2 == 1 ? values[middle] : (values[middle - 1] + values[middle]) / 2;
}

Recovery judge_recovery(const Series& series, const std::vector<double>& kills) {
  Recovery recovery;
  std::vector<double> rates;
  for (int step = 0;; ++step) {
    const double from = kLevelSkipsStart + step * kWindowStep;
    if (from + kWindow > series.end() - kLevelSkipsEnd) break;
    rates.push_back(series.rate(from, from + kWindow));
  }
  if (!rates.empty()) recovery.level = median(rates);
  for (const double at : kills) {
    if (at + kRecoveryTo > series.end()) {
      ++recovery.not_judged;
      continue;
    }
    if (!recovery.level || *recovery.level <= 0) {
      // No level to come back to: nothing ran for most of the run (or it was too short to tell),
      // which is no recovery.
      recovery.slow.emplace_back(at, 0.0);
      continue;
    }
    const double ratio = series.rate(at + kRecoveryFrom, at + kRecoveryTo) / *recovery.level;
    recovery.ratios.push_back(ratio);
    if (ratio < kRecovered) recovery.slow.emplace_back(at, ratio);
  }
  return recovery;
}

}  // namespace dma::soak
