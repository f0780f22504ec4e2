// The client processes as the parent sees them (client_pool.hpp).
#include "soak/client_pool.hpp"

#include <poll.h>

#include <iostream>
#include <string>
#include <thread>

#include "support/child_process.hpp"

namespace dma::soak {

// One client process (support::ChildProcess, pipes on its stdin and stdout) and its last
// report. Killed and reaped on destruction.
class ClientProcess {
 public:
  static std::unique_ptr<ClientProcess> spawn(const Options& options, int port, int slot,
                                              std::uint64_t seed) {
    auto child = dma::support::ChildProcess::spawn(
        {"/proc/self/exe", "client", "--provider", options.provider, "--port",
         std::to_string(port), "--slot", std::to_string(slot), "--max-size",
         std::to_string(options.max_size), "--seed", std::to_string(seed)});
    if (!child) {
      std::cerr << "dma-soak: " << child.error().describe() << "\n";
      return nullptr;
    }
    auto process = std::make_unique<ClientProcess>();
    process->child_ = std::move(*child);
    return process;
  }
  int output() const { return child_->output_fd(); }
  const Tally& tally() const { return tally_; }
  bool done() const { return done_; }
  bool open() const { return open_; }

  // Reads what is available and takes its reports; false at EOF.
  bool drain() {
    if (open_) open_ = child_->read_available();
    while (auto line = child_->take_line()) {
      if (auto tally = Tally::parse(*line)) tally_ = *tally;
      if (*line == "done") done_ = true;
    }
    return open_;
  }
  // Asks the client to stop: EOF on its stdin.
  void stop() { child_->close_input(); }
  void kill() {
    child_->kill_now();
    drain();
  }
  void reap() { child_->wait_exit(std::chrono::seconds(10)); }

 private:
  std::unique_ptr<dma::support::ChildProcess> child_;
  bool open_ = true;
  bool done_ = false;
  Tally tally_;
};

ClientPool::ClientPool(const Options& options, int port) : options_(options), port_(port) {}

// Here, where ClientProcess is complete.
ClientPool::~ClientPool() = default;

bool ClientPool::start() {
  for (int slot = 0; slot < options_.clients; ++slot) {
    clients_.push_back(ClientProcess::spawn(options_, port_, slot, next_seed_++));
    if (!clients_.back()) {
      std::cerr << "dma-soak: cannot start client " << slot << "\n";
      return false;
    }
  }
  return true;
}

void ClientPool::collect(std::chrono::milliseconds timeout) {
  std::vector<pollfd> fds;
  for (const auto& client : clients_) {
    if (client->open()) fds.push_back(pollfd{client->output(), POLLIN, 0});
  }
  if (fds.empty()) {
    std::this_thread::sleep_for(timeout);
    return;
  }
  ::poll(fds.data(), fds.size(), static_cast<int>(timeout.count()));
  for (auto& client : clients_) {
    if (client->open() && !client->drain()) {
      ++crashed_;
      std::cerr << "\ndma-soak: a client exited on its own\n";
    }
  }
}

bool ClientPool::kill_and_replace(int slot) {
  clients_[slot]->kill();
  retired_.add(clients_[slot]->tally());
  clients_[slot] = ClientProcess::spawn(options_, port_, slot, next_seed_++);
  if (!clients_[slot]) {
    std::cerr << "\ndma-soak: cannot restart client " << slot << "\n";
    return false;
  }
  return true;
}

void ClientPool::stop() {
  for (auto& client : clients_) client->stop();
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  for (auto& client : clients_) {
    while (!client->done() && client->open() && std::chrono::steady_clock::now() < deadline) {
      pollfd fd{client->output(), POLLIN, 0};
      ::poll(&fd, 1, 200);
      client->drain();
    }
    if (client->done()) {
      client->reap();
    } else {
      std::cerr << "dma-soak: a client did not stop in time; killed\n";
      client->kill();
    }
  }
}

Tally ClientPool::total() const {
  Tally sum = retired_;
  for (const auto& client : clients_) sum.add(client->tally());
  return sum;
}

}  // namespace dma::soak
