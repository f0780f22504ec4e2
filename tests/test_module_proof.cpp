// DMA.HELLO and DMA.PROVE: the hello hands out a fresh nonce and the server's addresses, and a
// session may transfer only once the server has read that nonce back from memory exposed on
// the advertised address. Real redis-servers with the module, on every provider that runs here
// (tcp, shm), attacked by hand over raw hiredis connections.
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <cstring>
#include <map>

#include "core.hpp"
#include "module_fixtures.hpp"

namespace dma::testing {
namespace {

TEST_F(Module, hello_replies_with_a_fresh_nonce_and_every_service_address_and_only_once) {
  // If this fails, a client cannot learn the server's addresses (efa-direct needs them to insert
  // its initiator), a nonce could be replayed across hellos, or a second hello on one connection
  // stacks a second session.
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

TEST_F(Module, a_hello_with_bad_hex_or_an_unusable_address_is_refused_naming_the_fault) {
  // If this fails, a malformed address is accepted at hello and fails (or is used) at the first
  // transfer, or its refusal does not say what is wrong with it.
  Connection connection(port());
  const struct {
    std::string address;
    std::string expect;
  } cases[] = {
      {"zz", "address has a non-hex character 'z' at offset 0"},
      {"abc", "address has an odd number of hex digits (3)"},
      {"", "address is empty"},
      // 16 bytes that are no sockaddr tcp can use: refused when the peer is inserted.
      {std::string(32, 'f'), "peer address is 16 bytes of address family 65535"},
  };
  for (const auto& bad : cases) {
    SCOPED_TRACE("DMA.HELLO '" + bad.address + "'");
    const std::string error = error_of(connection.command({"DMA.HELLO", bad.address}));
    EXPECT_TRUE(contains(error, "ERR invalid argument: " + bad.expect)) << error;
  }
  // The connection has no session after a refused hello.
  EXPECT_TRUE(contains(error_of(connection.command({"DMA.GET", "k", "1", "0", "8"})), "no session"));
}

// One server per provider for the proof suite.
class ModuleProof : public ::testing::TestWithParam<std::string> {
 protected:
  static void TearDownTestSuite() {
    for (auto& [provider, server] : servers()) {
      if (!server) continue;  // it never started; SetUp said so
      server->stop();
      expect_clean_log(server->log());
    }
    servers().clear();
  }
  void SetUp() override {
    auto& server = servers()[GetParam()];
    if (!server) server = start_server({}, GetParam());
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
  // If this fails, a client can advertise a victim's address and have DMA.GET write into the
  // victim's memory: the server must refuse the session, never write a byte to the victim, and
  // refuse GET and SET on that connection.
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
  // If this fails, a proof with one bit wrong opens the session, or after the refusal the same
  // connection cannot start over with a new nonce and prove honestly.
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
  // If this fails, PROVE completes something other than a pending hello: without one there is
  // nothing to prove, a proven session cannot be re-proven, and a read of the wrong length cannot
  // be the nonce.
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
  // If this fails, dma::Client::hello() no longer does the whole exchange itself, and callers' set
  // and get stop working as before.
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

}  // namespace
}  // namespace dma::testing
