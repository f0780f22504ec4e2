// dma-example-client: the smallest clients over the installed library (dma::client).
//
//   dma-example-client fabric <port> [--provider tcp]
//       dma::Target against dma-example-server: exposes a buffer, sends its advertisement over
//       the example's line RPC, and checks the bytes the server wrote into it.
//   dma-example-client redis <port> [--provider tcp]
//       dma::Client against a redis-server with the dma module loaded
//       (redis-server --loadmodule <prefix>/lib/dma/dma.so providers tcp bind 127.0.0.1):
//       DMA.SET of 1 MiB, DMA.GET back into another buffer, every byte compared.
//
// Prints "ok ..." and exits 0 on success; "error ..." and 1 otherwise.
//
// Build it against an installed copy with find_package(dma) (examples/CMakeLists.txt) or with
// pkg-config: g++ -std=c++20 client.cpp $(pkg-config --cflags --libs dma-client).
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "dma/client.hpp"
#include "dma/memory.hpp"
#include "dma/protocol.hpp"
#include "dma/target.hpp"

namespace {

int failed(const std::string& what) {
  std::cout << "error " << what << std::endl;
  return 1;
}

// The byte dma-example-server's value has at `index`.
std::byte expected_at(std::size_t index) { return static_cast<std::byte>((index * 131 + 7) & 0xff); }

int run_fabric(int port, const dma::Configuration& configuration) {
  auto target = dma::Target::open(configuration);
  if (!target) return failed(target.error().describe());
  std::vector<std::byte> buffer(4 << 20);
  // Registered once; the server writes into it until `exposed` is destroyed.
  auto exposed = (*target)->expose(buffer.data(), buffer.size());
  if (!exposed) return failed(exposed.error().describe());

  const int connection = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<std::uint16_t>(port));
  if (connection < 0 ||
      ::connect(connection, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    return failed("cannot connect to 127.0.0.1:" + std::to_string(port));
  }
  std::string reply;
  {
    // Progress without pause from the request to its reply: the server's write is in flight.
    const dma::Target::Busy busy = (*target)->busy();
    const std::string request =
        dma::to_wire(exposed->advertisement()) + " " + std::to_string(buffer.size()) + "\n";
    if (::write(connection, request.data(), request.size()) != static_cast<ssize_t>(request.size())) {
      return failed("cannot send the request");
    }
    char c = 0;
    while (::read(connection, &c, 1) == 1 && c != '\n') reply += c;
  }
  ::close(connection);
  (*target)->synchronize();  // the provider's writes into `buffer` before our reads

  std::istringstream words(reply);
  std::string status;
  std::size_t bytes = 0;
  std::uint32_t crc = 0;
  if (!(words >> status >> bytes >> crc) || status != "ok") return failed("server: " + reply);
  if (bytes > buffer.size()) return failed("the server claims more bytes than the buffer holds");
  const std::uint32_t landed = dma::crc32c(std::span<const std::byte>(buffer.data(), bytes));
  if (landed != crc) return failed("CRC32C mismatch");
  for (std::size_t i = 0; i < bytes; ++i) {
    if (buffer[i] != expected_at(i)) return failed("byte " + std::to_string(i) + " differs");
  }
  std::cout << "ok fabric " << bytes << " bytes crc32c " << crc << std::endl;
  return 0;
}

int run_redis(int port, const dma::Configuration& configuration) {
  dma::Client::Options options;
  options.timeout = std::chrono::seconds(30);
  auto client = dma::Client::connect("127.0.0.1", port, configuration, options);
  if (!client) return failed(client.error().describe());
  if (auto hello = (*client)->hello(); !hello) return failed(hello.error().describe());

  // Values in dma::Buffers: on huge pages from 1 MiB, which the server copies out of and into
  // faster than malloc's 4 KiB pages (README, "Client memory").
  auto value = dma::Buffer::allocate(1 << 20);
  if (!value) return failed(value.error().describe());
  for (std::size_t i = 0; i < value->size(); ++i) value->data()[i] = expected_at(i);
  if (auto set = (*client)->set("dma-example", value->bytes()); !set) {
    return failed(set.error().describe());
  }
  auto copy = dma::Buffer::allocate(value->size() + 4096);
  if (!copy) return failed(copy.error().describe());
  auto got = (*client)->get("dma-example", copy->bytes());
  if (!got) return failed(got.error().describe());
  if (!*got) return failed("the key vanished");
  if (**got != value->size() || std::memcmp(copy->data(), value->data(), value->size()) != 0) {
    return failed("the value read back differs");
  }
  std::cout << "ok redis " << **got << " bytes" << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: dma-example-client fabric|redis <port> [--provider tcp]\n";
    return 2;
  }
  const std::string mode = argv[1];
  const int port = std::atoi(argv[2]);
  dma::Configuration configuration;
  configuration.bind = "127.0.0.1";
  if (argc >= 5 && std::string(argv[3]) == "--provider") configuration.providers = {argv[4]};
  if (mode == "fabric") return run_fabric(port, configuration);
  if (mode == "redis") return run_redis(port, configuration);
  std::cerr << "unknown mode " << mode << "\n";
  return 2;
}
