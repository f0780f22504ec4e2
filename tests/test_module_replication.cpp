// DMA writes reach replicas and the AOF (issue 12): every DMA.SET and DMA.SETPLAIN is replicated
// as DMA.SETPLAIN carrying the bytes and their CRC, so a replica holds them byte for byte (live,
// after a full resync, after a partial one) and serves DMA.GET, a failover keeps them, an AOF
// (with and without the RDB preamble) replays them after a restart, and a fork (BGSAVE, AOF
// rewrite) while a DMA.SET is in flight writes the right bytes while the parent's transfers go
// on unaffected. Real redis-servers with the module on loopback, each in its own directory.
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "module_fixtures.hpp"

namespace dma::testing {
namespace {

using Values = std::map<std::string, std::vector<std::byte>>;

// Full resyncs start at once (the default waits 5 s for more replicas to share the transfer).
const std::vector<std::string> kReplication = {"--repl-diskless-sync-delay", "0"};

std::vector<std::string> plus(std::vector<std::string> left, const std::vector<std::string>& right) {
  left.insert(left.end(), right.begin(), right.end());
  return left;
}

std::unique_ptr<RedisServer> start_node(const std::string& directory,
                                        const std::vector<std::string>& server_arguments,
                                        const std::vector<std::string>& module_arguments = {}) {
  RedisServer::Options options = server_options(module_arguments, "tcp", server_arguments);
  options.directory = directory;
  auto server = RedisServer::start(options);
  if (!server) {
    ADD_FAILURE() << "redis-server did not start: " << server.error().describe();
    return nullptr;
  }
  return std::move(*server);
}

std::vector<std::string> replica_of(const RedisServer& master) {
  return {"--replicaof", "127.0.0.1", std::to_string(master.port())};
}

std::unique_ptr<Client> hello_client(int port) {
  auto made = Client::connect("127.0.0.1", port, loopback("tcp"));
  EXPECT_TRUE(made) << made.error().describe();
  if (!made) return nullptr;
  Status said = (*made)->hello();
  EXPECT_TRUE(said) << said.error().describe();
  return said ? std::move(*made) : nullptr;
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

bool link_up(Connection& replica) {
  return replica.info_text("replication", "master_link_status") == "up";
}

// Waits until the replica's link is up and it has applied everything the master had sent by
// then (offsets count from the master's first replica, so the link comes first).
bool caught_up(Connection& master, Connection& replica) {
  if (!eventually([&] { return link_up(replica); })) return false;
  const long long offset = master.info_number("replication", "master_repl_offset");
  return eventually([&] {
    return link_up(replica) && replica.info_number("replication", "slave_repl_offset") >= offset;
  });
}

// Every key of `values` holds exactly its bytes, as a dma-value.
void expect_holds(int port, const Values& values, const std::string& where) {
  SCOPED_TRACE(where);
  Connection connection(port);
  ASSERT_TRUE(connection.ok());
  for (const auto& [key, value] : values) {
    Reply got = connection.command({"DMA.GETPLAIN", key});
    ASSERT_TRUE(got && got->type == REDIS_REPLY_STRING) << key << ": " << error_of(got);
    EXPECT_TRUE(std::string(got->str, got->len) == as_string(value))
        << key << ": " << got->len << " bytes, expected " << value.size();
    Reply typed = connection.command({"TYPE", key});
    EXPECT_EQ("dma-value", std::string(typed->str, typed->len)) << key;
  }
}

void stop_cleanly(std::unique_ptr<RedisServer>& server) {
  if (!server) return;
  server->stop();
  expect_clean_log(server->log());
  server.reset();
}

TEST(ModuleReplication, a_replica_receives_every_dma_write_byte_for_byte_and_serves_dma_get) {
  // If this fails, a failover loses values DMA.SET stored (they never reached the replica), a
  // replica holds other bytes or another TTL, or it cannot serve DMA.GET of what it received.
  ScratchDirectory directory("replica-live");
  auto master = start_node(directory.path("master"), kReplication);
  ASSERT_TRUE(master);
  auto replica = start_node(directory.path("replica"), plus(replica_of(*master), kReplication));
  ASSERT_TRUE(replica);
  Connection master_admin(master->port());
  Connection replica_admin(replica->port());
  ASSERT_TRUE(eventually([&] { return link_up(replica_admin); }));

  auto dma = hello_client(master->port());
  ASSERT_TRUE(dma);
  Values values;
  for (std::size_t size : {std::size_t{0}, std::size_t{1}, std::size_t{4096}, std::size_t{1} << 20,
                           std::size_t{16} << 20}) {
    const std::string key = "live-" + std::to_string(size);
    values[key] = pattern(size, static_cast<std::uint32_t>(size) + 1);
    ASSERT_TRUE(dma->set(key, values[key]));
  }
  values["live-4096"] = pattern(4096, 77);  // an overwrite replaces the replica's copy too
  ASSERT_TRUE(dma->set("live-4096", values["live-4096"]));
  values["plain"] = pattern(300, 3);
  ASSERT_EQ(2u, length_and_crc(master_admin.command(
                                   {"DMA.SETPLAIN", "plain", as_string(values["plain"]), "EX", "1000"}))
                    .size());
  ASSERT_TRUE(dma->set("deleted", pattern(10, 1)));
  master_admin.command({"DEL", "deleted"});
  ASSERT_TRUE(caught_up(master_admin, replica_admin));

  expect_holds(replica->port(), values, "on the replica");
  EXPECT_EQ(0, integer_of(replica_admin.command({"EXISTS", "deleted"})));
  const long long ttl = integer_of(replica_admin.command({"TTL", "plain"}));
  EXPECT_TRUE(ttl > 900 && ttl <= 1000) << "the TTL did not reach the replica: " << ttl;
  EXPECT_EQ(-1, integer_of(replica_admin.command({"TTL", "live-1"})));
  EXPECT_GE(info_field(master_admin, "writes_replicated"), 8);

  // A replica serves DMA.GET (readonly) of what it received, and refuses writes.
  auto reader = hello_client(replica->port());
  ASSERT_TRUE(reader);
  std::vector<std::byte> back(std::size_t{16} << 20);
  auto read = reader->get("live-16777216", back);
  ASSERT_TRUE(read && read->has_value()) << (read ? "nil" : read.error().describe());
  EXPECT_TRUE(back == values["live-16777216"]);
  Status refused = reader->set("live-1", pattern(8, 8));
  ASSERT_FALSE(refused);
  EXPECT_TRUE(contains(refused.error().message(), "READONLY")) << refused.error().message();
  EXPECT_TRUE(contains(error_of(replica_admin.command({"DMA.SETPLAIN", "live-1", "x"})), "READONLY"));

  reader.reset();
  dma.reset();
  stop_cleanly(replica);
  stop_cleanly(master);
}

TEST(ModuleReplication, a_replica_gets_earlier_writes_by_full_resync_and_writes_during_a_broken_link_by_partial_resync) {
  // If this fails, a replica started (or restarted) after the writes misses them (the RDB sent
  // in the full resync lacks module values), or one whose link broke misses what was written
  // meanwhile (the replication backlog lacks them).
  ScratchDirectory directory("replica-resync");
  auto master = start_node(directory.path("master"), kReplication);
  ASSERT_TRUE(master);
  auto dma = hello_client(master->port());
  ASSERT_TRUE(dma);
  Values values;
  for (int index = 0; index < 8; ++index) {
    const std::string key = "early-" + std::to_string(index);
    values[key] = pattern(std::size_t{1} << (10 + 2 * index % 15), 10 + index);
    ASSERT_TRUE(dma->set(key, values[key]));
  }
  values["early-big"] = pattern(std::size_t{16} << 20, 9);
  ASSERT_TRUE(dma->set("early-big", values["early-big"]));

  auto replica = start_node(directory.path("replica"), plus(replica_of(*master), kReplication));
  ASSERT_TRUE(replica);
  Connection master_admin(master->port());
  Connection replica_admin(replica->port());
  ASSERT_TRUE(caught_up(master_admin, replica_admin));
  expect_holds(replica->port(), values, "after the full resync");
  EXPECT_EQ(1, master_admin.info_number("stats", "sync_full"));

  // The replica drops its link; writes go on until it has resynced partially.
  Reply killed = replica_admin.command({"CLIENT", "KILL", "TYPE", "master"});
  ASSERT_EQ(1, integer_of(killed)) << error_of(killed);
  int written = 0;
  ASSERT_TRUE(eventually([&] {
    const std::string key = "during-" + std::to_string(written);
    values[key] = pattern(65536, 1000 + written);
    EXPECT_TRUE(dma->set(key, values[key]));
    ++written;
    return master_admin.info_number("stats", "sync_partial_ok") >= 1;
  })) << "no partial resync";
  for (int more = 0; more < 3; ++more) {
    values["after-" + std::to_string(more)] = pattern(4096, 2000 + more);
    ASSERT_TRUE(dma->set("after-" + std::to_string(more), values["after-" + std::to_string(more)]));
  }
  ASSERT_TRUE(caught_up(master_admin, replica_admin));
  expect_holds(replica->port(), values, "after the partial resync");
  EXPECT_EQ(1, master_admin.info_number("stats", "sync_full")) << "the reconnect resynced in full";

  dma.reset();
  stop_cleanly(replica);
  stop_cleanly(master);
}

TEST(ModuleReplication, a_failover_keeps_every_value_and_the_promoted_replica_takes_dma_sets) {
  // If this fails, promoting a replica (REPLICAOF NO ONE, what a failover does) loses DMA values
  // or leaves the new master unable to store new ones.
  ScratchDirectory directory("replica-failover");
  auto master = start_node(directory.path("master"), kReplication);
  ASSERT_TRUE(master);
  auto replica = start_node(directory.path("replica"), plus(replica_of(*master), kReplication));
  ASSERT_TRUE(replica);
  Connection master_admin(master->port());
  Connection replica_admin(replica->port());
  ASSERT_TRUE(eventually([&] { return link_up(replica_admin); }));
  auto dma = hello_client(master->port());
  ASSERT_TRUE(dma);
  Values values;
  for (int index = 0; index < 6; ++index) {
    const std::string key = "kept-" + std::to_string(index);
    values[key] = pattern(std::size_t{100000} * (index + 1), 30 + index);
    ASSERT_TRUE(dma->set(key, values[key]));
  }
  ASSERT_TRUE(caught_up(master_admin, replica_admin));
  dma.reset();
  stop_cleanly(master);

  Reply promoted = replica_admin.command({"REPLICAOF", "NO", "ONE"});
  ASSERT_TRUE(promoted && promoted->type == REDIS_REPLY_STATUS) << error_of(promoted);
  ASSERT_TRUE(eventually([&] { return replica_admin.info_text("replication", "role") == "master"; }));
  expect_holds(replica->port(), values, "on the promoted replica");
  auto writer = hello_client(replica->port());
  ASSERT_TRUE(writer);
  values["new"] = pattern(1 << 20, 99);
  ASSERT_TRUE(writer->set("new", values["new"]));
  expect_holds(replica->port(), values, "after a write on the new master");
  writer.reset();
  stop_cleanly(replica);
}

// ---- persistence: the AOF and fork --------------------------------------------------------

class ModuleAof : public ::testing::TestWithParam<std::string> {};

TEST_P(ModuleAof, every_dma_write_is_replayed_after_a_restart_around_a_rewrite) {
  // If this fails, a server persisting with appendonly loses DMA values at restart: the writes
  // since the last rewrite never reached the AOF, or the rewrite's base (RDB preamble or
  // DMA.SETPLAIN commands) lost or changed them.
  ScratchDirectory directory("aof-" + GetParam());
  const std::vector<std::string> arguments = {"--appendonly", "yes", "--aof-use-rdb-preamble",
                                              GetParam()};
  Values values;
  {
    auto server = start_node(directory.path(), arguments);
    ASSERT_TRUE(server);
    Connection admin(server->port());
    auto dma = hello_client(server->port());
    ASSERT_TRUE(dma);
    for (std::size_t size : {std::size_t{0}, std::size_t{4096}, std::size_t{1} << 20,
                             std::size_t{16} << 20}) {
      const std::string key = "before-" + std::to_string(size);
      values[key] = pattern(size, static_cast<std::uint32_t>(size) + 2);
      ASSERT_TRUE(dma->set(key, values[key]));
    }
    ASSERT_TRUE(dma->set("deleted", pattern(100, 1)));
    Reply rewrite = admin.command({"BGREWRITEAOF"});
    ASSERT_TRUE(rewrite && rewrite->type == REDIS_REPLY_STATUS) << error_of(rewrite);
    ASSERT_TRUE(eventually([&] {
      return admin.info_number("persistence", "aof_rewrite_in_progress") == 0 &&
             admin.info_number("persistence", "aof_rewrite_scheduled") == 0 &&
             admin.info_number("persistence", "aof_rewrites") >= 1;
    }));
    EXPECT_EQ("ok", admin.info_text("persistence", "aof_last_bgrewrite_status"));
    // After the rewrite: overwrites, a new key, a TTL, a DEL, all in the incremental AOF.
    values["before-4096"] = pattern(4096, 44);
    ASSERT_TRUE(dma->set("before-4096", values["before-4096"]));
    values["after"] = pattern(1 << 20, 45);
    ASSERT_TRUE(dma->set("after", values["after"]));
    values["with-ttl"] = pattern(500, 46);
    ASSERT_EQ(2u, length_and_crc(admin.command({"DMA.SETPLAIN", "with-ttl",
                                                as_string(values["with-ttl"]), "PX", "1000000"}))
                      .size());
    admin.command({"DEL", "deleted"});
    dma.reset();
    stop_cleanly(server);
  }
  // The overwrite of before-4096 came inline (DMA.SETPLAIN with its CRC, handed on as sent) and
  // is in the incremental AOF in the documented form, CRC included (module/write.hpp).
  const std::string bytes = as_string(values["before-4096"]);
  const std::string crc = std::to_string(crc32c(values["before-4096"]));
  const std::string logged = "*5\r\n$12\r\nDMA.SETPLAIN\r\n$11\r\nbefore-4096\r\n$4096\r\n" +
                             bytes + "\r\n$3\r\nCRC\r\n$" + std::to_string(crc.size()) + "\r\n" +
                             crc + "\r\n";
  std::string incremental;
  for (const auto& entry :
       std::filesystem::directory_iterator(directory.path() + "/appendonlydir")) {
    if (entry.path().string().ends_with(".incr.aof")) incremental += read_file(entry.path());
  }
  EXPECT_NE(std::string::npos, incremental.find(logged))
      << "the inline overwrite is not in the incremental AOF as DMA.SETPLAIN <key> <bytes> CRC "
         "<crc32c> (" << incremental.size() << " bytes of incremental AOF)";
  auto server = start_node(directory.path(), arguments);
  ASSERT_TRUE(server);
  expect_holds(server->port(), values, "after the restart");
  Connection admin(server->port());
  EXPECT_EQ(static_cast<long long>(values.size()), integer_of(admin.command({"DBSIZE"})));
  const long long ttl = integer_of(admin.command({"PTTL", "with-ttl"}));
  EXPECT_TRUE(ttl > 0 && ttl <= 1000000) << ttl;
  EXPECT_EQ(-1, integer_of(admin.command({"PTTL", "after"})));
  stop_cleanly(server);
}

INSTANTIATE_TEST_SUITE_P(Preamble, ModuleAof, ::testing::Values("yes", "no"),
                         [](const auto& param_info) { return "rdb_preamble_" + param_info.param; });

// A fork (BGSAVE or BGREWRITEAOF, which fork before they reply) while a held client's 16 MiB
// DMA.SET is in flight. Whether it was is read from dma_in_flight before and after: nothing else
// submits a transfer meanwhile, and the count drops (on the worker) before the read's reply is
// handled, so a count still up after the fork means the read was in flight across it. (Inside
// MULTI, Redis 7.0 only schedules these commands, so they cannot be paired with an INFO there.)
struct Forked {
  bool in_flight = false;
  bool started = false;
};
Forked fork_during_a_read(Connection& admin, const std::string& fork_command) {
  Forked forked;
  const bool before = info_field(admin, "in_flight") > 0;
  Reply started = admin.command({fork_command});
  forked.started = started && started->type == REDIS_REPLY_STATUS &&
                   !contains(std::string(started->str, started->len), "scheduled");
  EXPECT_TRUE(forked.started) << fork_command << ": " << error_of(started);
  const long long after = info_field(admin, "in_flight");
  forked.in_flight = before && after > 0;
  return forked;
}

// Seeds `count` keys, forks with `fork_command` while a 16 MiB DMA.SET of "in-flight" is being
// read, runs DMA.SET/DMA.GET traffic while the child lives (each checked), and returns the values
// as they were at the fork (`at_fork`) and as last set (`last`).
void traffic_across_a_fork(int port, const std::string& fork_command,
                           const std::string& in_progress_field, Values& at_fork, Values& last) {
  Connection admin(port);
  auto dma = hello_client(port);
  ASSERT_TRUE(dma);
  for (int index = 0; index < 48; ++index) {
    const std::string key = "seeded-" + std::to_string(index);
    at_fork[key] = pattern(65536 + index, 300 + index);
    ASSERT_TRUE(dma->set(key, at_fork[key]));
  }
  at_fork["in-flight"] = pattern(4096, 1);
  ASSERT_TRUE(dma->set("in-flight", at_fork["in-flight"]));
  last = at_fork;

  const std::size_t size = std::size_t{16} << 20;
  const std::vector<std::byte> incoming = pattern(size, 2);
  auto held = child_session(port, size, 2);
  ASSERT_TRUE(held.connection);
  ASSERT_TRUE(eventually([&] {
    return admin.info_number("persistence", in_progress_field) == 0 &&
           admin.info_number("persistence", "aof_rewrite_scheduled") == 0;
  }));
  // Its target stopped, the read stays in flight across the fork and the traffic after it.
  const long long transfers = info_field(admin, "transfers");
  ASSERT_NO_FATAL_FAILURE(held.target->freeze());
  held.connection->send(
      dma_set("in-flight", size, {"CRC", std::to_string(crc32c(incoming))}, held.region(0, size)));
  ASSERT_TRUE(eventually([&] { return info_field(admin, "transfers") > transfers; }));
  const Forked forked = fork_during_a_read(admin, fork_command);
  ASSERT_TRUE(forked.started);
  EXPECT_TRUE(forked.in_flight) << "the read ended with its target stopped";
  // Traffic while the child lives: every reply and every byte read back is checked.
  int during = 0;
  std::vector<std::byte> back(65536 + 48);
  for (int round = 0; admin.info_number("persistence", in_progress_field) == 1; ++round) {
    const std::string key = "seeded-" + std::to_string(round % 48);
    last[key] = pattern(65536 + round % 48, 5000 + round);
    ASSERT_TRUE(dma->set(key, last[key]));
    auto read = dma->get(key, back);
    ASSERT_TRUE(read && read->has_value()) << key;
    ASSERT_TRUE(std::equal(last[key].begin(), last[key].end(), back.begin())) << key;
    ++during;
  }
  // The read held across the fork (and the traffic) now completes.
  ASSERT_NO_FATAL_FAILURE(held.target->thaw());
  Reply stored = held.connection->receive();
  EXPECT_EQ((std::vector<std::string>{std::to_string(size), std::to_string(crc32c(incoming))}),
            length_and_crc(stored))
      << "the DMA.SET in flight at the fork failed";
  last["in-flight"] = incoming;
  std::vector<std::byte> whole(size);
  auto read = dma->get("in-flight", whole);
  ASSERT_TRUE(read && read->has_value());
  EXPECT_TRUE(whole == incoming) << "the parent's transfer was damaged by the fork";
  EXPECT_GT(during, 0) << "no DMA traffic ran while the child lived";
}

TEST(ModuleFork, a_bgsave_while_a_dma_set_is_in_flight_writes_the_values_at_the_fork_and_the_transfers_go_on) {
  // If this fails, a BGSAVE child writes bytes other than those stored at the fork (a block
  // freed or reused under it, a DMA.SET landing in its copy), or the fork disturbs the parent's
  // transfers in flight (their replies or bytes are wrong).
  ScratchDirectory directory("fork-bgsave");
  // 10 ms per key in the child: the save lasts about half a second, so traffic overlaps it.
  const std::vector<std::string> arguments = {"--rdb-key-save-delay", "10000"};
  Values at_fork;
  Values last;
  {
    auto server = start_node(directory.path(), arguments);
    ASSERT_TRUE(server);
    ASSERT_NO_FATAL_FAILURE(
        traffic_across_a_fork(server->port(), "BGSAVE", "rdb_bgsave_in_progress", at_fork, last));
    Connection admin(server->port());
    ASSERT_TRUE(eventually(
        [&] { return admin.info_number("persistence", "rdb_bgsave_in_progress") == 0; }));
    EXPECT_EQ("ok", admin.info_text("persistence", "rdb_last_bgsave_status"));
    expect_holds(server->port(), last, "in the parent, as last set");
    stop_cleanly(server);  // SHUTDOWN NOSAVE: the RDB on disk is the BGSAVE's
  }
  auto server = start_node(directory.path(), {});
  ASSERT_TRUE(server);
  expect_holds(server->port(), at_fork, "restarted from the BGSAVE's RDB");
  stop_cleanly(server);
}

TEST(ModuleFork, an_aof_rewrite_during_dma_traffic_with_a_dma_set_in_flight_loses_nothing) {
  // If this fails, values written while an AOF rewrite child runs (or the DMA.SET whose read
  // straddles the fork) are missing or different after a restart: the rewrite's base and the
  // incremental AOF do not add up to the dataset.
  ScratchDirectory directory("fork-aof");
  const std::vector<std::string> arguments = {"--appendonly", "yes", "--rdb-key-save-delay", "10000"};
  Values at_fork;
  Values last;
  {
    auto server = start_node(directory.path(), arguments);
    ASSERT_TRUE(server);
    ASSERT_NO_FATAL_FAILURE(traffic_across_a_fork(server->port(), "BGREWRITEAOF",
                                                  "aof_rewrite_in_progress", at_fork, last));
    Connection admin(server->port());
    ASSERT_TRUE(eventually([&] {
      return admin.info_number("persistence", "aof_rewrite_in_progress") == 0 &&
             admin.info_number("persistence", "aof_rewrite_scheduled") == 0;
    }));
    EXPECT_EQ("ok", admin.info_text("persistence", "aof_last_bgrewrite_status"));
    stop_cleanly(server);
  }
  auto server = start_node(directory.path(), arguments);
  ASSERT_TRUE(server);
  expect_holds(server->port(), last, "restarted from the rewritten AOF");
  stop_cleanly(server);
}

}  // namespace
}  // namespace dma::testing
