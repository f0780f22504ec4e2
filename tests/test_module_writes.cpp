// A DMA write is a Redis write (issue 12, module/write.hpp): DMA.SET and DMA.SETPLAIN abort a
// transaction WATCHing their key, fire the keyspace events SET fires, follow SET's TTL and NX/XX
// rules (NX/XX decided before the read and again when the value is swapped in), DMA.SETPLAIN
// answers GET; the value store counts in used_memory, so MEMORY USAGE, allkeys-lru eviction and
// deny-oom see it. Real redis-servers with the module, tcp over loopback.
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <functional>
#include <string>
#include <vector>

#include "module_fixtures.hpp"

namespace dma::testing {
namespace {

class ModuleWrites : public Module {
 protected:
  // The server's clock, in seconds since the epoch (TIME).
  long long server_seconds(Connection& connection) {
    Reply time = connection.command({"TIME"});
    return time && time->type == REDIS_REPLY_ARRAY ? std::stoll(time->element[0]->str) : 0;
  }
};

TEST_F(ModuleWrites, a_dma_write_of_a_watched_key_aborts_the_transaction_and_a_refused_one_does_not) {
  // If this fails, a client that WATCHed a key runs its EXEC although a DMA.SET or DMA.SETPLAIN
  // changed the key meanwhile (the optimistic lock is broken), or a write that did not happen
  // (NX refused, CRC mismatch) aborts transactions for nothing.
  auto dma = client();
  ASSERT_TRUE(dma);
  Connection watcher(port());
  Connection writer(port());
  ASSERT_EQ(2u, length_and_crc(writer.command({"DMA.SETPLAIN", "watched", "old"})).size());
  const auto value = pattern(100000, 3);
  auto transaction_ran = [&](auto&& write) {
    Reply watching = watcher.command({"WATCH", "watched"});
    EXPECT_TRUE(watching && watching->type == REDIS_REPLY_STATUS) << error_of(watching);
    write();
    watcher.command({"MULTI"});
    watcher.command({"SET", "watch-marker", "ran"});
    Reply exec = watcher.command({"EXEC"});
    EXPECT_TRUE(exec && (exec->type == REDIS_REPLY_ARRAY || exec->type == REDIS_REPLY_NIL))
        << error_of(exec);
    return exec && exec->type == REDIS_REPLY_ARRAY;
  };
  EXPECT_FALSE(transaction_ran([&] { ASSERT_TRUE(dma->set("watched", value)); }))
      << "a DMA.SET of the watched key did not abort EXEC";
  EXPECT_FALSE(transaction_ran([&] {
    ASSERT_EQ(2u, length_and_crc(writer.command({"DMA.SETPLAIN", "watched", "new"})).size());
  })) << "a DMA.SETPLAIN of the watched key did not abort EXEC";
  EXPECT_TRUE(transaction_ran([&] {
    EXPECT_TRUE(is_nil(writer.command({"DMA.SETPLAIN", "watched", "x", "NX"})));
    EXPECT_TRUE(contains(error_of(writer.command({"DMA.SETPLAIN", "watched", "x", "CRC", "1"})),
                         "CRC32C mismatch"));
  })) << "a write that did not happen aborted EXEC";
  EXPECT_EQ("new", text_of(writer.command({"DMA.GETPLAIN", "watched"})));
}

TEST_F(ModuleWrites, dma_writes_fire_the_keyspace_events_a_set_fires) {
  // If this fails, a keyspace-notification listener (a cache invalidating on "set") misses
  // values written over the fabric or by DMA.SETPLAIN, or sees events SET would not send.
  Connection admin(port());
  ASSERT_TRUE(admin.command({"CONFIG", "SET", "notify-keyspace-events", "KEA"}));
  Connection listener(port());
  Reply subscribed = listener.command({"SUBSCRIBE", "__keyspace@0__:notified", "__keyevent@0__:set"});
  ASSERT_TRUE(subscribed && subscribed->type == REDIS_REPLY_ARRAY) << error_of(subscribed);
  ASSERT_TRUE(listener.receive());  // the second channel's confirmation
  auto next_event = [&] {
    Reply message = listener.receive();
    if (!message || message->type != REDIS_REPLY_ARRAY || message->elements != 3) {
      return std::string("<no message>");
    }
    return std::string(message->element[1]->str) + " " + message->element[2]->str;
  };
  auto dma = client();
  ASSERT_TRUE(dma);
  struct Case {
    std::string name;
    std::function<void()> write;
    std::vector<std::string> events;
  };
  const std::vector<Case> cases = {
      {"SET (the reference)", [&] { admin.command({"SET", "notified", "v", "EX", "100"}); },
       {"__keyspace@0__:notified set", "__keyevent@0__:set notified", "__keyspace@0__:notified expire"}},
      {"DMA.SET", [&] { ASSERT_TRUE(dma->set("notified", pattern(4096, 1))); },
       {"__keyspace@0__:notified set", "__keyevent@0__:set notified"}},
      {"DMA.SETPLAIN EX", [&] { admin.command({"DMA.SETPLAIN", "notified", "v", "EX", "100"}); },
       {"__keyspace@0__:notified set", "__keyevent@0__:set notified", "__keyspace@0__:notified expire"}},
  };
  for (const Case& write : cases) {
    SCOPED_TRACE(write.name);
    write.write();
    for (const std::string& expected : write.events) EXPECT_EQ(expected, next_event());
  }
  // Nothing more: a write NX refused fires nothing; the next event is the DEL's.
  EXPECT_TRUE(is_nil(admin.command({"DMA.SETPLAIN", "notified", "v", "NX"})));
  admin.command({"DEL", "notified"});
  EXPECT_EQ("__keyspace@0__:notified del", next_event());
  ASSERT_TRUE(admin.command({"CONFIG", "SET", "notify-keyspace-events", ""}));
}

TEST_F(ModuleWrites, a_write_clears_the_ttl_unless_keepttl_and_ex_px_exat_pxat_set_one_that_is_honoured) {
  // If this fails, a fresh value inherits the old value's deadline and vanishes early (SET
  // clears a TTL), KEEPTTL loses it, or EX/PX/EXAT/PXAT set the wrong deadline or none at all.
  auto target = open_target();
  ASSERT_TRUE(target);
  auto connection = session(*target);
  Connection admin(port());
  const auto value = pattern(4096, 9);
  std::vector<std::byte> memory(value);
  auto exposed = target->expose(memory.data(), memory.size());
  ASSERT_TRUE(exposed);
  target->synchronize();
  auto ttl_after = [&](const std::vector<std::string>& options, bool plain) {
    Reply stored = plain ? admin.command([&] {
      std::vector<std::string> command = {"DMA.SETPLAIN", "ttl", as_string(value)};
      command.insert(command.end(), options.begin(), options.end());
      return command;
    }())
                         : connection->command(dma_set("ttl", value.size(), options, exposed->whole()));
    EXPECT_EQ((std::vector<std::string>{"4096", std::to_string(crc32c(value))}), length_and_crc(stored));
    return integer_of(admin.command({"PTTL", "ttl"}));
  };
  for (bool plain : {false, true}) {
    SCOPED_TRACE(plain ? "DMA.SETPLAIN" : "DMA.SET");
    admin.command({"SET", "ttl", "x", "EX", "1000"});
    EXPECT_EQ(-1, ttl_after({}, plain)) << "the old TTL survived the write";
    const long long ex = ttl_after({"EX", "100"}, plain);
    EXPECT_TRUE(ex > 0 && ex <= 100000) << ex;
    const long long px = ttl_after({"PX", "50000"}, plain);
    EXPECT_TRUE(px > 0 && px <= 50000) << px;
    // A stored value replaced in place (keys.hpp) loses its TTL too.
    EXPECT_EQ(-1, ttl_after({}, plain)) << "the stored value's TTL survived the write";
    (void)ttl_after({"PX", "50000"}, plain);
    const long long now = server_seconds(admin);
    const long long exat = ttl_after({"EXAT", std::to_string(now + 100)}, plain);
    EXPECT_TRUE(exat > 0 && exat <= 101000) << exat;
    const long long pxat = ttl_after({"PXAT", std::to_string((now + 200) * 1000)}, plain);
    EXPECT_TRUE(pxat > 100000 && pxat <= 201000) << pxat;
    admin.command({"PEXPIRE", "ttl", "700000"});
    const long long kept = ttl_after({"KEEPTTL"}, plain);
    EXPECT_TRUE(kept > 600000 && kept <= 700000) << "KEEPTTL lost the TTL: " << kept;
    admin.command({"PERSIST", "ttl"});
    EXPECT_EQ(-1, ttl_after({"KEEPTTL"}, plain));
    // Honoured: a short TTL removes the value and its block comes back.
    const long long in_use = info_field(admin, "arena_bytes_in_use");
    ttl_after({"PX", "30"}, plain);
    EXPECT_TRUE(eventually([&] { return integer_of(admin.command({"EXISTS", "ttl"})) == 0; }));
    EXPECT_TRUE(eventually([&] { return info_field(admin, "arena_bytes_in_use") < in_use; }))
        << "the expired value's block did not come back";
  }
  EXPECT_TRUE(contains(error_of(connection->command(dma_set("ttl", 10, {"EX", "0"}, exposed->whole()))),
                       "invalid expire time"));
  EXPECT_TRUE(contains(error_of(connection->command(
                           dma_set("ttl", 10, {"EX", "1", "PX", "1"}, exposed->whole()))),
                       "EX and PX cannot be combined"));
}

TEST_F(ModuleWrites, nx_and_xx_refuse_before_any_read_and_write_only_when_they_hold) {
  // If this fails, a DMA.SET NX overwrites an existing key (or XX creates one), or a refused one
  // still reads the client's memory (a wasted transfer of up to max-value-size bytes).
  auto target = open_target();
  ASSERT_TRUE(target);
  auto connection = session(*target);
  Connection admin(port());
  const auto value = pattern(65536, 4);
  std::vector<std::byte> memory(value);
  auto exposed = target->expose(memory.data(), memory.size());
  ASSERT_TRUE(exposed);
  target->synchronize();
  admin.command({"DEL", "nx-key"});
  ASSERT_EQ(2u, length_and_crc(admin.command({"DMA.SETPLAIN", "xx-key", "kept"})).size());
  const long long transfers = info_field(admin, "transfers");
  EXPECT_TRUE(is_nil(connection->command(dma_set("xx-key", value.size(), {"NX"}, exposed->whole()))));
  EXPECT_TRUE(is_nil(connection->command(dma_set("nx-key", value.size(), {"XX"}, exposed->whole()))));
  EXPECT_EQ(transfers, info_field(admin, "transfers")) << "a refused NX/XX read the client's memory";
  EXPECT_EQ("kept", text_of(admin.command({"DMA.GETPLAIN", "xx-key"})));
  EXPECT_EQ(0, integer_of(admin.command({"EXISTS", "nx-key"})));

  const std::vector<std::string> stored = {std::to_string(value.size()), std::to_string(crc32c(value))};
  EXPECT_EQ(stored, length_and_crc(connection->command(dma_set("nx-key", value.size(), {"NX"}, exposed->whole()))));
  EXPECT_EQ(stored, length_and_crc(connection->command(dma_set("xx-key", value.size(), {"XX"}, exposed->whole()))));
  EXPECT_EQ(as_string(value), text_of(admin.command({"DMA.GETPLAIN", "nx-key"})));
  EXPECT_EQ(as_string(value), text_of(admin.command({"DMA.GETPLAIN", "xx-key"})));
  // SETPLAIN the same way.
  EXPECT_TRUE(is_nil(admin.command({"DMA.SETPLAIN", "nx-key", "other", "NX"})));
  EXPECT_TRUE(is_nil(admin.command({"DMA.SETPLAIN", "absent-key", "other", "XX"})));
  EXPECT_EQ(0, integer_of(admin.command({"EXISTS", "absent-key"})));
  EXPECT_EQ(as_string(value), text_of(admin.command({"DMA.GETPLAIN", "nx-key"})));
}

TEST_F(ModuleWrites, nx_and_xx_are_checked_again_when_the_value_is_swapped_in_and_a_lost_race_changes_nothing) {
  // If this fails, a DMA.SET NX whose key another client created while its read was in flight
  // overwrites that client's value (or XX recreates a key deleted meanwhile): the condition was
  // only checked before the read.
  const std::size_t size = std::size_t{16} << 20;
  auto held = child_session(port(), size, 5);
  ASSERT_TRUE(held.connection);
  Connection other(port());
  struct Case {
    std::string name;
    std::string condition;
    std::vector<std::string> before;  // the key before the DMA.SET
    std::vector<std::string> during;  // what another client does while the read is in flight
    std::string after;                // the key afterwards ("" for absent)
  };
  const std::vector<Case> cases = {
      {"NX, created meanwhile", "NX", {"DEL", "raced"}, {"SET", "raced", "theirs"}, "theirs"},
      {"XX, deleted meanwhile", "XX", {"SET", "raced", "before"}, {"DEL", "raced"}, ""},
  };
  for (const Case& race : cases) {
    SCOPED_TRACE(race.name);
    other.command(race.before);
    const long long failed = info_field(other, "conditions_failed");
    const long long transfers = info_field(other, "transfers");
    // The read cannot complete while its target is stopped.
    ASSERT_NO_FATAL_FAILURE(held.target->freeze());
    held.connection->send(dma_set("raced", size, {race.condition}, held.region(0, size)));
    ASSERT_TRUE(eventually([&] { return info_field(other, "transfers") > transfers; }));
    other.command(race.during);
    EXPECT_EQ(1, info_field(other, "in_flight")) << "the read ended with its target stopped";
    ASSERT_NO_FATAL_FAILURE(held.target->thaw());
    Reply reply = held.connection->receive();
    EXPECT_TRUE(is_nil(reply)) << "the swap ignored the condition: " << length_and_crc(reply)[0];
    EXPECT_EQ(failed + 1, info_field(other, "conditions_failed"));
    EXPECT_EQ(0, info_field(other, "in_flight"));
    if (race.after.empty()) {
      EXPECT_EQ(0, integer_of(other.command({"EXISTS", "raced"})));
    } else {
      EXPECT_EQ(race.after, text_of(other.command({"GET", "raced"})));
    }
  }
  // The same write with its condition holding throughout stores the child's bytes.
  other.command({"DEL", "raced"});
  const auto value = pattern(size, 5);
  EXPECT_EQ((std::vector<std::string>{std::to_string(size), std::to_string(crc32c(value))}),
            length_and_crc(held.connection->command(dma_set("raced", size, {"NX"}, held.region(0, size)))));
}

TEST_F(ModuleWrites, dma_setplain_get_answers_the_old_value_and_a_wrong_type_writes_nothing) {
  // If this fails, SET ... GET's contract is broken for DMA values: the old value is lost, or a
  // key of another type is overwritten although GET could not answer it.
  Connection admin(port());
  admin.command({"DEL", "swapped"});
  EXPECT_TRUE(is_nil(admin.command({"DMA.SETPLAIN", "swapped", "first", "GET"})));
  EXPECT_EQ("first", text_of(admin.command({"DMA.SETPLAIN", "swapped", "second", "GET"})));
  admin.command({"SET", "swapped", "plain"});
  EXPECT_EQ("plain", text_of(admin.command({"DMA.SETPLAIN", "swapped", "third", "GET"})));
  EXPECT_EQ("third", text_of(admin.command({"DMA.SETPLAIN", "swapped", "fourth", "NX", "GET"})))
      << "NX GET answers the old value and writes nothing";
  EXPECT_EQ("third", text_of(admin.command({"DMA.GETPLAIN", "swapped"})));
  admin.command({"DEL", "listed"});
  admin.command({"RPUSH", "listed", "a"});
  EXPECT_TRUE(contains(error_of(admin.command({"DMA.SETPLAIN", "listed", "v", "GET"})), "WRONGTYPE"));
  EXPECT_EQ("list", std::string(admin.command({"TYPE", "listed"})->str));
}

TEST_F(ModuleWrites, the_value_store_counts_in_used_memory_and_memory_usage) {
  // If this fails, INFO memory and maxmemory do not see values in the arena (a server full of
  // DMA values reports a few MiB used and never evicts), or MEMORY USAGE under-reports them.
  auto dma = client();
  ASSERT_TRUE(dma);
  Connection admin(port());
  admin.command({"DEL", "counted"});
  const long long before = admin.info_number("memory", "used_memory");
  const std::size_t size = std::size_t{16} << 20;
  ASSERT_TRUE(dma->set("counted", pattern(size, 6)));
  const long long holding = admin.info_number("memory", "used_memory");
  EXPECT_GE(holding - before, static_cast<long long>(size)) << "used_memory missed the value";
  EXPECT_GE(integer_of(admin.command({"MEMORY", "USAGE", "counted"})), static_cast<long long>(size));
  EXPECT_GE(info_field(admin, "used_memory_charged"), info_field(admin, "arena_bytes_in_use"));
  admin.command({"DEL", "counted"});
  EXPECT_LT(admin.info_number("memory", "used_memory"), holding - static_cast<long long>(size) + (1 << 20))
      << "used_memory did not fall with the value";
}

TEST_F(ModuleWrites, a_large_write_nobody_would_receive_is_not_copied_for_replication_but_still_counts_as_a_change) {
  // If this fails, a server without replicas or AOF either copies every large value once more
  // on its main thread for a replication stream nobody reads (14 ms per 16 MiB measured), or no
  // longer counts DMA writes as changes, so `save` points never fire for them.
  auto dma = client();
  ASSERT_TRUE(dma);
  Connection admin(port());
  ASSERT_EQ(0, admin.info_number("replication", "connected_slaves"));
  const long long changes = admin.info_number("persistence", "rdb_changes_since_last_save");
  const long long unpropagated = info_field(admin, "writes_unpropagated");
  const long long replicated = info_field(admin, "writes_replicated");
  ASSERT_TRUE(dma->set("unheard", pattern(1 << 20, 12)));
  EXPECT_EQ(unpropagated + 1, info_field(admin, "writes_unpropagated"));
  EXPECT_EQ(replicated, info_field(admin, "writes_replicated"));
  EXPECT_GT(admin.info_number("persistence", "rdb_changes_since_last_save"), changes)
      << "the write did not count as a change";
}

TEST(ModuleMaxmemory, under_allkeys_lru_module_values_are_evicted_and_their_arena_blocks_come_back) {
  // If this fails, a server with maxmemory fills its arena with DMA values until DMA.SET fails
  // naming arena-bytes (their memory is invisible to eviction), or evicted values leak their
  // blocks.
  auto server = start_server({"arena-bytes", "67108864"});
  ASSERT_TRUE(server);
  Connection admin(server->port());
  const long long baseline = admin.info_number("memory", "used_memory");
  ASSERT_GT(baseline, 0);
  const long long limit = baseline + (12 << 20);
  ASSERT_TRUE(admin.command({"CONFIG", "SET", "maxmemory", std::to_string(limit)}));
  ASSERT_TRUE(admin.command({"CONFIG", "SET", "maxmemory-policy", "allkeys-lru"}));
  auto made = Client::connect("127.0.0.1", server->port(), loopback("tcp"));
  ASSERT_TRUE(made && (*made)->hello());
  constexpr int kValues = 40;  // 40 MiB through 12 MiB of room
  const std::size_t size = 1 << 20;
  for (int index = 0; index < kValues; ++index) {
    Status stored = (*made)->set("lru-" + std::to_string(index), pattern(size, 100 + index));
    ASSERT_TRUE(stored) << index << ": " << stored.error().describe();
  }
  EXPECT_GT(admin.info_number("stats", "evicted_keys"), 0) << "nothing was evicted";
  const long long in_use = info_field(admin, "arena_bytes_in_use");
  EXPECT_LT(in_use, 20ll << 20) << "evicted values kept their blocks";
  EXPECT_EQ(info_field(admin, "arena_blocks"), integer_of(admin.command({"DBSIZE"})))
      << "one block per remaining value";
  std::vector<std::byte> back(size);
  int kept = 0;
  for (int index = 0; index < kValues; ++index) {
    auto read = (*made)->get("lru-" + std::to_string(index), back);
    ASSERT_TRUE(read) << read.error().describe();
    if (!read->has_value()) continue;
    ++kept;
    EXPECT_TRUE(back == pattern(size, 100 + index)) << "a surviving value changed: " << index;
  }
  EXPECT_GT(kept, 0);
  EXPECT_LT(kept, kValues);
  ASSERT_TRUE(admin.command({"FLUSHALL"}));
  EXPECT_TRUE(eventually([&] { return info_field(admin, "arena_bytes_in_use") == 0; }));
  EXPECT_EQ(0, info_field(admin, "arena_blocks"));
  EXPECT_EQ(0, info_field(admin, "used_memory_charged"));
  made->reset();
  server->stop();
  expect_clean_log(server->log());
}

TEST(ModuleMaxmemory, deny_oom_refuses_a_dma_set_before_any_read_when_over_maxmemory) {
  // If this fails, a server over maxmemory with noeviction still reads a client's value into
  // its arena (growing past the limit), or refuses without the OOM error clients know.
  auto server = start_server({"arena-bytes", "67108864"});
  ASSERT_TRUE(server);
  Connection admin(server->port());
  for (int index = 0; index < 4; ++index) {
    ASSERT_EQ(2u, length_and_crc(admin.command({"DMA.SETPLAIN", "full-" + std::to_string(index),
                                                as_string(pattern(1 << 20, index))}))
                      .size());
  }
  // The values alone are over the limit now.
  const long long used = admin.info_number("memory", "used_memory");
  ASSERT_TRUE(admin.command({"CONFIG", "SET", "maxmemory-policy", "noeviction"}));
  ASSERT_TRUE(admin.command({"CONFIG", "SET", "maxmemory", std::to_string(used - (2 << 20))}));
  auto made = Client::connect("127.0.0.1", server->port(), loopback("tcp"));
  ASSERT_TRUE(made && (*made)->hello());
  EXPECT_TRUE(contains(error_of(admin.command({"DMA.SETPLAIN", "more", "v"})), "OOM"));
  const long long transfers = info_field(admin, "transfers");
  Status refused = (*made)->set("full-0", pattern(1 << 20, 99));
  ASSERT_FALSE(refused);
  EXPECT_TRUE(contains(refused.error().message(), "OOM")) << refused.error().message();
  EXPECT_EQ(transfers, info_field(admin, "transfers")) << "the refused DMA.SET read the client";
  EXPECT_EQ(as_string(pattern(1 << 20, 0)), text_of(admin.command({"DMA.GETPLAIN", "full-0"})));
  made->reset();
  server->stop();
  expect_clean_log(server->log());
}

}  // namespace
}  // namespace dma::testing
