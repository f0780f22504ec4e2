// The parent's command line (main.cpp parses it; the pool, the server and the report read it).
#pragma once

#include <cstddef>
#include <string>

namespace dma::soak {

struct Options {
  std::string provider = "tcp";
  int clients = 4;
  double duration = 60;
  std::size_t max_size = 1 << 20;
  double kill_every = 0;         // a client; 0: never
  double kill_server_every = 0;  // the server; 0: never
  std::string series_path;       // non-empty: write the time series there
  bool kills_server() const { return kill_server_every > 0; }
};

}  // namespace dma::soak
