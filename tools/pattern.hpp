// The byte pattern now lives in the support library (support/pattern.hpp). This forwarder
// remains only for bench/fabric_target.cpp, which includes "pattern.hpp" and names
// dma::tools::fill_pattern; it goes once that file includes "support/pattern.hpp".
#pragma once

#include "support/pattern.hpp"

namespace dma::tools {
using support::fill_pattern;
using support::find_mismatch;
using support::make_pattern;
}  // namespace dma::tools
