// The module in a Redis Cluster (issue 12): its commands declare their key, so every node
// serves the slots it owns and answers -MOVED for the others; dma::Client follows -MOVED and
// -ASK with one proven session per node; a slot migrated with MIGRATE (DUMP/RESTORE through the
// data type's RDB callbacks) under DMA traffic keeps every value; a DMA.SET whose key migrates
// while its read is in flight answers TRYAGAIN and changes nothing. One three-master cluster on
// loopback (support::RedisCluster) for the suite; each test moves slots of its own hash tag.
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <map>
#include <string>
#include <vector>

#include "module_fixtures.hpp"
#include "support/redis_cluster.hpp"

namespace dma::testing {
namespace {

using support::RedisCluster;

TEST(ClusterRouting, key_slots_and_redirections_parse_as_the_cluster_specification_says) {
  // If this fails, dma::Client sends a key's command to a node that does not serve it (a
  // redirection for every command, or a loop), or misreads where -MOVED/-ASK point.
  EXPECT_EQ(12739, redis::key_slot("123456789")) << "CRC16/XMODEM's check value";
  EXPECT_EQ(12182, redis::key_slot("foo"));
  EXPECT_EQ(redis::key_slot("user1000"), redis::key_slot("{user1000}.following"));
  EXPECT_EQ(redis::key_slot("user1000"), redis::key_slot("x{user1000}{other}"));
  EXPECT_EQ(redis::key_slot("{}user1000"), redis::key_slot(std::string_view("{}user1000")));
  EXPECT_NE(redis::key_slot("user1000"), redis::key_slot("{}user1000")) << "an empty tag is no tag";
  EXPECT_EQ(redis::key_slot("a{"), redis::key_slot(std::string_view("a{")));

  auto moved = redis::parse_redirection("MOVED 3999 127.0.0.1:6381");
  ASSERT_TRUE(moved);
  EXPECT_FALSE(moved->ask);
  EXPECT_EQ(3999, moved->slot);
  EXPECT_EQ("127.0.0.1", moved->host);
  EXPECT_EQ(6381, moved->port);
  auto ask = redis::parse_redirection("ASK 1 ::1:7000");
  ASSERT_TRUE(ask);
  EXPECT_TRUE(ask->ask);
  EXPECT_EQ("::1", ask->host);
  EXPECT_EQ(7000, ask->port);
  for (const char* other : {"ERR wrong", "MOVED", "MOVED 16384 h:1", "MOVED 1 h:0", "MOVED x h:1",
                            "ASK 1 nohost", "MOVED 1 h:70000", "TRYAGAIN later"}) {
    EXPECT_FALSE(redis::parse_redirection(other)) << other;
  }
}

class ModuleCluster : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    directory_ = std::make_unique<ScratchDirectory>("cluster");
    RedisCluster::Options options;
    options.node = server_options();
    options.directory = directory_->path();
    auto started = RedisCluster::start(options);
    if (!started) {
      ADD_FAILURE() << "the cluster did not start: " << started.error().describe();
      return;
    }
    cluster_ = std::move(*started);
  }
  static void TearDownTestSuite() {
    if (cluster_) {
      for (std::size_t index = 0; index < cluster_->size(); ++index) {
        cluster_->node(index).stop();
        expect_clean_log(cluster_->node(index).log());
      }
    }
    cluster_.reset();
    directory_.reset();
  }
  void SetUp() override { ASSERT_TRUE(cluster_) << "the cluster did not start"; }

  static RedisServer& node(std::size_t index) { return cluster_->node(index); }
  static std::string address(std::size_t index) {
    return "127.0.0.1:" + std::to_string(node(index).port());
  }
  // Keys of the form <prefix><n> whose slots node `index` was given at start, `count` of them.
  static std::vector<std::string> keys_of(std::size_t index, std::size_t count,
                                          const std::string& prefix) {
    std::vector<std::string> keys;
    for (int n = 0; keys.size() < count; ++n) {
      const std::string key = prefix + std::to_string(n);
      if (cluster_->owner_at_start(redis::key_slot(key)) == index) keys.push_back(key);
    }
    return keys;
  }
  // Moves `slot` from node `from` to node `to` as redis-cli --cluster reshard does: IMPORTING on
  // the target, MIGRATING on the source, MIGRATE of its keys, then the new owner everywhere.
  static void begin_migration(int slot, std::size_t from, std::size_t to) {
    Connection source(node(from).port());
    Connection target(node(to).port());
    const std::string number = std::to_string(slot);
    Reply importing = target.command({"CLUSTER", "SETSLOT", number, "IMPORTING", cluster_->node_id(from)});
    ASSERT_TRUE(importing && importing->type == REDIS_REPLY_STATUS) << error_of(importing);
    Reply migrating = source.command({"CLUSTER", "SETSLOT", number, "MIGRATING", cluster_->node_id(to)});
    ASSERT_TRUE(migrating && migrating->type == REDIS_REPLY_STATUS) << error_of(migrating);
  }
  static void migrate_keys(std::size_t from, std::size_t to, const std::vector<std::string>& keys) {
    Connection source(node(from).port());
    std::vector<std::string> command = {"MIGRATE", "127.0.0.1", std::to_string(node(to).port()),
                                        "", "0", "10000", "KEYS"};
    command.insert(command.end(), keys.begin(), keys.end());
    Reply migrated = source.command(command);
    ASSERT_TRUE(migrated && migrated->type == REDIS_REPLY_STATUS) << error_of(migrated);
  }
  static void finish_migration(int slot, std::size_t to) {
    for (std::size_t index = 0; index < cluster_->size(); ++index) {
      Connection connection(node(index).port());
      Reply owned = connection.command(
          {"CLUSTER", "SETSLOT", std::to_string(slot), "NODE", cluster_->node_id(to)});
      ASSERT_TRUE(owned && owned->type == REDIS_REPLY_STATUS) << index << ": " << error_of(owned);
    }
  }
  static std::unique_ptr<Client> cluster_client(std::size_t first = 0) {
    auto made = Client::connect("127.0.0.1", node(first).port(), loopback("tcp"));
    EXPECT_TRUE(made) << made.error().describe();
    if (!made) return nullptr;
    Status said = (*made)->hello();
    EXPECT_TRUE(said) << said.error().describe();
    return said ? std::move(*made) : nullptr;
  }

  inline static std::unique_ptr<ScratchDirectory> directory_;
  inline static std::unique_ptr<RedisCluster> cluster_;
};

TEST_F(ModuleCluster, every_node_serves_the_dma_commands_of_its_slots_and_redirects_the_rest_with_moved) {
  // If this fails, a node stores a DMA value for a slot it does not own (lost to the cluster,
  // unreachable for every client) or sends clients somewhere other than the slot's owner;
  // the key is not declared in the command table.
  Connection probe(node(0).port());
  for (std::size_t owner = 0; owner < cluster_->size(); ++owner) {
    const std::string key = keys_of(owner, 1, "routed-")[0];
    const std::string slot = std::to_string(redis::key_slot(key));
    EXPECT_EQ(std::to_string(integer_of(probe.command({"CLUSTER", "KEYSLOT", key}))), slot)
        << "key_slot disagrees with the server";
    for (std::size_t asked = 0; asked < cluster_->size(); ++asked) {
      SCOPED_TRACE(key + " owned by node " + std::to_string(owner) + ", asked node " +
                   std::to_string(asked));
      auto target = Target::open(loopback("tcp"));
      ASSERT_TRUE(target);
      Connection connection(node(asked).port());
      ASSERT_TRUE(hello_and_prove(connection, **target)) << "HELLO/PROVE have no key: any node";
      const auto value = pattern(100000, static_cast<std::uint32_t>(owner * 10 + asked));
      std::vector<std::byte> memory(value);
      auto exposed = (*target)->expose(memory.data(), memory.size());
      ASSERT_TRUE(exposed);
      (*target)->synchronize();
      const long long transfers = info_field(connection, "transfers");
      const std::vector<std::vector<std::string>> commands = {
          dma_set(key, value.size(), {}, exposed->whole()),
          with_region({"DMA.GET", key}, exposed->whole()),
          {"DMA.SETPLAIN", key, "v"},
          {"DMA.GETPLAIN", key},
      };
      for (const auto& command : commands) {
        Reply reply = connection.command(command);
        if (asked == owner) {
          EXPECT_TRUE(reply && reply->type != REDIS_REPLY_ERROR) << command[0] << ": " << error_of(reply);
        } else {
          EXPECT_EQ("MOVED " + slot + " " + address(owner), error_of(reply)) << command[0];
        }
      }
      if (asked != owner) {
        EXPECT_EQ(transfers, info_field(connection, "transfers")) << "a redirected command transferred";
      }
    }
  }
}

TEST_F(ModuleCluster, a_dma_client_stores_and_reads_keys_in_every_slot_range_with_one_hello_per_node) {
  // If this fails, dma::Client cannot use a cluster: it does not follow -MOVED, says a new hello
  // for every redirection (a proof's read each time), or lands values on the wrong node.
  auto dma = cluster_client();
  ASSERT_TRUE(dma);
  std::map<std::string, std::vector<std::byte>> values;
  for (std::size_t owner = 0; owner < cluster_->size(); ++owner) {
    for (const std::string& key : keys_of(owner, 4, "spread-")) {
      // Over the fabric and inline (below inline-max), each node.
      values[key] = pattern(values.size() % 2 == 0 ? (1 << 20) : 100, static_cast<std::uint32_t>(values.size()));
    }
  }
  for (int round = 0; round < 2; ++round) {
    for (const auto& [key, value] : values) {
      ASSERT_TRUE(dma->set(key, value)) << key;
      std::vector<std::byte> back(value.size());
      auto read = dma->get(key, back);
      ASSERT_TRUE(read && read->has_value()) << key << ": " << (read ? "nil" : read.error().describe());
      EXPECT_TRUE(back == value) << key;
    }
  }
  EXPECT_EQ(cluster_->size(), dma->sessions()) << "one proven session per node";
  for (std::size_t owner = 0; owner < cluster_->size(); ++owner) {
    Connection connection(node(owner).port());
    // (The previous test's connections are closed; the server forgets their sessions as it reads
    // each close.)
    EXPECT_TRUE(eventually([&] { return info_field(connection, "sessions_proven") == 1; }))
        << "node " << owner << " holds " << info_field(connection, "sessions_proven")
        << " proven sessions: the client said more than one hello there";
    for (const std::string& key : keys_of(owner, 4, "spread-")) {
      EXPECT_EQ(as_string(values[key]), text_of(connection.command({"DMA.GETPLAIN", key})))
          << key << " is not on the node owning its slot";
    }
  }
}

TEST_F(ModuleCluster, a_slot_migrated_under_dma_traffic_keeps_every_value_and_the_client_follows_ask_then_moved) {
  // If this fails, MIGRATE (DUMP/RESTORE of a dma-value) loses or changes a value, its TTL or
  // its CRC, or a client in the middle of a resharding gets errors instead of being sent where
  // each key is now.
  const int slot = redis::key_slot("{moving}");
  const std::size_t from = cluster_->owner_at_start(slot);
  const std::size_t to = (from + 1) % cluster_->size();
  auto dma = cluster_client(to);  // starts on the wrong node: the first command is redirected
  ASSERT_TRUE(dma);
  std::map<std::string, std::vector<std::byte>> values;
  std::vector<std::string> keys;
  for (int index = 0; index < 24; ++index) {
    const std::string key = "{moving}-" + std::to_string(index);
    keys.push_back(key);
    values[key] = pattern(std::size_t{1} << (8 + index % 13), 400 + index);
    ASSERT_TRUE(dma->set(key, values[key])) << key;
  }
  Connection source(node(from).port());
  ASSERT_EQ(2u, length_and_crc(source.command({"DMA.SETPLAIN", "{moving}-ttl", "kept", "PX", "1000000"})).size());
  values["{moving}-ttl"] = std::vector<std::byte>(
      reinterpret_cast<const std::byte*>("kept"), reinterpret_cast<const std::byte*>("kept") + 4);

  ASSERT_NO_FATAL_FAILURE(begin_migration(slot, from, to));
  // Traffic between the batches: keys still at the source are served there, moved ones (and
  // new ones) through -ASK at the target.
  std::vector<std::byte> back(std::size_t{1} << 20);
  auto traffic = [&](int round) {
    const std::string key = keys[static_cast<std::size_t>(round * 7) % keys.size()];
    values[key] = pattern(std::size_t{1} << (8 + round % 13), 900 + round);
    ASSERT_TRUE(dma->set(key, values[key])) << key;
    for (const std::string& read_key : {key, keys[static_cast<std::size_t>(round * 5 + 3) % keys.size()]}) {
      auto read = dma->get(read_key, back);
      ASSERT_TRUE(read && read->has_value()) << read_key << ": " << (read ? "nil" : read.error().describe());
      EXPECT_TRUE(std::equal(values[read_key].begin(), values[read_key].end(), back.begin())) << read_key;
    }
    const std::string fresh = "{moving}-new-" + std::to_string(round);
    values[fresh] = pattern(2048, 1500 + round);
    ASSERT_TRUE(dma->set(fresh, values[fresh])) << fresh << " (a new key during migration: -ASK)";
  };
  std::vector<std::string> all = keys;
  all.push_back("{moving}-ttl");
  for (std::size_t first = 0, round = 0; first < all.size(); first += 5, ++round) {
    ASSERT_NO_FATAL_FAILURE(traffic(static_cast<int>(round)));
    const std::vector<std::string> batch(all.begin() + first,
                                         all.begin() + std::min(first + 5, all.size()));
    ASSERT_NO_FATAL_FAILURE(migrate_keys(from, to, batch));
  }
  ASSERT_NO_FATAL_FAILURE(traffic(100));
  ASSERT_NO_FATAL_FAILURE(finish_migration(slot, to));
  ASSERT_NO_FATAL_FAILURE(traffic(101));  // -MOVED now, for the keys the client knew at the source

  Connection target(node(to).port());
  EXPECT_EQ(0, integer_of(source.command({"CLUSTER", "COUNTKEYSINSLOT", std::to_string(slot)})));
  for (const auto& [key, value] : values) {
    EXPECT_EQ(as_string(value), text_of(target.command({"DMA.GETPLAIN", key}))) << key;
    auto read = dma->get(key, back);
    ASSERT_TRUE(read && read->has_value()) << key;
    EXPECT_TRUE(std::equal(value.begin(), value.end(), back.begin())) << key;
  }
  const long long ttl = integer_of(target.command({"PTTL", "{moving}-ttl"}));
  EXPECT_TRUE(ttl > 0 && ttl <= 1000000) << "MIGRATE lost the TTL: " << ttl;
  // DUMP and RESTORE, what MIGRATE runs, on their own.
  Reply dumped = target.command({"DUMP", "{moving}-0"});
  ASSERT_TRUE(dumped && dumped->type == REDIS_REPLY_STRING) << error_of(dumped);
  Reply restored = target.command({"RESTORE", "{moving}-copy", "0", std::string(dumped->str, dumped->len)});
  ASSERT_TRUE(restored && restored->type == REDIS_REPLY_STATUS) << error_of(restored);
  EXPECT_EQ(as_string(values["{moving}-0"]), text_of(target.command({"DMA.GETPLAIN", "{moving}-copy"})));
  EXPECT_EQ("dma-value", std::string(target.command({"TYPE", "{moving}-copy"})->str));
}

TEST_F(ModuleCluster, a_dma_set_whose_key_migrates_during_its_read_answers_tryagain_and_changes_nothing) {
  // If this fails, a DMA.SET whose read outlives its node's ownership of the key stores the
  // value on the old node (where no client will ever find it: the write is lost while the client
  // was told it succeeded), or changes the migrated key.
  const int slot = redis::key_slot("{racing}");
  const std::size_t from = cluster_->owner_at_start(slot);
  const std::size_t to = (from + 1) % cluster_->size();
  Connection source(node(from).port());
  Connection target(node(to).port());
  const std::size_t size = std::size_t{16} << 20;
  auto held = child_session(node(from).port(), size, 7);
  ASSERT_TRUE(held.connection);
  // The keys first: once the slot is MIGRATING, the source sends writes of new keys away (-ASK).
  const std::string bystander = "{racing}-bystander";
  const std::string key = "{racing}-raced";
  ASSERT_EQ(2u, length_and_crc(source.command({"DMA.SETPLAIN", bystander, "before"})).size());
  ASSERT_EQ(2u, length_and_crc(source.command({"DMA.SETPLAIN", key, "before"})).size());
  ASSERT_NO_FATAL_FAILURE(begin_migration(slot, from, to));
  const long long transfers = info_field(source, "transfers");
  const long long refused = info_field(source, "writes_refused_late");
  // Its target stopped, the read stays in flight across the MIGRATE.
  ASSERT_NO_FATAL_FAILURE(held.target->freeze());
  held.connection->send(dma_set(key, size, {}, held.region(0, size)));
  ASSERT_TRUE(eventually([&] { return info_field(source, "transfers") > transfers; }));
  ASSERT_NO_FATAL_FAILURE(migrate_keys(from, to, {key}));
  EXPECT_EQ(1, info_field(source, "in_flight")) << "the read ended with its target stopped";
  ASSERT_NO_FATAL_FAILURE(held.target->thaw());
  Reply reply = held.connection->receive();
  EXPECT_TRUE(contains(error_of(reply), "TRYAGAIN")) << error_of(reply);
  EXPECT_EQ(refused + 1, info_field(source, "writes_refused_late"));
  // A migrating node sends a key it no longer holds away with -ASK.
  EXPECT_TRUE(error_of(source.command({"EXISTS", key})).starts_with("ASK ")) << "the old node kept a copy";
  target.command({"ASKING"});
  EXPECT_EQ("before", text_of(target.command({"DMA.GETPLAIN", key}))) << "the migrated key changed";
  // The resharding completes as usual.
  ASSERT_NO_FATAL_FAILURE(migrate_keys(from, to, {bystander}));
  ASSERT_NO_FATAL_FAILURE(finish_migration(slot, to));
  EXPECT_EQ("before", text_of(target.command({"DMA.GETPLAIN", bystander})));
}

}  // namespace
}  // namespace dma::testing
