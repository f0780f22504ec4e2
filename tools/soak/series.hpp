// The soak's time series: the total operation count of all clients (the live ones' last reports
// plus the killed ones'), sampled by the parent every kReportInterval, and rates read from it for
// the progress line and the recovery judge (recovery.hpp).
//
// Ownership: plain value. Thread-safety: none; the parent's one thread.
#pragma once

#include <cstdint>
#include <ostream>
#include <vector>

namespace dma::soak {

class Series {
 public:
  // `at`: seconds since the clients started; samples come in order.
  void record(double at, std::uint64_t operations);
  double end() const { return samples_.empty() ? 0 : samples_.back().at; }
  // "seconds operations" a line, for --series.
  void write(std::ostream& out) const;
  // Operations per second over [from, to].
  double rate(double from, double to) const { return (count_at(to) - count_at(from)) / (to - from); }

 private:
  struct Sample {
    double at;  // seconds since the clients started
    double operations;
  };
  // The count at `at`, interpolated between the samples around it (a server restart leaves a
  // gap in the samples while the parent waits for the new server).
  double count_at(double at) const;

  std::vector<Sample> samples_;
};

}  // namespace dma::soak
