// The module's teardown with transfers in flight: clients that vanish mid-transfer, a server
// told to stop (SHUTDOWN, SIGTERM, MODULE UNLOAD) while clients are blocked in DMA.GET/SET, and
// a transfer the provider never completes. Real redis-servers with the module, over loopback.
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>
#include <signal.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <thread>

#include "module_fixtures.hpp"

namespace dma::testing {
namespace {

TEST_F(Module, a_client_disconnecting_mid_transfer_leaves_the_server_serving) {
  // If this fails, a blocked client that vanishes crashes the server, leaks its session or strands
  // its transfer, and the next client is not served normally.
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
  expect_a_new_client_is_served("after-disconnect", 33);
}

TEST_F(Module, a_client_disconnecting_mid_set_never_leaves_a_partial_or_foreign_value) {
  // If this fails, a SET abandoned by its client (connection closed, target gone, while the read is
  // in flight) leaves the key holding a mix of old and new bytes, or the server stops serving.
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
    // DMA.GETPLAIN: the read may have landed before the target went (rxm's thread serves it on
    // its own), and then the key holds a stored value, which GET answers WRONGTYPE.
    Reply value = watcher.command({"DMA.GETPLAIN", "abandoned-set"});
    ASSERT_TRUE(value && value->type == REDIS_REPLY_STRING) << error_of(value);
    const std::string stored(value->str, value->len);
    EXPECT_TRUE(stored == as_string(old_value) || stored == as_string(new_value))
        << "the key holds " << stored.size() << " bytes that are neither the old nor the new value";
  }
  expect_a_new_client_is_served("after-abandoned-set", 63);
}

TEST_F(Module, re_advertising_on_new_connections_while_old_transfers_fly_serves_everyone) {
  // If this fails, a restarted client (new target, new address) or a second connection from the
  // same target is served wrongly while the old connection's transfers fly, or closing the old
  // connection pulls the shared address out from under the new one.
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
  // If this fails, SHUTDOWN while clients are blocked in DMA.GET/SET crashes or hangs the server
  // instead of exiting 0: a fabric worker is still inside libfabric during exit-time destructors.
  auto server = start_server();
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
  // If this fails, SIGTERM (what service managers send) with transfers in flight does not take
  // SHUTDOWN's clean path (with IPATH_NO_BACKTRACE=1 in the server's environment,
  // support/redis_server.hpp).
  auto server = start_server();
  ASSERT_TRUE(server);
  Flood flood(server->port());
  ASSERT_TRUE(flood.in_flight()) << "no transfer was ever in flight";
  ASSERT_EQ(0, ::kill(server->pid(), SIGTERM));
  EXPECT_EQ(0, server->wait_for_exit(60s)) << server->log();
  const std::string log = server->log();
  expect_clean_log(log);
  EXPECT_TRUE(contains(log, "dma: fabric services stopped")) << log;
}

TEST(ModuleTeardown, module_unload_is_refused_while_values_live_in_its_arena_and_the_server_serves_on) {
  // If this fails, MODULE UNLOAD frees the arena that stored values (dma-value keys) live in and
  // the workers their transfers run on, or its refusal leaves the module unable to serve.
  // Redis refuses to unload any module that exports a data type, before asking the module.
  auto server = start_server({}, "tcp", {"--enable-module-command", "local"});
  ASSERT_TRUE(server);
  Connection admin(server->port());
  Reply stored = admin.command({"DMA.SETPLAIN", "before-unload", "kept"});
  ASSERT_TRUE(stored && stored->type == REDIS_REPLY_ARRAY) << error_of(stored);
  const std::string error = error_of(admin.command({"MODULE", "UNLOAD", "dma"}));
  EXPECT_TRUE(contains(error, "data types")) << error;
  Reply kept = admin.command({"DMA.GETPLAIN", "before-unload"});
  ASSERT_TRUE(kept && kept->type == REDIS_REPLY_STRING) << error_of(kept);
  EXPECT_EQ("kept", std::string(kept->str, kept->len));
  auto made = Client::connect("127.0.0.1", server->port(), loopback("tcp"));
  ASSERT_TRUE(made) << made.error().describe();
  ASSERT_TRUE((*made)->hello());
  const auto value = pattern(9000, 91);
  ASSERT_TRUE((*made)->set("after-unload-refused", value));
  std::vector<std::byte> back(9000);
  auto read = (*made)->get("after-unload-refused", back);
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
  auto server = start_server({"completion-deadline-ms", "300"}, "shm");
  ASSERT_TRUE(server);
  auto target = Target::open(loopback("shm"));
  ASSERT_TRUE(target) << target.error().describe();
  Connection connection(server->port());
  ASSERT_TRUE(connection.ok());
  Status proven = hello_and_prove(connection, **target);
  ASSERT_TRUE(proven) << proven.error().describe();
  const std::string value(4096, 'v');
  ASSERT_TRUE(connection.command({"SET", "stuck", value}));
  // 64 bytes exposed, 4096 claimed: shm never completes the overrun (docs/PROVIDERS.md, "shm").
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
  Reply fine = connection.command({"DMA.GETPLAIN", "fine"});
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

}  // namespace
}  // namespace dma::testing
