// The Redis/Valkey module end to end: a real redis-server loading build/lib/dma.so, real
// dma::Client and raw hiredis connections, the tcp (and, for the HELLO proof, shm) provider over
// loopback. Also the server's teardown with transfers in flight and the HELLO proof's refusals.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

#include "child_process.hpp"
#include "dma/client.hpp"
#include "core.hpp"
#include "dma/protocol.hpp"
#include "dma/target.hpp"
#include "fixtures.hpp"

extern char** environ;

namespace dma {
namespace {

using namespace std::chrono_literals;
using testing::loopback;
using testing::pattern;

constexpr auto kStartDeadline = 30s;

std::string module_path() { return std::string(DMA_BINARY_DIR) + "/lib/dma.so"; }

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof address;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    ::close(fd);
    return 0;
  }
  ::close(fd);
  return ntohs(address.sin_port);
}

[[maybe_unused]] std::string run_output(const std::string& command) {
  std::string out;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return out;
  std::array<char, 512> chunk{};
  while (std::fgets(chunk.data(), chunk.size(), pipe) != nullptr) out += chunk.data();
  ::pclose(pipe);
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

// What the sanitizer builds must add to the uninstrumented redis-server's environment so it
// can load an instrumented module: the runtime has to be loaded first. Reports from inside the
// server land in its log, which Module::TearDownTestSuite checks (tsan does not halt there).
//
// IPATH_NO_BACKTRACE=1 keeps libinfinipath (pulled in by libfabric's psm provider) from replacing
// the server's SIGTERM handler with one that exits 1 (module.cpp, warn_if_sigterm_taken).
std::vector<std::string> sanitizer_environment() {
#if defined(__SANITIZE_ADDRESS__)
  return {"LD_PRELOAD=" + run_output("gcc -print-file-name=libasan.so"),
          "ASAN_OPTIONS=detect_leaks=0", "IPATH_NO_BACKTRACE=1"};
#elif defined(__SANITIZE_THREAD__)
  return {"LD_PRELOAD=" + run_output("gcc -print-file-name=libtsan.so"),
          "TSAN_OPTIONS=halt_on_error=0:report_signal_unsafe=0:suppressions=" +
              std::string(DMA_SOURCE_DIR) + "/tests/tsan.supp",
          "IPATH_NO_BACKTRACE=1"};
#else
  return {"IPATH_NO_BACKTRACE=1"};
#endif
}

struct ReplyDeleter {
  void operator()(redisReply* reply) const noexcept { freeReplyObject(reply); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

// A raw hiredis connection, for commands the Client never sends (malformed ones included).
class Connection {
 public:
  explicit Connection(int port) {
    const timeval timeout{60, 0};
    context_ = redisConnectWithTimeout("127.0.0.1", port, timeout);
    if (context_ != nullptr && context_->err == 0) redisSetTimeout(context_, timeout);
  }
  ~Connection() { close(); }
  void close() {
    if (context_ != nullptr) redisFree(context_);
    context_ = nullptr;
  }
  bool ok() const { return context_ != nullptr && context_->err == 0; }
  Reply command(const std::vector<std::string>& arguments) {
    send(arguments);
    return receive();
  }
  // Queues a command and writes it out without waiting for the reply.
  void send(const std::vector<std::string>& arguments) {
    std::vector<const char*> pointers;
    std::vector<std::size_t> lengths;
    for (const auto& argument : arguments) {
      pointers.push_back(argument.data());
      lengths.push_back(argument.size());
    }
    redisAppendCommandArgv(context_, static_cast<int>(arguments.size()), pointers.data(),
                           lengths.data());
    int done = 0;
    while (done == 0 && redisBufferWrite(context_, &done) == REDIS_OK) {
    }
  }
  Reply receive() {
    void* reply = nullptr;
    if (redisGetReply(context_, &reply) != REDIS_OK) return nullptr;
    return Reply(static_cast<redisReply*>(reply));
  }

 private:
  redisContext* context_ = nullptr;
};

std::string error_of(const Reply& reply) {
  if (!reply) return "<no reply>";
  if (reply->type != REDIS_REPLY_ERROR) return "<not an error, type " + std::to_string(reply->type) + ">";
  return std::string(reply->str, reply->len);
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// A numeric field of `INFO dma` ("in_flight" reads dma_in_flight), or -1 if it is missing.
long long info_field(Connection& connection, const std::string& name) {
  Reply info = connection.command({"INFO", "dma"});
  if (!info || info->type != REDIS_REPLY_STRING) return -1;
  const std::string text(info->str, info->len);
  const std::string label = "dma_" + name + ":";
  const std::size_t at = text.find(label);
  if (at == std::string::npos) return -1;
  return std::stoll(text.substr(at + label.size()));
}

// What a server's log must never contain: a crash, a sanitizer report (asan/ubsan/tsan run inside
// the server, so they report there), an assertion.
void expect_clean_log(const std::string& log) {
  for (const char* report : {"ERROR: AddressSanitizer", "runtime error:", "WARNING: ThreadSanitizer",
                             "Guru Meditation", "crashed by signal", "ASSERTION FAILED"}) {
    EXPECT_FALSE(contains(log, report)) << "redis-server reported a problem:\n" << log;
  }
}

// DMA.HELLO's reply, parsed: [<nonce-hex>, [<address-hex>...]].
struct Hello {
  std::vector<std::uint8_t> nonce;
  std::vector<std::vector<std::uint8_t>> addresses;
};
Result<Hello> parse_hello(const Reply& reply) {
  if (!reply || reply->type != REDIS_REPLY_ARRAY || reply->elements != 2 ||
      reply->element[0]->type != REDIS_REPLY_STRING ||
      reply->element[1]->type != REDIS_REPLY_ARRAY) {
    return fail(ErrorCode::kInvalidArgument, "not [nonce, [addresses]]: " + error_of(reply));
  }
  Hello hello;
  auto nonce = hex_decode(std::string_view(reply->element[0]->str, reply->element[0]->len));
  if (!nonce) return fail(std::move(nonce).error());
  hello.nonce = std::move(*nonce);
  for (std::size_t index = 0; index < reply->element[1]->elements; ++index) {
    const redisReply* element = reply->element[1]->element[index];
    if (element->type != REDIS_REPLY_STRING) return fail(ErrorCode::kInvalidArgument, "address");
    auto address = hex_decode(std::string_view(element->str, element->len));
    if (!address) return fail(std::move(address).error());
    hello.addresses.push_back(std::move(*address));
  }
  return hello;
}

std::vector<std::string> with_region(std::vector<std::string> command, const RemoteRegion& region) {
  command.push_back(std::to_string(region.key));
  command.push_back(std::to_string(region.address));
  command.push_back(std::to_string(region.length));
  return command;
}

// Says DMA.HELLO on `connection` with `target`'s address and proves it honestly (the nonce in
// memory exposed on `target`). Fails with the server's error text.
Status hello_and_prove(Connection& connection, Target& target) {
  auto hello = parse_hello(connection.command({"DMA.HELLO", hex_encode(target.local_address())}));
  if (!hello) return fail(std::move(hello).error());
  for (const auto& address : hello->addresses) {
    if (Status added = target.add_initiator(address); !added) return added;
  }
  std::vector<std::byte> proof(hello->nonce.size());
  std::memcpy(proof.data(), hello->nonce.data(), proof.size());
  auto exposed = target.expose(proof.data(), proof.size());
  if (!exposed) return fail(std::move(exposed).error());
  target.synchronize();
  Reply proven = connection.command(with_region({"DMA.PROVE"}, exposed->whole()));
  if (!proven || proven->type != REDIS_REPLY_STATUS) {
    return fail(ErrorCode::kInvalidArgument, "DMA.PROVE: " + error_of(proven));
  }
  return {};
}

// A redis-server child with the module loaded, killed and reaped on destruction.
class RedisServer {
 public:
  // Starts the server; `extra` are more module arguments. Returns nullptr (with a test failure)
  // if it does not answer PING before the deadline.
  static std::unique_ptr<RedisServer> start(const std::vector<std::string>& extra = {},
                                            const std::string& provider = "tcp",
                                            const std::vector<std::string>& server_options = {}) {
    auto server = std::unique_ptr<RedisServer>(new RedisServer());
    if (!server->spawn(extra, true, provider, server_options)) return nullptr;
    const auto deadline = std::chrono::steady_clock::now() + kStartDeadline;
    while (std::chrono::steady_clock::now() < deadline) {
      if (server->exited()) {
        ADD_FAILURE() << "redis-server exited during startup:\n" << server->log();
        return nullptr;
      }
      Connection probe(server->port());
      if (probe.ok()) {
        Reply pong = probe.command({"PING"});
        if (pong && pong->type == REDIS_REPLY_STATUS) return server;
      }
      std::this_thread::sleep_for(20ms);  // polling a child that cannot notify us
    }
    ADD_FAILURE() << "redis-server did not answer PING within the deadline:\n" << server->log();
    return nullptr;
  }

  // Runs a server expected to fail at startup; returns its exit status (-1 on deadline).
  static int run_to_exit(const std::vector<std::string>& module_arguments, std::string& log) {
    RedisServer server;
    if (!server.spawn(module_arguments, /*defaults=*/false)) return -1;
    const auto deadline = std::chrono::steady_clock::now() + kStartDeadline;
    while (std::chrono::steady_clock::now() < deadline) {
      if (server.exited()) {
        log = server.log();
        return server.status_;
      }
      std::this_thread::sleep_for(20ms);
    }
    log = server.log();
    return -1;
  }

  ~RedisServer() { stop(); }

  // Stops the server (SIGTERM, then SIGKILL past a deadline) and reaps it.
  void stop() {
    if (pid_ <= 0 || reaped_) return;
    ::kill(pid_, SIGTERM);
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (std::chrono::steady_clock::now() < deadline && !exited()) {
      std::this_thread::sleep_for(10ms);
    }
    if (!reaped_) {
      ::kill(pid_, SIGKILL);
      int status = 0;
      ::waitpid(pid_, &status, 0);
      status_ = 128 + SIGKILL;
    }
    reaped_ = true;
  }

  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  // Waits up to `deadline` for the server to exit on its own; its exit status (128 + signal if
  // killed), or -1 if it is still running at the deadline.
  int wait_for_exit(std::chrono::milliseconds deadline) {
    const auto until = std::chrono::steady_clock::now() + deadline;
    while (!exited() && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(10ms);  // polling a child that cannot notify us
    }
    return exited() ? status_ : -1;
  }
  bool exited() {
    if (reaped_) return true;
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      reaped_ = true;
      status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    return reaped_;
  }
  std::string log() const {
    std::ifstream in(log_path_);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }

 private:
  RedisServer() = default;
  struct LogRemover {
    std::string* path;
    ~LogRemover() {
      std::error_code ignored;
      if (!path->empty()) std::filesystem::remove(*path, ignored);
    }
  };

  bool spawn(const std::vector<std::string>& extra, bool defaults = true,
             const std::string& provider = "tcp",
             const std::vector<std::string>& server_options = {}) {
    port_ = free_port();
    log_path_ = (std::filesystem::temp_directory_path() /
                 ("dma-module-" + std::to_string(::getpid()) + "-" + std::to_string(port_) + ".log"))
                    .string();
    std::vector<std::string> arguments = {"redis-server", "--port", std::to_string(port_),
                                          "--bind", "127.0.0.1", "--save", "", "--appendonly",
                                          "no"};
    arguments.insert(arguments.end(), server_options.begin(), server_options.end());
    arguments.push_back("--loadmodule");
    arguments.push_back(module_path());
    if (defaults) {
      for (const std::string& argument : {std::string("providers"), provider,
                                          std::string("bind"), std::string("127.0.0.1")}) {
        arguments.push_back(argument);
      }
    }
    arguments.insert(arguments.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (auto& argument : arguments) argv.push_back(argument.data());
    argv.push_back(nullptr);

    // The sanitizer variables replace inherited ones (getenv sees the first of duplicates).
    const std::vector<std::string> added = sanitizer_environment();
    std::vector<std::string> environment;
    for (char** entry = environ; *entry != nullptr; ++entry) {
      const std::string_view inherited(*entry);
      const bool replaced = std::any_of(added.begin(), added.end(), [&](const std::string& mine) {
        return inherited.substr(0, inherited.find('=') + 1) == mine.substr(0, mine.find('=') + 1);
      });
      if (!replaced) environment.emplace_back(inherited);
    }
    environment.insert(environment.end(), added.begin(), added.end());
    std::vector<char*> envp;
    for (auto& entry : environment) envp.push_back(entry.data());
    envp.push_back(nullptr);

    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                     0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    const int spawned =
        ::posix_spawnp(&pid_, "redis-server", &actions, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    if (spawned != 0) {
      ADD_FAILURE() << "cannot start redis-server: " << std::strerror(spawned);
      pid_ = -1;
      return false;
    }
    return true;
  }

  pid_t pid_ = -1;
  int port_ = 0;
  bool reaped_ = false;
  int status_ = -1;
  std::string log_path_;
  LogRemover remove_log_{&log_path_};  // declared last: runs after stop() in the destructor
};


// One server for the suite: starting one costs an endpoint open per test otherwise.
class Module : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = RedisServer::start().release();
  }
  static void TearDownTestSuite() {
    if (server_ == nullptr) return;
    server_->stop();
    // Under asan the module's errors surface in the server's log, not in this process.
    expect_clean_log(server_->log());
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override {
    ASSERT_NE(nullptr, server_) << "redis-server with the module did not start";
  }

  int port() const { return server_->port(); }

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

  static std::unique_ptr<Target> open_target() {
    auto target = Target::open(loopback("tcp"));
    EXPECT_TRUE(target) << target.error().describe();
    return target ? std::move(*target) : nullptr;
  }

  static std::vector<std::string> region_fields(const RemoteRegion& region) {
    return {std::to_string(region.key), std::to_string(region.address),
            std::to_string(region.length)};
  }

  static std::string as_string(const std::vector<std::byte>& bytes) {
    return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  }

  static RedisServer* server_;
};
RedisServer* Module::server_ = nullptr;

TEST_F(Module, hello_replies_with_a_fresh_nonce_and_every_service_address_and_only_once) {
  // A client that cannot learn the server's addresses cannot insert its initiator (efa-direct);
  // a nonce reused across hellos could be replayed; a second hello on one connection must not
  // stack a second session.
  auto target = open_target();
  ASSERT_TRUE(target);
  Connection connection(port());
  auto hello = parse_hello(connection.command({"DMA.HELLO", hex_encode(target->local_address())}));
  ASSERT_TRUE(hello) << hello.error().describe();
  EXPECT_EQ(module::kNonceBytes, hello->nonce.size());
  ASSERT_GE(hello->addresses.size(), 1u);
  for (const auto& address : hello->addresses) EXPECT_FALSE(address.empty());
  Reply again = connection.command({"DMA.HELLO", hex_encode(target->local_address())});
  EXPECT_TRUE(contains(error_of(again), "already has a session")) << error_of(again);

  Connection other(port());
  auto second = parse_hello(other.command({"DMA.HELLO", hex_encode(target->local_address())}));
  ASSERT_TRUE(second) << second.error().describe();
  EXPECT_NE(hello->nonce, second->nonce) << "every hello must get its own nonce";
}

TEST_F(Module, hello_refuses_bad_hex_and_unusable_addresses) {
  // A malformed address must be refused at hello, before any transfer could use it.
  Connection connection(port());
  EXPECT_TRUE(contains(error_of(connection.command({"DMA.HELLO", "zz"})), "hex"));
  EXPECT_TRUE(contains(error_of(connection.command({"DMA.HELLO", "abc"})), "ERR"));
  EXPECT_TRUE(contains(error_of(connection.command({"DMA.HELLO", ""})), "ERR"));
  EXPECT_TRUE(contains(error_of(connection.command({"DMA.HELLO", std::string(32, 'f')})), "ERR"));
  // The connection has no session after a refused hello.
  EXPECT_TRUE(contains(error_of(connection.command({"DMA.GET", "k", "1", "0", "8"})), "no session"));
}

TEST_F(Module, set_then_get_round_trips_every_size) {
  // The core promise: what DMA.SET stores, plain GET and DMA.GET return byte for byte, from an
  // empty value to 64 MiB.
  auto dma = client();
  ASSERT_TRUE(dma);
  Connection plain(port());
  std::uint32_t seed = 1;
  for (std::size_t size : {std::size_t{0}, std::size_t{1}, std::size_t{4096}, std::size_t{1} << 20,
                           std::size_t{64} << 20}) {
    SCOPED_TRACE("size " + std::to_string(size));
    const std::string key = "round-trip-" + std::to_string(size);
    const auto value = pattern(size, seed++);
    Status stored = dma->set(key, value);
    ASSERT_TRUE(stored) << stored.error().describe();
    Reply got = plain.command({"GET", key});
    ASSERT_TRUE(got);
    ASSERT_EQ(REDIS_REPLY_STRING, got->type);
    ASSERT_EQ(size, got->len);
    EXPECT_TRUE(size == 0 || std::memcmp(got->str, value.data(), size) == 0)
        << "GET must return the bytes read";
    std::vector<std::byte> buffer(size + 16, std::byte{0x5a});
    auto read = dma->get(key, buffer);
    ASSERT_TRUE(read) << read.error().describe();
    ASSERT_TRUE(read->has_value());
    ASSERT_EQ(size, **read);
    EXPECT_TRUE(size == 0 || std::memcmp(buffer.data(), value.data(), size) == 0);
    EXPECT_EQ(std::byte{0x5a}, buffer[size]) << "nothing may be written past the value";
  }
}

TEST_F(Module, buffers_exposed_once_serve_many_gets_and_sets) {
  // If this fails, a client that keeps one buffer exposed (to skip a registration per call)
  // reads stale or foreign bytes, or a SET of part of its buffer stores the wrong length.
  auto dma = client();
  ASSERT_TRUE(dma);
  Connection plain(port());
  std::vector<std::byte> memory(64 << 10, std::byte{0x5a});
  auto exposed = dma->target().expose(memory.data(), memory.size());
  ASSERT_TRUE(exposed) << exposed.error().describe();
  for (std::uint32_t round = 0; round < 8; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    const std::size_t size = (std::size_t{1} << round) * 257;  // 257 B .. 32 KiB, not the buffer's
    const auto value = pattern(size, 100 + round);
    std::memcpy(memory.data(), value.data(), size);  // written after the buffer was exposed
    Status stored = dma->set("exposed-once", *exposed, size);
    ASSERT_TRUE(stored) << stored.error().describe();
    Reply got = plain.command({"GET", "exposed-once"});
    ASSERT_TRUE(got);
    ASSERT_EQ(REDIS_REPLY_STRING, got->type);
    ASSERT_EQ(size, got->len) << "the SET stored more or less than asked";
    ASSERT_EQ(0, std::memcmp(got->str, value.data(), size));

    std::fill(memory.begin(), memory.end(), std::byte{0});
    auto read = dma->get("exposed-once", *exposed);
    ASSERT_TRUE(read) << read.error().describe();
    ASSERT_EQ(size, read->value());
    ASSERT_EQ(0, std::memcmp(memory.data(), value.data(), size));
    EXPECT_EQ(std::byte{0}, memory[size]) << "nothing may be written past the value";
  }
  auto missing = dma->get("exposed-once-missing", *exposed);
  ASSERT_TRUE(missing) << missing.error().describe();
  EXPECT_FALSE(missing->has_value());
  Status too_long = dma->set("exposed-once", *exposed, memory.size() + 1);
  ASSERT_FALSE(too_long);
  EXPECT_EQ(ErrorCode::kInvalidArgument, too_long.error().code());
  Reply kept = plain.command({"STRLEN", "exposed-once"});
  ASSERT_TRUE(kept);
  EXPECT_EQ(257 * 128, kept->integer) << "a refused SET changed the key";
}

TEST_F(Module, dma_get_returns_a_value_stored_by_plain_set) {
  // Values written by ordinary clients (including integer-encoded ones) must be readable.
  auto dma = client();
  ASSERT_TRUE(dma);
  Connection plain(port());
  ASSERT_TRUE(plain.command({"SET", "plain-key", "hello, fabric"}));
  ASSERT_TRUE(plain.command({"SET", "plain-number", "12345"}));
  std::vector<std::byte> buffer(64);
  auto read = dma->get("plain-key", buffer);
  ASSERT_TRUE(read) << read.error().describe();
  ASSERT_EQ(13u, read->value());
  EXPECT_EQ("hello, fabric", std::string(reinterpret_cast<char*>(buffer.data()), 13));
  read = dma->get("plain-number", buffer);
  ASSERT_TRUE(read) << read.error().describe();
  ASSERT_EQ(5u, read->value());
  EXPECT_EQ("12345", std::string(reinterpret_cast<char*>(buffer.data()), 5));
}

TEST_F(Module, dma_get_of_a_missing_key_is_nil) {
  // A missing key must read as nil, not as an empty value or an error.
  auto dma = client();
  ASSERT_TRUE(dma);
  std::vector<std::byte> buffer(16);
  auto read = dma->get("no-such-key", buffer);
  ASSERT_TRUE(read) << read.error().describe();
  EXPECT_FALSE(read->has_value());
}

TEST_F(Module, dma_get_of_a_list_is_wrongtype) {
  // Only strings have bytes to move; anything else is the usual WRONGTYPE.
  auto target = open_target();
  ASSERT_TRUE(target);
  auto connection = session(*target);
  ASSERT_TRUE(connection->command({"RPUSH", "a-list", "x"}));
  std::vector<std::byte> buffer(64);
  auto exposed = target->expose(buffer.data(), buffer.size());
  ASSERT_TRUE(exposed);
  std::vector<std::string> command = {"DMA.GET", "a-list"};
  for (auto& field : region_fields(exposed->whole())) command.push_back(field);
  EXPECT_TRUE(contains(error_of(connection->command(command)), "WRONGTYPE"));
}

TEST_F(Module, a_crc_mismatch_fails_the_set_and_leaves_the_key_untouched) {
  // Bytes that do not match the client's checksum must never replace a good value.
  auto target = open_target();
  ASSERT_TRUE(target);
  auto connection = session(*target);
  ASSERT_TRUE(connection->command({"SET", "guarded", "original"}));
  auto bytes = pattern(1000, 7);
  auto exposed = target->expose(bytes.data(), bytes.size());
  ASSERT_TRUE(exposed);
  const std::uint32_t wrong = crc32c(bytes) ^ 1u;
  std::vector<std::string> command = {"DMA.SET", "guarded", "1000", "CRC", std::to_string(wrong)};
  for (auto& field : region_fields(exposed->whole())) command.push_back(field);
  EXPECT_TRUE(contains(error_of(connection->command(command)), "CRC32C mismatch"));
  Reply value = connection->command({"GET", "guarded"});
  ASSERT_TRUE(value && value->type == REDIS_REPLY_STRING);
  EXPECT_EQ("original", std::string(value->str, value->len));

  command[4] = std::to_string(crc32c(bytes));
  Reply stored = connection->command(command);
  ASSERT_TRUE(stored && stored->type == REDIS_REPLY_ARRAY) << error_of(stored);
  value = connection->command({"GET", "guarded"});
  EXPECT_EQ(as_string(bytes), std::string(value->str, value->len));
}

TEST_F(Module, multi_region_transfers_fill_and_drain_regions_in_order) {
  // A value spread over several regions must land in (and be read from) them in the order
  // given, each region filled before the next.
  auto target = open_target();
  ASSERT_TRUE(target);
  auto connection = session(*target);
  std::vector<std::byte> memory(300, std::byte{0});
  auto exposed = target->expose(memory.data(), memory.size());
  ASSERT_TRUE(exposed);
  const auto value = pattern(250, 9);
  ASSERT_TRUE(connection->command({"SET", "spread", as_string(value)}));
  // Regions: [200, 300), [0, 100), [100, 200) -- the value fills them in that order.
  std::vector<std::string> command = {"DMA.GET", "spread"};
  for (auto region : {exposed->region(200, 100), exposed->region(0, 100), exposed->region(100, 100)}) {
    for (auto& field : region_fields(region)) command.push_back(field);
  }
  Reply got = connection->command(command);
  ASSERT_TRUE(got && got->type == REDIS_REPLY_ARRAY) << error_of(got);
  EXPECT_EQ(250, got->element[0]->integer);
  EXPECT_EQ(0, std::memcmp(memory.data() + 200, value.data(), 100));
  EXPECT_EQ(0, std::memcmp(memory.data(), value.data() + 100, 100));
  EXPECT_EQ(0, std::memcmp(memory.data() + 100, value.data() + 200, 50));

  // And back: DMA.SET reads the regions in the order given.
  command = {"DMA.SET", "spread-back", "250"};
  for (auto region : {exposed->region(200, 100), exposed->region(0, 100), exposed->region(100, 100)}) {
    for (auto& field : region_fields(region)) command.push_back(field);
  }
  Reply stored = connection->command(command);
  ASSERT_TRUE(stored && stored->type == REDIS_REPLY_ARRAY) << error_of(stored);
  Reply back = connection->command({"GET", "spread-back"});
  ASSERT_TRUE(back && back->type == REDIS_REPLY_STRING);
  EXPECT_EQ(as_string(value), std::string(back->str, back->len));
}

TEST_F(Module, several_clients_at_once_each_get_their_own_values) {
  // Sessions are per connection: concurrent clients must never see each other's bytes.
  constexpr int kClients = 4;
  constexpr int kRounds = 10;
  std::vector<std::thread> threads;
  std::vector<std::string> failures(kClients);
  for (int index = 0; index < kClients; ++index) {
    threads.emplace_back([&, index] {
      auto made = Client::connect("127.0.0.1", port(), loopback("tcp"));
      if (!made || !(*made)->hello()) {
        failures[index] = "could not connect";
        return;
      }
      for (int round = 0; round < kRounds; ++round) {
        const std::string key = "concurrent-" + std::to_string(index) + "-" + std::to_string(round);
        const auto value = pattern(65536 + index, 100 * index + round);
        if (Status stored = (*made)->set(key, value); !stored) {
          failures[index] = stored.error().describe();
          return;
        }
        std::vector<std::byte> buffer(value.size());
        auto read = (*made)->get(key, buffer);
        if (!read || !read->has_value() || buffer != value) {
          failures[index] = "round " + std::to_string(round) + " read back wrong";
          return;
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (int index = 0; index < kClients; ++index) EXPECT_EQ("", failures[index]) << "client " << index;
}

TEST_F(Module, overwriting_or_deleting_during_dma_get_still_delivers_the_old_bytes) {
  // The write must carry the value as it was when DMA.GET ran: the key's memory may be freed
  // or rewritten by the next command while the write is still on the wire.
  auto target = open_target();
  ASSERT_TRUE(target);
  auto connection = session(*target);
  Connection other(port());
  const std::size_t size = std::size_t{32} << 20;
  const auto old_value = pattern(size, 21);
  ASSERT_TRUE(connection->command({"SET", "changing", as_string(old_value)}));
  std::vector<std::byte> memory(size);
  auto exposed = target->expose(memory.data(), memory.size());
  ASSERT_TRUE(exposed);
  std::vector<std::string> command = {"DMA.GET", "changing"};
  for (auto& field : region_fields(exposed->whole())) command.push_back(field);
  connection->send(command);
  // The DMA.GET is ahead of these on the server (it was written first and the server is
  // single-threaded), so they run while its write is in flight or after it.
  ASSERT_TRUE(other.command({"SET", "changing", as_string(pattern(size, 22))}));
  ASSERT_TRUE(other.command({"DEL", "changing"}));
  Reply got = connection->receive();
  ASSERT_TRUE(got && got->type == REDIS_REPLY_ARRAY) << error_of(got);
  EXPECT_EQ(static_cast<long long>(size), got->element[0]->integer);
  EXPECT_EQ(static_cast<long long>(crc32c(old_value)), got->element[1]->integer);
  EXPECT_TRUE(memory == old_value);
}

TEST_F(Module, transfers_without_a_hello_are_refused) {
  // Without a session the server has no address to write to.
  Connection connection(port());
  EXPECT_TRUE(contains(error_of(connection.command({"DMA.GET", "k", "1", "0", "8"})), "no session"));
  EXPECT_TRUE(contains(error_of(connection.command({"DMA.SET", "k", "8", "1", "0", "8"})),
                       "no session"));
}

TEST_F(Module, malformed_commands_are_refused_precisely) {
  // Every malformed argument must fail with its own reason and never reach the fabric.
  auto target = open_target();
  ASSERT_TRUE(target);
  auto connection = session(*target);
  ASSERT_TRUE(connection->command({"SET", "hundred", std::string(100, 'x')}));
  std::vector<std::byte> memory(4096);
  auto exposed = target->expose(memory.data(), memory.size());
  ASSERT_TRUE(exposed);
  const std::string key = std::to_string(exposed->advertisement().key);
  const std::string base = std::to_string(exposed->advertisement().remote_address);
  struct Case {
    std::vector<std::string> command;
    std::string expect;
  };
  std::vector<std::string> too_many = {"DMA.GET", "hundred"};
  for (int index = 0; index < 257; ++index) {
    too_many.insert(too_many.end(), {key, base, "1"});
  }
  const std::vector<Case> cases = {
      {{"DMA.GET", "hundred", key, base}, "wrong number of arguments"},
      {{"DMA.GET", "hundred", key, base, "10", "1"}, "wrong number of arguments"},
      {{"DMA.SET", "hundred", "5", key, base}, "wrong number of arguments"},
      {{"DMA.HELLO"}, "wrong number of arguments"},
      {{"DMA.INFO", "extra"}, "wrong number of arguments"},
      {{"DMA.GET", "hundred", "abc", base, "100"}, "rkey"},
      {{"DMA.GET", "hundred", key, "-1", "100"}, "addr"},
      {{"DMA.GET", "hundred", key, base, "18446744073709551616"}, "len"},
      {{"DMA.GET", "hundred", key, base, "+100"}, "len"},
      {{"DMA.GET", "hundred", key, base, "0"}, "zero length"},
      {{"DMA.GET", "hundred", key, "18446744073709551615", "2"}, "overflows"},
      {{"DMA.GET", "hundred", key, base, "50"}, "fewer than the value's 100"},
      {{"DMA.SET", "hundred", "100", key, base, "50"}, "fewer than the 100"},
      {{"DMA.SET", "hundred", "x", key, base, "50"}, "length"},
      {{"DMA.SET", "hundred", "10", "CRC", "4294967296", key, base, "50"}, "32 bits"},
      {{"DMA.SET", "hundred", "10", "CRC", "-1", key, base, "50"}, "crc32c"},
      {{"DMA.SET", "hundred", "536870913", key, base, "4096"}, "max-value-size"},
      {too_many, "at most 256"},
  };
  for (const Case& bad : cases) {
    std::string shown;
    for (std::size_t index = 0; index < std::min<std::size_t>(bad.command.size(), 8); ++index) {
      shown += bad.command[index] + " ";
    }
    SCOPED_TRACE(shown);
    const std::string error = error_of(connection->command(bad.command));
    EXPECT_TRUE(contains(error, bad.expect)) << error;
  }
  Reply value = connection->command({"GET", "hundred"});
  ASSERT_TRUE(value && value->type == REDIS_REPLY_STRING);
  EXPECT_EQ(std::string(100, 'x'), std::string(value->str, value->len)) << "no refusal may write";
}

TEST_F(Module, a_failed_read_never_changes_the_key) {
  // A SET whose read fails (here: a key the target never exposed) must leave the key alone.
  auto target = open_target();
  ASSERT_TRUE(target);
  auto connection = session(*target);
  ASSERT_TRUE(connection->command({"SET", "kept", "before"}));
  std::vector<std::byte> memory(64);
  auto exposed = target->expose(memory.data(), memory.size());
  ASSERT_TRUE(exposed);
  const std::string bogus_key = std::to_string(exposed->advertisement().key + 1000);
  Reply failed = connection->command({"DMA.SET", "kept", "64", bogus_key,
                                      std::to_string(exposed->advertisement().remote_address), "64"});
  ASSERT_TRUE(failed);
  EXPECT_EQ(REDIS_REPLY_ERROR, failed->type);
  Reply value = connection->command({"GET", "kept"});
  ASSERT_TRUE(value && value->type == REDIS_REPLY_STRING);
  EXPECT_EQ("before", std::string(value->str, value->len));
}

TEST_F(Module, transfers_cannot_run_inside_multi) {
  // A blocking command inside MULTI would never get its reply; it must be refused instead.
  auto target = open_target();
  ASSERT_TRUE(target);
  auto connection = session(*target);
  ASSERT_TRUE(connection->command({"MULTI"}));
  connection->command({"DMA.GET", "anything", "1", "0", "8"});
  Reply executed = connection->command({"EXEC"});
  ASSERT_TRUE(executed && executed->type == REDIS_REPLY_ARRAY);
  ASSERT_EQ(1u, executed->elements);
  EXPECT_EQ(REDIS_REPLY_ERROR, executed->element[0]->type);
}

TEST_F(Module, a_client_disconnecting_mid_transfer_leaves_the_server_serving) {
  // A blocked client that vanishes must not crash the server, leak its session or strand its
  // transfer; the next client must be served normally.
  {
    auto target = open_target();
    ASSERT_TRUE(target);
    Connection watcher(port());
    const long long sessions_before = info_field(watcher, "sessions");
    const long long finished_before = info_field(watcher, "transfers_to_clients") +
                                      info_field(watcher, "transfers_from_clients") +
                                      info_field(watcher, "errors");
    auto connection = session(*target);
    const std::size_t size = std::size_t{32} << 20;
    ASSERT_TRUE(connection->command({"SET", "big-for-disconnect", std::string(size, 'q')}));
    std::vector<std::byte> memory(size);
    auto exposed = target->expose(memory.data(), memory.size());
    ASSERT_TRUE(exposed);
    std::vector<std::string> get = {"DMA.GET", "big-for-disconnect"};
    for (auto& field : region_fields(exposed->whole())) get.push_back(field);
    // A blocked client runs one command at a time, so one transfer is all it can leave behind.
    connection->send(get);
    connection->close();
    // Keep the target and its memory until the server is done with them (below).
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    bool drained = false;
    while (!drained && std::chrono::steady_clock::now() < deadline) {
      const long long finished = info_field(watcher, "transfers_to_clients") +
                                 info_field(watcher, "transfers_from_clients") +
                                 info_field(watcher, "errors");
      drained = finished >= finished_before + 1 && info_field(watcher, "in_flight") == 0 &&
                info_field(watcher, "sessions") <= sessions_before;
      if (!drained) std::this_thread::sleep_for(20ms);  // polling the server's counters
    }
    ASSERT_TRUE(drained) << "the abandoned transfers never finished, or the session outlived "
                            "its connection: sessions "
                         << info_field(watcher, "sessions") << " (before " << sessions_before
                         << "), in flight " << info_field(watcher, "in_flight") << ", finished "
                         << info_field(watcher, "transfers_to_clients") << "+"
                         << info_field(watcher, "transfers_from_clients") << "+"
                         << info_field(watcher, "errors") << " (before " << finished_before << ")";
  }
  auto dma = client();
  ASSERT_TRUE(dma);
  const auto value = pattern(4096, 33);
  ASSERT_TRUE(dma->set("after-disconnect", value));
  std::vector<std::byte> buffer(4096);
  auto read = dma->get("after-disconnect", buffer);
  ASSERT_TRUE(read && read->has_value());
  EXPECT_TRUE(buffer == value);
}

TEST_F(Module, info_reports_sessions_and_traffic) {
  // Operators need the counters: INFO dma and DMA.INFO must report sessions and bytes moved.
  auto dma = client();
  ASSERT_TRUE(dma);
  ASSERT_TRUE(dma->set("counted", pattern(1000, 5)));
  Connection connection(port());
  Reply info = connection.command({"INFO", "dma"});
  ASSERT_TRUE(info);
  const std::string text(info->str, info->len);
  for (const char* field : {"dma_sessions:", "dma_transfers_to_clients:", "dma_transfers_from_clients:",
                            "dma_bytes_to_clients:", "dma_bytes_from_clients:", "dma_errors:",
                            "dma_in_flight:", "dma_latency_avg_us:", "dma_latency_max_us:"}) {
    EXPECT_TRUE(contains(text, field)) << field << " missing from\n" << text;
  }
  EXPECT_FALSE(contains(text, "dma_bytes_from_clients:0\r")) << text;
  EXPECT_FALSE(contains(text, "dma_latency_max_us:0\r")) << "a finished transfer takes time\n" << text;
  Reply described = connection.command({"DMA.INFO"});
  ASSERT_TRUE(described && described->type == REDIS_REPLY_ARRAY) << error_of(described);
  ASSERT_EQ(16u, described->elements);
  EXPECT_EQ("endpoints", std::string(described->element[14]->str, described->element[14]->len));
  ASSERT_EQ(REDIS_REPLY_ARRAY, described->element[15]->type);
  ASSERT_GE(described->element[15]->elements, 1u);
  const redisReply* endpoint = described->element[15]->element[0];
  ASSERT_EQ(REDIS_REPLY_ARRAY, endpoint->type);
  EXPECT_TRUE(contains(std::string(endpoint->element[3]->str, endpoint->element[3]->len), "tcp"));
}

TEST_F(Module, dma_cli_set_and_get_move_a_file_through_the_module) {
  // People at a shell use dma-cli get|set; a file stored with one must come back byte for byte
  // with the other, and be visible to plain GET.
  const std::string directory = ::testing::TempDir() + "dma-cli-" + std::to_string(::getpid());
  std::filesystem::create_directories(directory);
  const std::string in_path = directory + "/in.bin";
  const std::string out_path = directory + "/out.bin";
  const auto value = pattern(300000, 42);
  {
    std::ofstream out(in_path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(value.data()), static_cast<std::streamsize>(value.size()));
  }
  const std::string cli = DMA_BINARY_DIR "/bin/dma-cli";
  const std::string port_text = std::to_string(port());
  testing::Child set({cli, "set", "--provider", "tcp", "--port", port_text, "cli-key", in_path});
  std::string said;
  EXPECT_EQ(0, set.finish(&said)) << said;
  testing::Child get({cli, "get", "--provider", "tcp", "--port", port_text, "cli-key", out_path});
  EXPECT_EQ(0, get.finish(&said)) << said;
  std::ifstream back(out_path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(back)), std::istreambuf_iterator<char>());
  ASSERT_EQ(value.size(), bytes.size());
  EXPECT_EQ(0, std::memcmp(value.data(), bytes.data(), bytes.size()));
  testing::Child missing({cli, "get", "--provider", "tcp", "--port", port_text, "no-such-key", out_path},
                         true);
  EXPECT_EQ(1, missing.finish(&said));
  EXPECT_TRUE(contains(said, "no such key")) << said;
  std::filesystem::remove_all(directory);
}

TEST_F(Module, a_set_over_max_value_size_is_refused_naming_the_limit_and_the_key_keeps_its_value) {
  // An oversized SET must fail before any byte is read or allocated, say which limit it hit and
  // its value, and leave the stored value alone.
  auto target = open_target();
  ASSERT_TRUE(target);
  auto connection = session(*target);
  ASSERT_TRUE(connection->command({"SET", "limited", "before"}));
  std::vector<std::byte> memory(4096);
  auto exposed = target->expose(memory.data(), memory.size());
  ASSERT_TRUE(exposed);
  const std::string error = error_of(connection->command(
      with_region({"DMA.SET", "limited", std::to_string(module::kDefaultMaxValueSize + 1)},
                  exposed->whole())));
  EXPECT_TRUE(contains(error, "max-value-size " + std::to_string(module::kDefaultMaxValueSize)))
      << error;
  EXPECT_TRUE(contains(error, std::to_string(module::kDefaultMaxValueSize + 1))) << error;
  Reply value = connection->command({"GET", "limited"});
  ASSERT_TRUE(value && value->type == REDIS_REPLY_STRING);
  EXPECT_EQ("before", std::string(value->str, value->len));
}

TEST_F(Module, a_get_into_a_region_smaller_than_the_value_names_both_sizes_and_writes_nothing) {
  // A GET that does not fit must be refused before the write: writing a prefix (or past the
  // region) would scribble over whatever the client keeps next to it.
  auto target = open_target();
  ASSERT_TRUE(target);
  auto connection = session(*target);
  ASSERT_TRUE(connection->command({"SET", "does-not-fit", std::string(100, 'v')}));
  std::vector<std::byte> memory(128, std::byte{0x5a});
  auto exposed = target->expose(memory.data(), memory.size());
  ASSERT_TRUE(exposed);
  const std::string error = error_of(
      connection->command(with_region({"DMA.GET", "does-not-fit"}, exposed->region(0, 50))));
  EXPECT_TRUE(contains(error, "hold 50 bytes")) << error;
  EXPECT_TRUE(contains(error, "value's 100")) << error;
  target->synchronize();
  EXPECT_TRUE(std::all_of(memory.begin(), memory.end(), [](std::byte b) { return b == std::byte{0x5a}; }))
      << "a refused GET wrote into the client's memory";
}

TEST_F(Module, a_client_disconnecting_mid_set_never_leaves_a_partial_or_foreign_value) {
  // A SET abandoned by its client (connection closed, target gone, while the read is in flight)
  // must leave the key holding the old value or the whole new one, never a mix; the server must
  // keep serving.
  Connection watcher(port());
  const std::size_t size = std::size_t{16} << 20;
  const auto old_value = pattern(size, 61);
  ASSERT_TRUE(watcher.command({"SET", "abandoned-set", as_string(old_value)}));
  const auto new_value = pattern(size, 62);
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    auto target = open_target();
    ASSERT_TRUE(target);
    auto connection = session(*target);
    std::vector<std::byte> memory = new_value;
    auto registered = target->expose(memory.data(), memory.size());
    ASSERT_TRUE(registered);
    std::optional<Exposed> exposed(std::move(*registered));
    connection->send(with_region({"DMA.SET", "abandoned-set", std::to_string(size), "CRC",
                                  std::to_string(crc32c(new_value))},
                                 exposed->whole()));
    connection->close();
    exposed.reset();  // the registration goes: a read still on the wire now fails
    target.reset();       // and the endpoint with it (memory outlives both)
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    while (info_field(watcher, "in_flight") != 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(20ms);  // polling the server's counters
    }
    ASSERT_EQ(0, info_field(watcher, "in_flight")) << "the abandoned SET never finished";
    Reply value = watcher.command({"GET", "abandoned-set"});
    ASSERT_TRUE(value && value->type == REDIS_REPLY_STRING);
    const std::string stored(value->str, value->len);
    EXPECT_TRUE(stored == as_string(old_value) || stored == as_string(new_value))
        << "the key holds " << stored.size() << " bytes that are neither the old nor the new value";
  }
  auto dma = client();
  ASSERT_TRUE(dma);
  const auto value = pattern(4096, 63);
  ASSERT_TRUE(dma->set("after-abandoned-set", value));
  std::vector<std::byte> buffer(4096);
  auto read = dma->get("after-abandoned-set", buffer);
  ASSERT_TRUE(read && read->has_value());
  EXPECT_TRUE(buffer == value);
}

TEST_F(Module, re_advertising_on_new_connections_while_old_transfers_fly_serves_everyone) {
  // A client that restarts (new target, new address) or opens a second connection from the same
  // target while its old connection still has transfers in flight must be served correctly, and
  // closing the old connection must not pull the shared address out from under the new one.
  const std::size_t size = std::size_t{32} << 20;
  const auto big = pattern(size, 71);
  Connection writer(port());
  ASSERT_TRUE(writer.command({"SET", "re-hello-big", as_string(big)}));
  auto first = open_target();
  ASSERT_TRUE(first);
  auto old_connection = session(*first);
  std::vector<std::byte> landing(size);
  auto exposed = first->expose(landing.data(), landing.size());
  ASSERT_TRUE(exposed);
  const auto get_big = with_region({"DMA.GET", "re-hello-big"}, exposed->whole());
  old_connection->send(get_big);
  old_connection->send(get_big);

  // A restarted client: a new target and address on a new connection.
  auto restarted = client();
  ASSERT_TRUE(restarted);
  const auto small = pattern(70000, 72);
  ASSERT_TRUE(restarted->set("re-hello-small", small));
  // The same target (same address) on a second connection.
  auto same_address = session(*first);
  std::vector<std::byte> small_memory(70000);
  auto small_exposed = first->expose(small_memory.data(), small_memory.size());
  ASSERT_TRUE(small_exposed);
  Reply got = same_address->command(with_region({"DMA.GET", "re-hello-small"}, small_exposed->whole()));
  ASSERT_TRUE(got && got->type == REDIS_REPLY_ARRAY) << error_of(got);
  first->synchronize();
  EXPECT_TRUE(small_memory == small);

  // The old connection's transfers complete into the old memory, then it goes away.
  for (int index = 0; index < 2; ++index) {
    Reply done = old_connection->receive();
    ASSERT_TRUE(done && done->type == REDIS_REPLY_ARRAY) << error_of(done);
    EXPECT_EQ(static_cast<long long>(crc32c(big)), done->element[1]->integer);
  }
  first->synchronize();
  EXPECT_TRUE(landing == big);
  old_connection->send(get_big);
  old_connection->close();  // with a transfer (likely) in flight
  std::fill(small_memory.begin(), small_memory.end(), std::byte{0});
  first->synchronize();
  got = same_address->command(with_region({"DMA.GET", "re-hello-small"}, small_exposed->whole()));
  ASSERT_TRUE(got && got->type == REDIS_REPLY_ARRAY)
      << "the second connection lost its address when the first closed: " << error_of(got);
  first->synchronize();
  EXPECT_TRUE(small_memory == small);
  std::vector<std::byte> back(70000);
  auto read = restarted->get("re-hello-small", back);
  ASSERT_TRUE(read && read->has_value());
  EXPECT_TRUE(back == small);
  // Keep `first` and its memory until the abandoned GET is done with them.
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (info_field(writer, "in_flight") != 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(20ms);  // polling the server's counters
  }
  EXPECT_EQ(0, info_field(writer, "in_flight"));
}

TEST(ModuleLoad, a_bad_module_argument_fails_the_load_and_names_it) {
  // A typo in the module's arguments must stop the server at startup with the argument named,
  // not run with a silently different configuration.
  struct Case {
    std::vector<std::string> arguments;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {{"providers", "tcp", "bogus-option", "1"}, "bogus-option"},
      {{"providers", "tcp", "max-in-flight", "abc"}, "max-in-flight"},
      {{"providers", "tcp", "crc-threads", "-1"}, "crc-threads"},
      {{"providers", "tcp", "services-per-domain"}, "services-per-domain"},
      {{"providers", "no-such-provider", "bind", "127.0.0.1"}, "no-such-provider"},
  };
  for (const Case& bad : cases) {
    SCOPED_TRACE(bad.expect);
    std::string log;
    const int status = RedisServer::run_to_exit(bad.arguments, log);
    EXPECT_NE(0, status) << log;
    EXPECT_NE(-1, status) << "the server kept running:\n" << log;
    EXPECT_TRUE(contains(log, bad.expect)) << log;
  }
}

TEST(ModuleServices, several_services_share_the_load_and_a_custom_limit_holds) {
  // With services-per-domain 2 a hello must name both endpoints, transfers must spread over
  // them (balancing by outstanding work), and max-value-size must be the configured one.
  auto server = RedisServer::start({"services-per-domain", "2", "interfaces", "lo",
                                    "max-value-size", "100000"});
  ASSERT_TRUE(server);
  auto made = Client::connect("127.0.0.1", server->port(), loopback("tcp"));
  ASSERT_TRUE(made) << made.error().describe();
  auto& dma = *made;
  ASSERT_TRUE(dma->hello());
  ASSERT_EQ(2u, dma->server_addresses().size());
  EXPECT_NE(dma->server_addresses()[0], dma->server_addresses()[1]);
  for (int index = 0; index < 40; ++index) {
    const auto value = pattern(50000, static_cast<std::uint32_t>(index));
    ASSERT_TRUE(dma->set("spread-" + std::to_string(index), value));
    std::vector<std::byte> back(50000);
    auto got = dma->get("spread-" + std::to_string(index), back);
    ASSERT_TRUE(got && got->has_value());
    ASSERT_TRUE(back == value);
  }
  Connection connection(server->port());
  Reply described = connection.command({"DMA.INFO"});
  ASSERT_TRUE(described && described->type == REDIS_REPLY_ARRAY) << error_of(described);
  const redisReply* endpoints = described->element[15];
  ASSERT_EQ(2u, endpoints->elements);
  for (std::size_t index = 0; index < 2; ++index) {
    const redisReply* endpoint = endpoints->element[index];
    // Pairs: address, description, outstanding, submitted, ...
    ASSERT_EQ("submitted", std::string(endpoint->element[6]->str, endpoint->element[6]->len));
    EXPECT_GT(endpoint->element[7]->integer, 0) << "endpoint " << index << " carried nothing";
  }
  const auto too_big = pattern(100001, 1);
  Status refused = dma->set("too-big", too_big);
  ASSERT_FALSE(refused);
  EXPECT_TRUE(contains(refused.error().message(), "100000")) << refused.error().message();
  server->stop();
}


// ---- the HELLO proof, on every provider that runs here -------------------------------------

// One server per provider for the proof suite.
class ModuleProof : public ::testing::TestWithParam<std::string> {
 protected:
  static void TearDownTestSuite() {
    for (auto& [provider, server] : servers()) {
      server->stop();
      expect_clean_log(server->log());
    }
    servers().clear();
  }
  void SetUp() override {
    auto& server = servers()[GetParam()];
    if (!server) server = RedisServer::start({}, GetParam());
    ASSERT_TRUE(server) << "redis-server with the module on " << GetParam() << " did not start";
    port_ = server->port();
  }
  static std::map<std::string, std::unique_ptr<RedisServer>>& servers() {
    static std::map<std::string, std::unique_ptr<RedisServer>> all;
    return all;
  }
  std::unique_ptr<Target> open_target() {
    auto target = Target::open(loopback(GetParam()));
    EXPECT_TRUE(target) << target.error().describe();
    return target ? std::move(*target) : nullptr;
  }
  int port_ = 0;
};

TEST_P(ModuleProof, a_hello_advertising_another_targets_address_is_refused_and_its_memory_is_untouched) {
  // Without the proof a client could advertise a victim's address and have DMA.GET write into
  // the victim's memory. The server must refuse the session, never write a byte to the victim,
  // and refuse GET and SET on that connection.
  auto attacker = open_target();
  auto victim = open_target();
  ASSERT_TRUE(attacker && victim);
  std::vector<std::byte> victim_memory = pattern(4096, 81);
  const std::vector<std::byte> victim_before = victim_memory;
  auto victim_exposed = victim->expose(victim_memory.data(), victim_memory.size());
  ASSERT_TRUE(victim_exposed);
  Connection connection(port_);
  ASSERT_TRUE(connection.command({"SET", "lure", std::string(4096, 'L')}));
  auto hello = parse_hello(connection.command({"DMA.HELLO", hex_encode(victim->local_address())}));
  ASSERT_TRUE(hello) << hello.error().describe();
  // The attacker knows the nonce, and puts it in its own memory: that proves nothing about the
  // victim's address.
  std::vector<std::byte> attacker_memory(hello->nonce.size());
  std::memcpy(attacker_memory.data(), hello->nonce.data(), attacker_memory.size());
  auto attacker_exposed = attacker->expose(attacker_memory.data(), attacker_memory.size());
  ASSERT_TRUE(attacker_exposed);

  // Before any proof: no transfer at all.
  std::string error = error_of(connection.command(
      with_region({"DMA.GET", "lure"}, victim_exposed->whole())));
  EXPECT_TRUE(contains(error, "session not proven")) << error;
  error = error_of(connection.command(
      with_region({"DMA.SET", "lure", "4096"}, victim_exposed->whole())));
  EXPECT_TRUE(contains(error, "session not proven")) << error;

  // The proof names the victim's memory (which does not hold the nonce): refused.
  error = error_of(connection.command(
      with_region({"DMA.PROVE"}, victim_exposed->region(0, hello->nonce.size()))));
  EXPECT_TRUE(contains(error, "proof refused")) << error;
  error = error_of(connection.command(with_region({"DMA.GET", "lure"}, victim_exposed->whole())));
  EXPECT_TRUE(contains(error, "no session")) << error;
  error = error_of(connection.command(
      with_region({"DMA.SET", "lure", "4096"}, victim_exposed->whole())));
  EXPECT_TRUE(contains(error, "no session")) << error;

  victim->synchronize();
  EXPECT_TRUE(victim_memory == victim_before) << "the victim's memory changed";
  Reply lure = connection.command({"GET", "lure"});
  ASSERT_TRUE(lure && lure->type == REDIS_REPLY_STRING);
  EXPECT_EQ(std::string(4096, 'L'), std::string(lure->str, lure->len));

  // The victim itself still proves and transfers normally.
  Connection honest(port_);
  Status proven = hello_and_prove(honest, *victim);
  ASSERT_TRUE(proven) << proven.error().describe();
  Reply got = honest.command(with_region({"DMA.GET", "lure"}, victim_exposed->whole()));
  ASSERT_TRUE(got && got->type == REDIS_REPLY_ARRAY) << error_of(got);
}

TEST_P(ModuleProof, a_wrong_nonce_is_refused_and_the_connection_may_say_hello_again) {
  // A proof with one bit wrong must not open the session; after the refusal the same
  // connection must be able to start over with a new nonce and prove honestly.
  auto target = open_target();
  ASSERT_TRUE(target);
  Connection connection(port_);
  auto hello = parse_hello(connection.command({"DMA.HELLO", hex_encode(target->local_address())}));
  ASSERT_TRUE(hello) << hello.error().describe();
  for (const auto& address : hello->addresses) ASSERT_TRUE(target->add_initiator(address));
  std::vector<std::byte> proof(hello->nonce.size());
  std::memcpy(proof.data(), hello->nonce.data(), proof.size());
  proof.back() ^= std::byte{1};
  auto exposed = target->expose(proof.data(), proof.size());
  ASSERT_TRUE(exposed);
  target->synchronize();
  std::string error = error_of(connection.command(with_region({"DMA.PROVE"}, exposed->whole())));
  EXPECT_TRUE(contains(error, "proof refused")) << error;
  EXPECT_TRUE(contains(error, "not this session's nonce")) << error;
  error = error_of(connection.command({"DMA.GET", "k", "1", "0", "8"}));
  EXPECT_TRUE(contains(error, "no session")) << error;
  // The right bytes after the refusal are too late: that nonce is spent. (synchronize() before
  // touching exposed memory the server just read: rxm's progress thread sent from it.)
  target->synchronize();
  proof.back() ^= std::byte{1};
  target->synchronize();
  error = error_of(connection.command(with_region({"DMA.PROVE"}, exposed->whole())));
  EXPECT_TRUE(contains(error, "no session to prove")) << error;

  Status proven = hello_and_prove(connection, *target);
  ASSERT_TRUE(proven) << proven.error().describe();
  std::vector<std::byte> memory = pattern(5000, 82);
  auto value = target->expose(memory.data(), memory.size());
  ASSERT_TRUE(value);
  Reply stored = connection.command(
      with_region({"DMA.SET", "after-reproof", "5000", "CRC", std::to_string(crc32c(memory))},
                  value->whole()));
  ASSERT_TRUE(stored && stored->type == REDIS_REPLY_ARRAY) << error_of(stored);
}

TEST_P(ModuleProof, prove_without_hello_twice_or_of_the_wrong_length_is_refused) {
  // PROVE must only ever complete a pending hello: without one there is nothing to prove, a
  // proven session cannot be re-proven, and a read of the wrong length cannot be the nonce.
  auto target = open_target();
  ASSERT_TRUE(target);
  std::vector<std::byte> memory(64);
  auto exposed = target->expose(memory.data(), memory.size());
  ASSERT_TRUE(exposed);
  Connection fresh(port_);
  std::string error = error_of(fresh.command(with_region({"DMA.PROVE"}, exposed->region(0, 32))));
  EXPECT_TRUE(contains(error, "no session to prove")) << error;
  EXPECT_TRUE(contains(error_of(fresh.command({"DMA.PROVE", "1", "2"})), "wrong number of arguments"));

  Connection short_proof(port_);
  ASSERT_TRUE(parse_hello(short_proof.command({"DMA.HELLO", hex_encode(target->local_address())})));
  error = error_of(short_proof.command(with_region({"DMA.PROVE"}, exposed->region(0, 16))));
  EXPECT_TRUE(contains(error, "32 bytes, not 16")) << error;
  error = error_of(short_proof.command({"DMA.GET", "k", "1", "0", "8"}));
  EXPECT_TRUE(contains(error, "no session")) << error;

  Connection proven(port_);
  Status done = hello_and_prove(proven, *target);
  ASSERT_TRUE(done) << done.error().describe();
  error = error_of(proven.command(with_region({"DMA.PROVE"}, exposed->region(0, 32))));
  EXPECT_TRUE(contains(error, "already proven")) << error;
  // ... and that refusal does not end the proven session.
  ASSERT_TRUE(proven.command({"SET", "still-proven", "x"}));
  Reply got = proven.command(with_region({"DMA.GET", "still-proven"}, exposed->region(0, 8)));
  ASSERT_TRUE(got && got->type == REDIS_REPLY_ARRAY) << error_of(got);
}

TEST_P(ModuleProof, the_honest_client_proves_transparently_and_round_trips_values) {
  // dma::Client::hello() must do the whole exchange itself: callers see set/get work as before.
  auto made = Client::connect("127.0.0.1", port_, loopback(GetParam()));
  ASSERT_TRUE(made) << made.error().describe();
  Status said = (*made)->hello();
  ASSERT_TRUE(said) << said.error().describe();
  for (std::size_t size : {std::size_t{1}, std::size_t{4096}, std::size_t{3} << 20}) {
    const auto value = pattern(size, static_cast<std::uint32_t>(size));
    ASSERT_TRUE((*made)->set("honest-" + std::to_string(size), value));
    std::vector<std::byte> back(size);
    auto read = (*made)->get("honest-" + std::to_string(size), back);
    ASSERT_TRUE(read && read->has_value()) << (read ? "nil" : read.error().describe());
    EXPECT_TRUE(back == value);
  }
  Connection connection(port_);
  EXPECT_LE(1, info_field(connection, "sessions_proven"));
}

INSTANTIATE_TEST_SUITE_P(Providers, ModuleProof, ::testing::Values("tcp", "shm"),
                         [](const auto& param_info) { return param_info.param; });

// ---- teardown with transfers in flight -----------------------------------------------------

// Several clients, each with many large DMA.GETs and DMA.SETs queued, so the server has
// transfers in flight when it is told to stop. Waits (with a deadline) until it has.
class Flood {
 public:
  static constexpr int kClients = 3;
  static constexpr int kQueued = 6;
  static constexpr std::size_t kSize = std::size_t{16} << 20;

  explicit Flood(int port) : watcher_(port) {
    EXPECT_TRUE(watcher_.command({"SET", "flood", std::string(kSize, 'f')}));
    for (int index = 0; index < kClients; ++index) {
      auto target = Target::open(loopback("tcp"));
      if (!target) {
        ADD_FAILURE() << target.error().describe();
        return;
      }
      auto& client = clients_.emplace_back();
      client.target = std::move(*target);
      client.connection = std::make_unique<Connection>(port);
      Status proven = hello_and_prove(*client.connection, *client.target);
      EXPECT_TRUE(proven) << proven.error().describe();
      client.memory = pattern(kSize, static_cast<std::uint32_t>(index));
      auto exposed = client.target->expose(client.memory.data(), client.memory.size());
      if (!exposed) {
        ADD_FAILURE() << exposed.error().describe();
        return;
      }
      client.exposed.emplace(std::move(*exposed));
    }
    for (int round = 0; round < kQueued; ++round) {
      for (int index = 0; index < kClients; ++index) {
        auto& client = clients_[index];
        if (round % 2 == 0) {
          client.connection->send(with_region({"DMA.GET", "flood"}, client.exposed->whole()));
        } else {
          client.connection->send(with_region(
              {"DMA.SET", "flood-" + std::to_string(index), std::to_string(kSize)},
              client.exposed->whole()));
        }
      }
    }
  }
  // True once the server reports a transfer in flight (false at the deadline).
  bool in_flight() {
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    while (std::chrono::steady_clock::now() < deadline) {
      if (info_field(watcher_, "in_flight") > 0) return true;
      std::this_thread::yield();
    }
    return false;
  }
  Connection& watcher() { return watcher_; }

 private:
  struct Client {
    // Declaration order is teardown order reversed: the registration goes before the target.
    std::unique_ptr<Target> target;
    std::vector<std::byte> memory;
    std::optional<Exposed> exposed;
    std::unique_ptr<Connection> connection;
  };
  Connection watcher_;
  std::vector<Client> clients_;
};

TEST(ModuleTeardown, shutdown_nosave_with_transfers_in_flight_exits_cleanly) {
  // SHUTDOWN while clients are blocked in DMA.GET/SET must stop the fabric workers before the
  // process exits: a worker inside libfabric during exit-time destructors crashes the server
  // (or hangs it) instead of exiting 0.
  auto server = RedisServer::start();
  ASSERT_TRUE(server);
  Flood flood(server->port());
  ASSERT_TRUE(flood.in_flight()) << "no transfer was ever in flight";
  flood.watcher().send({"SHUTDOWN", "NOSAVE"});
  EXPECT_EQ(0, server->wait_for_exit(60s)) << server->log();
  const std::string log = server->log();
  expect_clean_log(log);
  EXPECT_TRUE(contains(log, "dma: fabric services stopped")) << log;
}

TEST(ModuleTeardown, sigterm_with_transfers_in_flight_exits_cleanly) {
  // SIGTERM (what service managers send) takes the same path as SHUTDOWN and must be as clean
  // (with IPATH_NO_BACKTRACE=1 in the server's environment, see sanitizer_environment).
  auto server = RedisServer::start();
  ASSERT_TRUE(server);
  Flood flood(server->port());
  ASSERT_TRUE(flood.in_flight()) << "no transfer was ever in flight";
  ASSERT_EQ(0, ::kill(server->pid(), SIGTERM));
  EXPECT_EQ(0, server->wait_for_exit(60s)) << server->log();
  const std::string log = server->log();
  expect_clean_log(log);
  EXPECT_TRUE(contains(log, "dma: fabric services stopped")) << log;
}

TEST(ModuleTeardown, module_unload_is_refused_while_sessions_are_open_and_an_idle_reload_serves) {
  // MODULE UNLOAD under open sessions would free the workers their transfers run on: it must be
  // refused with the module still serving. Once idle, unload and load again must give a module
  // that serves (libfabric re-initialised, no stale state).
  auto server = RedisServer::start({}, "tcp", {"--enable-module-command", "local"});
  ASSERT_TRUE(server);
  auto target = Target::open(loopback("tcp"));
  ASSERT_TRUE(target);
  std::vector<std::byte> memory(16);
  auto exposed = (*target)->expose(memory.data(), memory.size());
  ASSERT_TRUE(exposed);
  Connection admin(server->port());
  {
    Connection connection(server->port());
    ASSERT_TRUE(hello_and_prove(connection, **target));
    const std::string error = error_of(admin.command({"MODULE", "UNLOAD", "dma"}));
    EXPECT_TRUE(contains(error, "ERR")) << error;
    EXPECT_TRUE(contains(server->log(), "refusing to unload")) << server->log();
    ASSERT_TRUE(connection.command({"SET", "after-unload-refused", "kept"}));
    Reply got = connection.command(with_region({"DMA.GET", "after-unload-refused"}, exposed->whole()));
    ASSERT_TRUE(got && got->type == REDIS_REPLY_ARRAY) << error_of(got);
  }
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (info_field(admin, "sessions") != 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);  // the disconnect reaches the server asynchronously
  }
  ASSERT_EQ(0, info_field(admin, "sessions"));
  Reply unloaded = admin.command({"MODULE", "UNLOAD", "dma"});
  ASSERT_TRUE(unloaded && unloaded->type == REDIS_REPLY_STATUS) << error_of(unloaded);
  EXPECT_TRUE(contains(error_of(admin.command({"DMA.INFO"})), "unknown command"));
  Reply loaded = admin.command({"MODULE", "LOAD", module_path(), "providers", "tcp", "bind",
                                "127.0.0.1"});
  ASSERT_TRUE(loaded && loaded->type == REDIS_REPLY_STATUS) << error_of(loaded) << server->log();
  auto made = Client::connect("127.0.0.1", server->port(), loopback("tcp"));
  ASSERT_TRUE(made) << made.error().describe();
  ASSERT_TRUE((*made)->hello());
  const auto value = pattern(9000, 91);
  ASSERT_TRUE((*made)->set("after-reload", value));
  std::vector<std::byte> back(9000);
  auto read = (*made)->get("after-reload", back);
  ASSERT_TRUE(read && read->has_value());
  EXPECT_TRUE(back == value);
  made->reset();
  server->stop();
  expect_clean_log(server->log());
}

TEST(ModuleDeadline, a_dma_get_that_never_completes_is_answered_at_the_deadline_and_the_server_serves_on) {
  // If this fails, a client whose transfer the provider never completes (shm's bad
  // delivery-complete write; a peer that died after the post) stays blocked forever, or its
  // failure takes other clients down with it.
  auto server = RedisServer::start({"completion-deadline-ms", "300"}, "shm");
  ASSERT_TRUE(server);
  auto target = Target::open(loopback("shm"));
  ASSERT_TRUE(target) << target.error().describe();
  Connection connection(server->port());
  ASSERT_TRUE(connection.ok());
  Status proven = hello_and_prove(connection, **target);
  ASSERT_TRUE(proven) << proven.error().describe();
  const std::string value(4096, 'v');
  ASSERT_TRUE(connection.command({"SET", "stuck", value}));
  // 64 bytes exposed, 4096 claimed: shm never completes the overrun (PROVIDERS.md).
  std::vector<std::byte> memory(8192);
  auto exposed = (*target)->expose(memory.data(), 64);
  ASSERT_TRUE(exposed) << exposed.error().describe();
  Reply stuck = connection.command(with_region({"DMA.GET", "stuck"}, exposed->region(0, 4096)));
  ASSERT_TRUE(stuck) << "no reply: the client stayed blocked";
  ASSERT_EQ(REDIS_REPLY_ERROR, stuck->type) << "the stuck GET reported success";
  EXPECT_TRUE(contains(error_of(stuck), "completion deadline")) << error_of(stuck);

  // Another client, on the same server and provider, is served: its hello (a read) and its
  // DMA.SET (a read). Its DMA.GET would not be: shm completes an endpoint's delivery-complete
  // writes in order and the stuck one is never answered, so every later write on that endpoint
  // expires too (docs/RELIABILITY.md: on shm a wedged write costs that endpoint its writes until
  // the server restarts). On tcp and net the same wedge costs nothing (test_deadlines: HungPeer).
  auto other = Client::connect("127.0.0.1", server->port(), loopback("shm"));
  ASSERT_TRUE(other) << other.error().describe();
  ASSERT_TRUE((*other)->hello());
  std::vector<std::byte> stored(65536);
  for (std::size_t index = 0; index < stored.size(); ++index) stored[index] = std::byte(index * 7);
  ASSERT_TRUE((*other)->set("fine", stored));
  Reply fine = connection.command({"GET", "fine"});
  ASSERT_TRUE(fine && fine->type == REDIS_REPLY_STRING);
  EXPECT_EQ(0, std::memcmp(stored.data(), fine->str, stored.size()));
  Reply value_after = connection.command({"GET", "stuck"});
  ASSERT_TRUE(value_after && value_after->type == REDIS_REPLY_STRING);
  EXPECT_EQ(value, std::string(value_after->str, value_after->len)) << "a failed GET changed the key";
  other->reset();
  connection.close();
  server->stop();
  expect_clean_log(server->log());
}

TEST(ModuleCore, load_arguments_parse_into_the_configuration) {
  // The documented argument names must reach the configuration the services open with.
  const std::vector<std::string> arguments = {
      "providers", "tcp,shm", "interfaces", "lo", "services-per-domain", "2",
      "max-in-flight", "32", "progress-deadline-ms", "250", "completion-deadline-ms", "750",
      "max-value-size", "1024", "crc-threads", "3", "bind", "127.0.0.1"};
  auto options = module::parse_module_arguments(arguments);
  ASSERT_TRUE(options) << options.error().describe();
  EXPECT_EQ((std::vector<std::string>{"tcp", "shm"}), options->configuration.providers);
  EXPECT_EQ((std::vector<std::string>{"lo"}), options->configuration.interfaces);
  EXPECT_EQ(2u, options->services_per_domain);
  EXPECT_EQ(32u, options->configuration.max_in_flight);
  EXPECT_EQ(250, options->configuration.progress_deadline.count());
  EXPECT_EQ(750, options->configuration.completion_deadline.count());
  EXPECT_EQ(1024u, options->max_value_size);
  EXPECT_EQ(3u, options->configuration.crc_threads);
  EXPECT_EQ("127.0.0.1", options->configuration.bind.value());
  EXPECT_EQ(module::kDefaultMaxValueSize, module::parse_module_arguments({})->max_value_size);
}

TEST(ModuleCore, an_unknown_argument_is_named_without_letting_it_forge_a_log_line) {
  // If this fails, a module argument holding a newline writes a line of its own into the
  // server's log (the error is logged at load time).
  auto refused = module::parse_module_arguments(std::vector<std::string>{"bad\nFAKE LOG", "1"});
  ASSERT_FALSE(refused);
  EXPECT_EQ(std::string::npos, refused.error().message().find('\n')) << refused.error().message();
  EXPECT_NE(std::string::npos, refused.error().message().find("bad\\x0aFAKE LOG"))
      << refused.error().message();
}

TEST(ModuleCore, sessions_only_transfer_after_a_matching_proof_and_a_mismatch_ends_them) {
  // The state machine behind DMA.HELLO/PROVE: a session may transfer only after its own nonce
  // came back byte for byte; any other bytes end it; one proof per nonce.
  auto nonce = module::make_nonce();
  ASSERT_TRUE(nonce) << nonce.error().describe();
  auto other = module::make_nonce();
  ASSERT_TRUE(other);
  EXPECT_NE(*nonce, *other) << "two nonces from getrandom collided";
  module::Sessions sessions;
  ASSERT_TRUE(sessions.open(7, *nonce));
  EXPECT_FALSE(sessions.open(7, *other));
  EXPECT_TRUE(contains(sessions.check_proven(7).error().message(), "session not proven"));
  EXPECT_TRUE(contains(sessions.check_proven(8).error().message(), "no session"));
  EXPECT_FALSE(sessions.finish_proof(7, std::as_bytes(std::span(*nonce)))) << "not proving yet";

  ASSERT_TRUE(sessions.begin_proof(7));
  EXPECT_FALSE(sessions.begin_proof(7)) << "one proof at a time";
  auto wrong = *nonce;
  wrong[0] ^= 0x80;
  EXPECT_FALSE(sessions.finish_proof(7, std::as_bytes(std::span(wrong))));
  EXPECT_FALSE(sessions.contains(7)) << "a mismatch must end the session";

  ASSERT_TRUE(sessions.open(7, *other));
  ASSERT_TRUE(sessions.begin_proof(7));
  EXPECT_FALSE(sessions.finish_proof(7, std::as_bytes(std::span(*other)).first(16)))
      << "a prefix of the nonce is not the nonce";
  ASSERT_TRUE(sessions.open(7, *other));
  ASSERT_TRUE(sessions.begin_proof(7));
  ASSERT_TRUE(sessions.finish_proof(7, std::as_bytes(std::span(*other))));
  EXPECT_TRUE(sessions.check_proven(7));
  EXPECT_EQ(1u, sessions.proven());
  EXPECT_FALSE(sessions.begin_proof(7)) << "a proven session cannot be re-proven";
  EXPECT_TRUE(sessions.check_proven(7)) << "...and the refusal must not end it";
  EXPECT_TRUE(sessions.close(7));
  EXPECT_FALSE(sessions.close(7));
  EXPECT_EQ(0u, sessions.proven());
  EXPECT_EQ(0u, sessions.size());
}

}  // namespace
}  // namespace dma

