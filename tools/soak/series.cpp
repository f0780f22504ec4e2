// The operation count over time (series.hpp).
#include "soak/series.hpp"

#include <algorithm>

namespace dma::soak {

void Series::record(double at, std::uint64_t operations) {
  samples_.push_back(Sample{at, static_cast<double>(operations)});
}

void Series::write(std::ostream& out) const {
  for (const Sample& sample : samples_) out << sample.at << ' ' << sample.operations << '\n';
}

double Series::count_at(double at) const {
  if (samples_.empty()) return 0;
  const auto after = std::lower_bound(samples_.begin(), samples_.end(), at,
                                      [](const Sample& sample, double t) { return sample.at < t; });
  if (after == samples_.begin()) return after->operations;
  if (after == samples_.end()) return samples_.back().operations;
  const Sample& before = *(after - 1);
  const double span = after->at - before.at;
  if (span <= 0) return after->operations;
  return before.operations + (after->operations - before.operations) * (at - before.at) / span;
}

}  // namespace dma::soak
