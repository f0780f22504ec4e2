// dma-example-server: the smallest server over the installed library (dma::dma). It holds one
// value and writes it straight into each client's exposed buffer with a one-sided RDMA write.
//
// The RPC is a line over a loopback TCP socket, standing in for your server's own protocol:
//   client -> server   "<advertisement wire form> <buffer length>\n"
//   server -> client   "ok <bytes> <crc32c>\n" once the bytes are in the client's memory,
//                      or "error <message>\n"
// It prints "listening <port>" when ready and exits 0 after --requests connections.
//
//   dma-example-server [--provider tcp] [--size 1048576] [--requests 1]
//
// Build it against an installed copy with find_package(dma) (examples/CMakeLists.txt) or with
// pkg-config: g++ -std=c++20 server.cpp $(pkg-config --cflags --libs dma).
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dma/protocol.hpp"
#include "dma/service.hpp"
#include "dma/version.hpp"

namespace {

// The operand of one GET: shares the server's value, which must stay valid and unchanged until
// the transfer's completion (dma::Operands::source).
class Value : public dma::Operands {
 public:
  explicit Value(std::shared_ptr<const std::vector<std::byte>> bytes) : bytes_(std::move(bytes)) {}
  std::span<const std::byte> source() override { return *bytes_; }

 private:
  std::shared_ptr<const std::vector<std::byte>> bytes_;
};

// One line from `fd`, without its newline ("" on EOF or error).
std::string read_line(int fd) {
  std::string line;
  char c = 0;
  while (::read(fd, &c, 1) == 1 && c != '\n') line += c;
  return line;
}

void write_all(int fd, const std::string& text) {
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t wrote = ::write(fd, text.data() + done, text.size() - done);
    if (wrote <= 0) return;
    done += static_cast<std::size_t>(wrote);
  }
}

// Serves one request on `connection`: the reply line.
std::string serve(dma::FabricService& service, std::uint64_t client_id, const std::string& request,
                  const std::shared_ptr<const std::vector<std::byte>>& value) {
  const std::size_t space = request.rfind(' ');
  if (space == std::string::npos) return "error expected '<advertisement> <length>'";
  auto advertisement = dma::parse_advertisement(request.substr(0, space));
  if (!advertisement) return "error " + advertisement.error().describe();
  auto length = dma::parse_decimal(request.substr(space + 1), "length");
  if (!length) return "error " + length.error().describe();
  if (*length < value->size()) {
    return "error the buffer holds " + std::to_string(*length) + " bytes, the value " +
           std::to_string(value->size());
  }
  auto peer = dma::FabricAddress::from(advertisement->address);
  if (!peer) return "error " + peer.error().describe();
  auto request_for = dma::TransferRequest::single(client_id, *peer, advertisement->key,
                                                  advertisement->remote_address,
                                                  dma::Direction::kToPeer, 0,
                                                  std::make_unique<Value>(value));
  request_for.want_checksum = true;  // CRC32C of what was sent, computed off the worker
  auto transfer = service.transfer(std::move(request_for));
  if (!transfer) return "error " + transfer.error().describe();
  const dma::Outcome outcome = transfer->wait_for(std::chrono::seconds(30));
  service.remove_peer(client_id);
  if (!outcome) return "error " + outcome.error().describe();
  return "ok " + std::to_string(outcome->bytes) + " " + std::to_string(outcome->checksum.value_or(0));
}

}  // namespace

int main(int argc, char** argv) {
  std::string provider = "tcp";
  std::size_t size = 1 << 20;
  int requests = 1;
  for (int index = 1; index + 1 < argc; index += 2) {
    const std::string name = argv[index];
    if (name == "--provider") provider = argv[index + 1];
    else if (name == "--size") size = std::strtoull(argv[index + 1], nullptr, 10);
    else if (name == "--requests") requests = std::atoi(argv[index + 1]);
    else { std::cerr << "unknown option " << name << "\n"; return 2; }
  }

  dma::Configuration configuration;
  configuration.providers = {provider};
  configuration.bind = "127.0.0.1";
  // No batch completer: every transfer here is waited on through its dma::Transfer handle.
  auto service = dma::FabricService::start(configuration, nullptr, nullptr);
  if (!service) {
    std::cerr << "cannot start the service: " << service.error().describe() << "\n";
    return 1;
  }
  auto value = std::make_shared<std::vector<std::byte>>(size);
  for (std::size_t i = 0; i < size; ++i) (*value)[i] = static_cast<std::byte>((i * 131 + 7) & 0xff);

  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t address_length = sizeof address;
  if (listener < 0 || ::bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      ::listen(listener, 16) != 0 ||
      ::getsockname(listener, reinterpret_cast<sockaddr*>(&address), &address_length) != 0) {
    std::perror("listen");
    return 1;
  }
  std::cout << "listening " << ntohs(address.sin_port) << std::endl;
  std::cerr << "dma-example-server: libdma " << dma::version() << ", provider "
            << (*service)->describe().provider << ", value of " << size << " bytes\n";

  for (int served = 0; served < requests; ++served) {
    const int connection = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (connection < 0) continue;
    write_all(connection, serve(**service, static_cast<std::uint64_t>(served) + 1,
                                read_line(connection), value) + "\n");
    ::close(connection);
  }
  ::close(listener);
  return 0;
}
