// What the module tests (test_module_*.cpp) share: a real redis-server loading build/lib/dma.so
// (support::RedisServer), raw hiredis connections for commands the Client never sends
// (malformed ones included), the HELLO/PROVE exchange done by hand, and the checks on a
// server's log. Each test binary starts its own servers on free loopback ports.
//
// Thread-safety: none; a Connection belongs to one thread. Ownership: plain owners (servers,
// connections, targets) held by the tests.
#pragma once

#include <gtest/gtest.h>
#include <hiredis/hiredis.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "dma/client.hpp"
#include "dma/protocol.hpp"
#include "dma/target.hpp"
#include "child_process.hpp"
#include "fixtures.hpp"
#include "support/redis_connection.hpp"
#include "support/redis_server.hpp"

namespace dma::testing {

using namespace std::chrono_literals;
using support::RedisServer;
using support::Reply;

inline std::string module_path() { return std::string(DMA_BINARY_DIR) + "/lib/dma.so"; }

// Options for a server with the module on `provider`; `extra` are more module arguments.
inline RedisServer::Options server_options(const std::vector<std::string>& extra = {},
                                           const std::string& provider = "tcp",
                                           const std::vector<std::string>& server_arguments = {}) {
  RedisServer::Options options;
  options.module_path = module_path();
  options.module_arguments = {"providers", provider, "bind", "127.0.0.1"};
  options.module_arguments.insert(options.module_arguments.end(), extra.begin(), extra.end());
  options.server_arguments = server_arguments;
  return options;
}

// Starts a server (retrying on a port another test took first); nullptr, with a test failure,
// if it does not answer PING before the deadline.
inline std::unique_ptr<RedisServer> start_server(const std::vector<std::string>& extra = {},
                                                 const std::string& provider = "tcp",
                                                 const std::vector<std::string>& server_arguments = {}) {
  auto server = RedisServer::start(server_options(extra, provider, server_arguments));
  if (!server) {
    ADD_FAILURE() << "redis-server with the module did not start: " << server.error().describe();
    return nullptr;
  }
  return std::move(*server);
}

// A raw hiredis connection (support::RedisConnection) whose commands return the reply as it
// came, error replies included, or nullptr if the connection failed.
class Connection {
 public:
  explicit Connection(int port) {
    auto opened = support::RedisConnection::open("127.0.0.1", port, 60s);
    if (opened) connection_ = std::move(*opened);
  }
  bool ok() const { return connection_ != nullptr; }
  void close() { connection_.reset(); }
  Reply command(const std::vector<std::string>& arguments) {
    send(arguments);
    return receive();
  }
  // Queues a command and writes it out without waiting for the reply.
  void send(const std::vector<std::string>& arguments) {
    if (!connection_) return;
    const std::vector<std::string_view> views(arguments.begin(), arguments.end());
    (void)connection_->send(views);
  }
  Reply receive() {
    if (!connection_) return nullptr;
    auto reply = connection_->receive();
    return reply ? std::move(*reply) : nullptr;
  }
  // A numeric field of `INFO dma` ("in_flight" reads dma_in_flight), or -1 if it is missing.
  long long info_field(const std::string& name) {
    if (!connection_) return -1;
    return connection_->info_field("dma", "dma_" + name).value_or(-1);
  }
  // Any field of `INFO <section>` ("replication", "master_link_status"), "" if it is missing.
  std::string info_text(const std::string& section, const std::string& name) {
    if (!connection_) return {};
    return connection_->info_text(section, name).value_or("");
  }
  long long info_number(const std::string& section, const std::string& name) {
    if (!connection_) return -1;
    return connection_->info_field(section, name).value_or(-1);
  }

 private:
  std::unique_ptr<support::RedisConnection> connection_;
};

inline std::string error_of(const Reply& reply) { return support::error_text(reply); }

// DMA.SET's, DMA.SETPLAIN's and DMA.GET's [length, crc32c] as text, or the error (or other
// reply) it was instead, so a mismatch prints what came back.
inline std::vector<std::string> length_and_crc(const Reply& reply) {
  if (!reply || reply->type != REDIS_REPLY_ARRAY || reply->elements != 2) return {error_of(reply)};
  return {std::to_string(reply->element[0]->integer), std::to_string(reply->element[1]->integer)};
}

inline long long integer_of(const Reply& reply) {
  return reply && reply->type == REDIS_REPLY_INTEGER ? reply->integer : -1000;
}
inline bool is_nil(const Reply& reply) { return reply && reply->type == REDIS_REPLY_NIL; }
// A string reply's bytes ("" for any other reply).
inline std::string text_of(const Reply& reply) { return std::string(support::reply_text(reply)); }

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

inline long long info_field(Connection& connection, const std::string& name) {
  return connection.info_field(name);
}

// What a server's log must never contain: a crash, a sanitizer report (asan/ubsan/tsan run
// inside the server, so they report there), an assertion.
inline void expect_clean_log(const std::string& log) {
  for (const char* report : {"ERROR: AddressSanitizer", "runtime error:", "WARNING: ThreadSanitizer",
                             "Guru Meditation", "crashed by signal", "ASSERTION FAILED"}) {
    EXPECT_FALSE(contains(log, report)) << "redis-server reported a problem:\n" << log;
  }
}

// DMA.HELLO's reply, parsed: [<nonce-hex>, [<address-hex>...], <inline-max>].
struct Hello {
  std::vector<std::uint8_t> nonce;
  std::vector<std::vector<std::uint8_t>> addresses;
  long long inline_max = 0;
};
inline Result<Hello> parse_hello(const Reply& reply) {
  if (!reply || reply->type != REDIS_REPLY_ARRAY || reply->elements != 3 ||
      reply->element[0]->type != REDIS_REPLY_STRING ||
      reply->element[1]->type != REDIS_REPLY_ARRAY ||
      reply->element[2]->type != REDIS_REPLY_INTEGER) {
    return fail(ErrorCode::kInvalidArgument,
                "not [nonce, [addresses], inline-max]: " + error_of(reply));
  }
  Hello hello;
  hello.inline_max = reply->element[2]->integer;
  DMA_TRY_ASSIGN(hello.nonce,
                 hex_decode(std::string_view(reply->element[0]->str, reply->element[0]->len)));
  for (std::size_t index = 0; index < reply->element[1]->elements; ++index) {
    const redisReply* element = reply->element[1]->element[index];
    if (element->type != REDIS_REPLY_STRING) return fail(ErrorCode::kInvalidArgument, "address");
    DMA_TRY_ASSIGN(auto address, hex_decode(std::string_view(element->str, element->len)));
    hello.addresses.push_back(std::move(address));
  }
  return hello;
}

inline std::vector<std::string> with_region(std::vector<std::string> command,
                                            const RemoteRegion& region) {
  command.push_back(std::to_string(region.key));
  command.push_back(std::to_string(region.address));
  command.push_back(std::to_string(region.length));
  return command;
}

// DMA.SET <key> <length> <options...> <region>, as a raw command.
inline std::vector<std::string> dma_set(const std::string& key, std::size_t length,
                                        const std::vector<std::string>& options,
                                        const RemoteRegion& region) {
  std::vector<std::string> command = {"DMA.SET", key, std::to_string(length)};
  command.insert(command.end(), options.begin(), options.end());
  return with_region(command, region);
}

// Says DMA.HELLO on `connection` with `target`'s address and proves it honestly (the nonce in
// memory exposed on `target`). Fails with the server's error text.
inline Status hello_and_prove(Connection& connection, Target& target) {
  DMA_TRY_ASSIGN(const Hello hello,
                 parse_hello(connection.command({"DMA.HELLO", hex_encode(target.local_address())})));
  for (const auto& address : hello.addresses) DMA_TRY(target.add_initiator(address));
  std::vector<std::byte> proof(hello.nonce.size());
  std::memcpy(proof.data(), hello.nonce.data(), proof.size());
  DMA_TRY_ASSIGN(const Exposed exposed, target.expose(proof.data(), proof.size()));
  target.synchronize();
  Reply proven = connection.command(with_region({"DMA.PROVE"}, exposed.whole()));
  target.synchronize();  // the provider's sends from `proof` before it is freed
  if (!proven || proven->type != REDIS_REPLY_STATUS) {
    return fail(ErrorCode::kInvalidArgument, "DMA.PROVE: " + error_of(proven));
  }
  return {};
}

// A directory of the test's own under the test temp dir (RDB, AOF, cluster node files), made
// empty at construction and removed with everything in it at destruction.
class ScratchDirectory {
 public:
  explicit ScratchDirectory(const std::string& name)
      : path_(::testing::TempDir() + "dma-" + name + "-" + std::to_string(::getpid())) {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDirectory() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  ScratchDirectory(const ScratchDirectory&) = delete;
  ScratchDirectory& operator=(const ScratchDirectory&) = delete;
  // The directory, or `name` inside it (created).
  std::string path(const std::string& name = {}) const {
    if (name.empty()) return path_;
    const std::string inside = path_ + "/" + name;
    std::filesystem::create_directories(inside);
    return inside;
  }

 private:
  std::string path_;
};

inline std::string as_string(const std::vector<std::byte>& bytes) {
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

// A raw, proven session whose target is another process: `dma-cli target` on tcp, exposing
// `size` bytes of `seed`'s pattern (the session proof's nonce goes after them). freeze()
// (SIGSTOP) holds every transfer to it in flight for certain until thaw(), so a DMA.SET is
// still being read while other connections' commands (a conflicting write, a fork, a MIGRATE)
// run. An in-process Target cannot promise that on tcp: rxm's own progress thread serves the
// server's reads without us (docs/PROVIDERS.md, "Progress"), and a 16 MiB read "held" that way
// was seen to finish before the other command in about one run in fifteen.
struct ChildSession {
  std::unique_ptr<Child> target;
  Advertisement advertisement;
  std::unique_ptr<Connection> connection;
  // Bytes [offset, offset + length) of the child's buffer.
  RemoteRegion region(std::uint64_t offset, std::uint64_t length) const {
    return RemoteRegion{advertisement.key, advertisement.remote_address + offset, length};
  }
};
inline ChildSession child_session(int port, std::size_t size, std::uint32_t seed) {
  constexpr std::size_t kProofRoom = 256;  // for the nonce, after the value's bytes
  ChildSession held;
  held.target = std::make_unique<Child>(std::vector<std::string>{
      std::string(DMA_BINARY_DIR) + "/bin/dma-cli", "target", "--provider", "tcp", "--bind",
      "127.0.0.1", "--size", std::to_string(size + kProofRoom), "--fill", std::to_string(seed)});
  if (!held.target->running()) return held;
  const std::string wire = held.target->read_line();
  auto advertisement = parse_advertisement(wire);
  EXPECT_TRUE(advertisement) << "'" << wire << "'";
  if (!advertisement) return held;
  held.advertisement = *advertisement;
  auto connection = std::make_unique<Connection>(port);
  auto hello =
      parse_hello(connection->command({"DMA.HELLO", hex_encode(held.advertisement.address)}));
  EXPECT_TRUE(hello) << hello.error().describe();
  if (!hello) return held;
  for (const auto& address : hello->addresses) {
    EXPECT_EQ("ok", held.target->ask("initiator " + hex_encode(address)));
  }
  EXPECT_LE(hello->nonce.size(), kProofRoom);
  EXPECT_EQ("ok", held.target->ask("put " + std::to_string(size) + " " + hex_encode(hello->nonce)));
  Reply proven = connection->command(with_region({"DMA.PROVE"}, held.region(size, hello->nonce.size())));
  EXPECT_TRUE(proven && proven->type == REDIS_REPLY_STATUS) << "DMA.PROVE: " << error_of(proven);
  if (proven && proven->type == REDIS_REPLY_STATUS) held.connection = std::move(connection);
  return held;
}

// One server with the module on tcp for a whole suite: starting one per test costs an endpoint
// open each. Its log is checked for crashes and sanitizer reports when the suite ends.
class Module : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_ = start_server(); }
  static void TearDownTestSuite() {
    if (server_ == nullptr) return;
    server_->stop();
    // Under asan the module's errors surface in the server's log, not in this process.
    expect_clean_log(server_->log());
    server_.reset();
  }
  void SetUp() override {
    ASSERT_NE(nullptr, server_) << "redis-server with the module did not start";
  }

  int port() const { return server_->port(); }

  // A dma::Client that has said its hello; nullptr with a test failure.
  std::unique_ptr<Client> client() {
    auto made = Client::connect("127.0.0.1", port(), loopback("tcp"));
    EXPECT_TRUE(made) << made.error().describe();
    if (!made) return nullptr;
    Status said = (*made)->hello();
    EXPECT_TRUE(said) << said.error().describe();
    return said ? std::move(*made) : nullptr;
  }

  // A raw connection with a proven session for `target`'s address.
  std::unique_ptr<Connection> session(Target& target) {
    auto connection = std::make_unique<Connection>(port());
    EXPECT_TRUE(connection->ok());
    Status proven = hello_and_prove(*connection, target);
    EXPECT_TRUE(proven) << proven.error().describe();
    return connection;
  }

  // A new client stores and reads back a value under `key` (the server still serves).
  void expect_a_new_client_is_served(const std::string& key, std::uint32_t seed) {
    auto dma = client();
    ASSERT_TRUE(dma);
    const auto value = pattern(4096, seed);
    ASSERT_TRUE(dma->set(key, value));
    std::vector<std::byte> buffer(4096);
    auto read = dma->get(key, buffer);
    ASSERT_TRUE(read && read->has_value());
    EXPECT_TRUE(buffer == value);
  }

  static std::unique_ptr<Target> open_target() {
    auto target = Target::open(loopback("tcp"));
    EXPECT_TRUE(target) << target.error().describe();
    return target ? std::move(*target) : nullptr;
  }

  static std::vector<std::string> region_fields(const RemoteRegion& region) {
    return {std::to_string(region.key), std::to_string(region.address),
            std::to_string(region.length)};
  }

  inline static std::unique_ptr<RedisServer> server_;
};

}  // namespace dma::testing
