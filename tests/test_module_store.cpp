// The module's value store end to end: values DMA.SET and DMA.SETPLAIN store live in the arena
// registered at load, DMA.GET sends straight from them (a transfer keeps its block alive through
// DEL, overwrite and expiry), RDB save/load keeps values and CRCs, no transfer registers memory,
// and a full arena or an oversized value is refused with the limit named. Real redis-servers
// with the module, tcp over loopback.
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "module_fixtures.hpp"

namespace dma::testing {
namespace {

TEST_F(Module, plain_resp_and_dma_commands_read_each_others_values_at_every_size) {
  // If this fails, a value stored over the fabric cannot be read by a client without one (or
  // the other way round), or DMA.GET answers a CRC other than the one recorded at SET.
  auto dma = client();
  ASSERT_TRUE(dma);
  Connection plain(port());
  for (std::size_t size : {std::size_t{0}, std::size_t{1}, std::size_t{4096}, std::size_t{1} << 20,
                           std::size_t{16} << 20}) {
    SCOPED_TRACE("size " + std::to_string(size));
    const auto value = pattern(size, static_cast<std::uint32_t>(size) + 5);
    const std::string key = "plain-to-dma-" + std::to_string(size);
    Reply stored = plain.command({"DMA.SETPLAIN", key, as_string(value)});
    ASSERT_EQ((std::vector<std::string>{std::to_string(size), std::to_string(crc32c(value))}),
              length_and_crc(stored));
    std::vector<std::byte> back(size + 1, std::byte{0x33});
    auto read = dma->get(key, back);
    ASSERT_TRUE(read && read->has_value()) << (read ? "nil" : read.error().describe());
    ASSERT_EQ(size, **read);
    EXPECT_TRUE(std::equal(value.begin(), value.end(), back.begin()));
    EXPECT_EQ(std::byte{0x33}, back[size]);
    Reply typed = plain.command({"TYPE", key});
    ASSERT_TRUE(typed);
    EXPECT_EQ("dma-value", std::string(typed->str, typed->len));
  }
  EXPECT_TRUE(contains(error_of(plain.command({"GET", "plain-to-dma-1"})), "WRONGTYPE"))
      << "a stored value is not a plain string";
  Reply missing = plain.command({"DMA.GETPLAIN", "plain-to-dma-missing"});
  ASSERT_TRUE(missing);
  EXPECT_EQ(REDIS_REPLY_NIL, missing->type);
  const auto value = pattern(1000, 77);
  Reply refused = plain.command({"DMA.SETPLAIN", "plain-crc", as_string(value), "CRC",
                                 std::to_string(crc32c(value) ^ 1)});
  EXPECT_TRUE(contains(error_of(refused), "CRC32C mismatch")) << error_of(refused);
  Reply absent = plain.command({"EXISTS", "plain-crc"});
  EXPECT_EQ(0, absent->integer) << "a refused SETPLAIN created the key";
}

TEST_F(Module, del_overwrite_and_expire_during_a_16_mib_dma_get_deliver_the_old_bytes_and_free_its_block_after) {
  // If this fails, DMA.GET sends from a block that DEL, an overwrite or an expiry freed (the
  // reader gets foreign bytes), or the block is never freed (the arena leaks).
  auto target = open_target();
  ASSERT_TRUE(target);
  auto connection = session(*target);
  Connection other(port());
  const std::size_t size = std::size_t{16} << 20;
  std::vector<std::byte> memory(size);
  auto exposed = target->expose(memory.data(), memory.size());
  ASSERT_TRUE(exposed);
  const auto old_value = pattern(size, 61);
  const auto new_value = pattern(size, 62);
  struct Case {
    std::string name;
    std::vector<std::string> change;
    bool key_remains;
  };
  const std::vector<Case> cases = {
      {"del", {"DEL", "racing"}, false},
      {"overwrite", {"DMA.SETPLAIN", "racing", as_string(new_value)}, true},
      {"expire", {"PEXPIRE", "racing", "1"}, false},
  };
  for (const Case& change : cases) {
    SCOPED_TRACE(change.name);
    ASSERT_TRUE(other.command({"DEL", "racing"}));
    const long long before = info_field(other, "arena_bytes_in_use");
    ASSERT_EQ(2u, length_and_crc(other.command({"DMA.SETPLAIN", "racing", as_string(old_value)})).size());
    const long long holding = info_field(other, "arena_bytes_in_use");
    EXPECT_GT(holding, before + static_cast<long long>(size) - 1);
    std::fill(memory.begin(), memory.end(), std::byte{0});
    const long long transfers = info_field(other, "transfers");
    connection->send(with_region({"DMA.GET", "racing"}, exposed->whole()));
    // Once the server has taken the DMA.GET (its transfer submitted: the two connections' commands
    // may otherwise be read in either order), the change runs while its write is on the wire.
    ASSERT_TRUE(eventually([&] { return info_field(other, "transfers") > transfers; }));
    Reply changed = other.command(change.change);
    ASSERT_TRUE(changed && changed->type != REDIS_REPLY_ERROR) << error_of(changed);
    Reply got = connection->receive();
    ASSERT_EQ((std::vector<std::string>{std::to_string(size), std::to_string(crc32c(old_value))}),
              length_and_crc(got));
    target->synchronize();
    EXPECT_TRUE(memory == old_value) << "the reader did not get the old bytes exactly";
    if (!change.key_remains) {
      ASSERT_TRUE(eventually([&] { return other.command({"EXISTS", "racing"})->integer == 0; }));
      EXPECT_EQ(before, info_field(other, "arena_bytes_in_use")) << "the old block was not freed";
    } else {
      EXPECT_EQ(holding, info_field(other, "arena_bytes_in_use"))
          << "the old block was not freed (only the new value should remain)";
      Reply now = other.command({"DMA.GETPLAIN", "racing"});
      ASSERT_TRUE(now && now->type == REDIS_REPLY_STRING);
      EXPECT_EQ(as_string(new_value), std::string(now->str, now->len));
    }
  }
  ASSERT_TRUE(other.command({"DEL", "racing"}));
}

TEST_F(Module, a_dma_get_of_a_plain_string_is_copied_into_the_arena_and_freed_after) {
  // If this fails, DMA.GET of a key written by plain SET sends from Redis's own string (which a
  // later command may free while the write is on the wire), or leaks the copy.
  auto dma = client();
  ASSERT_TRUE(dma);
  Connection plain(port());
  const auto value = pattern(1 << 20, 8);
  ASSERT_TRUE(plain.command({"SET", "plain-copied", as_string(value)}));
  const long long copies = info_field(plain, "plain_string_copies");
  const long long in_use = info_field(plain, "arena_bytes_in_use");
  std::vector<std::byte> back(value.size());
  auto read = dma->get("plain-copied", back);
  ASSERT_TRUE(read && read->has_value());
  EXPECT_TRUE(back == value);
  EXPECT_EQ(copies + 1, info_field(plain, "plain_string_copies"));
  EXPECT_EQ(in_use, info_field(plain, "arena_bytes_in_use"));
}

// A server whose RDB lives in its own directory, for SAVE, DEBUG RELOAD and restarts.
class ModuleStorePersistence : public ::testing::Test {
 protected:
  void SetUp() override {
    directory_ = ::testing::TempDir() + "dma-store-" + std::to_string(::getpid()) + "-" +
                 ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::create_directories(directory_);
  }
  void TearDown() override { std::filesystem::remove_all(directory_); }
  std::unique_ptr<RedisServer> start(const std::vector<std::string>& more = {}) {
    std::vector<std::string> arguments = {"--dir", directory_, "--dbfilename", "store.rdb",
                                          "--enable-debug-command", "local"};
    arguments.insert(arguments.end(), more.begin(), more.end());
    return start_server({}, "tcp", arguments);
  }
  std::string directory_;
};

TEST_F(ModuleStorePersistence, save_restart_and_debug_reload_keep_every_value_and_its_crc) {
  // If this fails, SAVE, BGSAVE, DEBUG RELOAD or a restart loses a stored value, changes its
  // bytes, or forgets the CRC DMA.GET answers.
  const std::vector<std::size_t> sizes = {0, 1, 4096, std::size_t{1} << 20, std::size_t{16} << 20};
  auto expect_values = [&](int port, const std::string& when) {
    SCOPED_TRACE(when);
    auto made = Client::connect("127.0.0.1", port, loopback("tcp"));
    ASSERT_TRUE(made) << made.error().describe();
    ASSERT_TRUE((*made)->hello());
    Connection plain(port);
    for (std::size_t size : sizes) {
      const auto value = pattern(size, static_cast<std::uint32_t>(size) + 11);
      const std::string key = "kept-" + std::to_string(size);
      std::vector<std::byte> back(size);
      auto read = (*made)->get(key, back);  // checks the bytes against the CRC the server answers
      ASSERT_TRUE(read && read->has_value()) << key << ": " << (read ? "nil" : read.error().describe());
      EXPECT_TRUE(back == value) << key;
      Reply typed = plain.command({"TYPE", key});
      EXPECT_EQ("dma-value", std::string(typed->str, typed->len)) << key;
    }
  };
  {
    auto server = start();
    ASSERT_TRUE(server);
    auto made = Client::connect("127.0.0.1", server->port(), loopback("tcp"));
    ASSERT_TRUE(made && (*made)->hello());
    for (std::size_t size : sizes) {
      ASSERT_TRUE((*made)->set("kept-" + std::to_string(size),
                               pattern(size, static_cast<std::uint32_t>(size) + 11)));
    }
    Connection admin(server->port());
    Reply reloaded = admin.command({"DEBUG", "RELOAD"});
    ASSERT_TRUE(reloaded && reloaded->type == REDIS_REPLY_STATUS) << error_of(reloaded);
    expect_values(server->port(), "after DEBUG RELOAD");
    Reply saved = admin.command({"SAVE"});
    ASSERT_TRUE(saved && saved->type == REDIS_REPLY_STATUS) << error_of(saved);
    server->stop();
    expect_clean_log(server->log());
  }
  {
    auto server = start();
    ASSERT_TRUE(server);
    expect_values(server->port(), "after SAVE and a restart");
    Connection admin(server->port());
    Reply background = admin.command({"BGSAVE"});
    ASSERT_TRUE(background && background->type == REDIS_REPLY_STATUS) << error_of(background);
    auto persistence = [&] {
      Reply info = admin.command({"INFO", "persistence"});
      return std::string(info->str, info->len);
    };
    ASSERT_TRUE(eventually([&] { return contains(persistence(), "rdb_bgsave_in_progress:0"); }));
    EXPECT_TRUE(contains(persistence(), "rdb_last_bgsave_status:ok")) << persistence();
    server->stop();
  }
  auto server = start();
  ASSERT_TRUE(server);
  expect_values(server->port(), "after BGSAVE and a restart");
  server->stop();
  expect_clean_log(server->log());
}

TEST_F(ModuleStorePersistence, an_aof_rewrite_replays_every_value_on_restart) {
  // If this fails, a server persisting with AOF loses stored values at restart: the rewrite's
  // DMA.SETPLAIN commands are missing or replay other bytes.
  const auto value = pattern(300000, 5);
  {
    auto server = start({"--appendonly", "yes"});
    ASSERT_TRUE(server);
    Connection admin(server->port());
    ASSERT_EQ(2u, length_and_crc(admin.command({"DMA.SETPLAIN", "aof-kept", as_string(value)})).size());
    Reply rewrite = admin.command({"BGREWRITEAOF"});
    ASSERT_TRUE(rewrite && rewrite->type == REDIS_REPLY_STATUS) << error_of(rewrite);
    auto persistence = [&] {
      Reply info = admin.command({"INFO", "persistence"});
      return std::string(info->str, info->len);
    };
    ASSERT_TRUE(eventually([&] {
      const std::string text = persistence();
      return contains(text, "aof_rewrite_in_progress:0") && contains(text, "aof_rewrite_scheduled:0");
    }));
    EXPECT_TRUE(contains(persistence(), "aof_last_bgrewrite_status:ok")) << persistence();
    server->stop();
  }
  auto server = start({"--appendonly", "yes"});
  ASSERT_TRUE(server);
  Connection admin(server->port());
  Reply back = admin.command({"DMA.GETPLAIN", "aof-kept"});
  ASSERT_TRUE(back && back->type == REDIS_REPLY_STRING) << error_of(back) << server->log();
  EXPECT_EQ(as_string(value), std::string(back->str, back->len));
  server->stop();
  expect_clean_log(server->log());
}

TEST(ModuleStore, with_always_register_operands_a_steady_workload_makes_no_registration_and_no_context_allocation) {
  // If this fails, on a provider that needs local registration (efa, verbs) transfers register
  // their operands (fi_mr_reg: 300-500 us on efa) instead of using the arena's registration, or
  // every transfer takes its context from the heap instead of the free list.
  auto server = start_server({"always-register-operands", "true"});
  ASSERT_TRUE(server);
  Client::Options fabric_only;
  fabric_only.inline_max = 0;  // every value over the fabric, small ones included
  auto made = Client::connect("127.0.0.1", server->port(), loopback("tcp"), fabric_only);
  ASSERT_TRUE(made && (*made)->hello());
  auto& dma = *made;
  Connection plain(server->port());
  std::vector<std::byte> back(1 << 20);
  auto run = [&](int rounds) {
    for (int round = 0; round < rounds; ++round) {
      const std::size_t size = std::size_t{1} << (6 + round % 15);  // 64 B .. 1 MiB
      const auto value = pattern(size, static_cast<std::uint32_t>(round));
      ASSERT_TRUE(dma->set("steady-" + std::to_string(round % 4), value));
      auto read = dma->get("steady-" + std::to_string(round % 4), back);
      ASSERT_TRUE(read && read->has_value());
    }
  };
  run(8);  // warm-up
  const long long registrations = info_field(plain, "registrations");
  const long long transfers = info_field(plain, "transfers");
  const long long contexts = info_field(plain, "context_allocations");
  run(60);
  EXPECT_EQ(contexts, info_field(plain, "context_allocations"))
      << "transfer contexts were allocated in steady state";
  EXPECT_EQ(transfers + 120, info_field(plain, "transfers"));
  EXPECT_EQ(registrations, info_field(plain, "registrations"))
      << "transfers registered memory in steady state";
  Reply info = plain.command({"INFO", "dma"});
  EXPECT_TRUE(contains(std::string(info->str, info->len), "dma_registrations_per_op:0.0000"))
      << std::string(info->str, info->len);
  made->reset();
  server->stop();
  expect_clean_log(server->log());
}

TEST(ModuleStore, a_full_arena_and_an_oversized_value_are_refused_naming_the_limit_and_nothing_is_lost) {
  // If this fails, a SET the store cannot hold aborts the server, changes the key, or is
  // refused without naming the limit; or the values already stored are damaged.
  auto server = start_server({"arena-bytes", "33554432", "max-value-size", "20000000"});
  ASSERT_TRUE(server);
  auto made = Client::connect("127.0.0.1", server->port(), loopback("tcp"));
  ASSERT_TRUE(made && (*made)->hello());
  auto& dma = *made;
  Connection plain(server->port());
  const auto oversized = pattern(20000001, 1);
  Status too_big = dma->set("too-big", oversized);
  ASSERT_FALSE(too_big);
  EXPECT_TRUE(contains(too_big.error().message(), "max-value-size 20000000"))
      << too_big.error().message();
  EXPECT_TRUE(contains(error_of(plain.command({"DMA.SETPLAIN", "too-big", as_string(oversized)})),
                       "max-value-size 20000000"));
  std::vector<std::vector<std::byte>> stored;
  std::string refusal;
  for (int index = 0; index < 16 && refusal.empty(); ++index) {
    auto value = pattern(std::size_t{4} << 20, 100 + index);
    Status set = dma->set("fill-" + std::to_string(index), value);
    if (set) {
      stored.push_back(std::move(value));
    } else {
      refusal = set.error().message();
    }
  }
  ASSERT_FALSE(refusal.empty()) << "32 MiB held 64 MiB";
  EXPECT_TRUE(contains(refusal, "arena-bytes 33554432")) << refusal;
  EXPECT_GE(info_field(plain, "arena_refused"), 1);
  const std::string full = error_of(
      plain.command({"DMA.SETPLAIN", "fill-0", as_string(pattern(std::size_t{8} << 20, 9))}));
  EXPECT_TRUE(contains(full, "arena-bytes 33554432")) << full;
  Reply ping = plain.command({"PING"});
  ASSERT_TRUE(ping && ping->type == REDIS_REPLY_STATUS) << "the server died";
  for (std::size_t index = 0; index < stored.size(); ++index) {
    std::vector<std::byte> back(stored[index].size());
    auto read = dma->get("fill-" + std::to_string(index), back);
    ASSERT_TRUE(read && read->has_value()) << index;
    EXPECT_TRUE(back == stored[index]) << "a refused SET damaged fill-" << index;
  }
  // Room comes back when values go.
  ASSERT_TRUE(plain.command({"DEL", "fill-0", "fill-1"}));
  EXPECT_TRUE(dma->set("after-room", pattern(std::size_t{4} << 20, 7)));
  made->reset();
  server->stop();
  expect_clean_log(server->log());
}

// The VmFlags of the mapping of exactly `bytes` in process `pid`'s /proc/PID/smaps, or nullopt if
// it has none of that size.
std::optional<std::string> flags_of_mapping(long long pid, std::size_t bytes) {
  std::ifstream smaps("/proc/" + std::to_string(pid) + "/smaps");
  const std::string size_line = "Size: " + std::to_string(bytes >> 10) + " kB";
  bool in_match = false;
  for (std::string line; std::getline(smaps, line);) {
    if (line.rfind("Size:", 0) == 0) {
      std::istringstream fields(line);
      std::string label, unit;
      std::size_t kib = 0;
      fields >> label >> kib >> unit;
      in_match = kib == (bytes >> 10);
    } else if (in_match && line.rfind("VmFlags:", 0) == 0) {
      return line;
    }
  }
  return std::nullopt;
}

TEST(ModuleStore, the_arena_is_advised_onto_huge_pages_unless_arena_huge_pages_is_false) {
  // If this fails, the arena lost its MADV_HUGEPAGE advice (a 1 MiB DMA.GET on shm copies from
  // 4 KiB pages again; docs/PERFORMANCE.md, "Speed, fifth pass"), or the load argument that
  // turns it off for fork-heavy servers does nothing.
  constexpr std::size_t kArena = std::size_t{48} << 20;  // a size no other mapping has
  for (const bool huge : {true, false}) {
    SCOPED_TRACE(huge ? "arena-huge-pages true" : "arena-huge-pages false");
    auto server = start_server({"arena-bytes", std::to_string(kArena), "arena-huge-pages",
                                huge ? "true" : "false"});
    ASSERT_TRUE(server);
    Connection plain(server->port());
    const long long pid = plain.info_number("server", "process_id");
    ASSERT_GT(pid, 0);
    EXPECT_EQ(huge ? 1 : 0, info_field(plain, "arena_huge_pages"));
    // VM_HUGEPAGE ("hg") is what MADV_HUGEPAGE sets, whatever the system's THP mode.
    const std::optional<std::string> flags = flags_of_mapping(pid, kArena);
    if (huge) {
      ASSERT_TRUE(flags) << "no 48 MiB mapping in the server: where is the arena?";
      EXPECT_TRUE(contains(*flags + " ", " hg ")) << *flags;
    } else if (flags) {
      EXPECT_FALSE(contains(*flags + " ", " hg ")) << *flags;
    }
    // Values round-trip either way.
    auto made = Client::connect("127.0.0.1", server->port(), loopback("tcp"));
    ASSERT_TRUE(made && (*made)->hello());
    const auto value = pattern(std::size_t{3} << 20, huge ? 1 : 2);
    ASSERT_TRUE((*made)->set("huge", value));
    std::vector<std::byte> back(value.size());
    auto read = (*made)->get("huge", back);
    ASSERT_TRUE(read && read->has_value());
    EXPECT_TRUE(back == value);
    made->reset();
    server->stop();
    expect_clean_log(server->log());
  }
}

}  // namespace
}  // namespace dma::testing
