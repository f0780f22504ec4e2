// The module's commands end to end: a real redis-server loading build/lib/dma.so, real
// dma::Client and raw hiredis connections, the tcp provider over loopback. DMA.GET/DMA.SET move
// the bytes they should, refuse what they should with the reason, and report what they did; the
// module's load arguments and its services are checked here too.
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "child_process.hpp"
#include "core.hpp"
#include "module_fixtures.hpp"

namespace dma::testing {
namespace {

TEST_F(Module, set_then_get_round_trips_every_size) {
  // If this fails, the core promise is broken: what DMA.SET stores is not what DMA.GETPLAIN and
  // DMA.GET return byte for byte, from an empty value to 64 MiB.
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
    Reply got = plain.command({"DMA.GETPLAIN", key});
    ASSERT_TRUE(got);
    ASSERT_EQ(REDIS_REPLY_STRING, got->type);
    ASSERT_EQ(size, got->len);
    EXPECT_TRUE(size == 0 || std::memcmp(got->str, value.data(), size) == 0)
        << "DMA.GETPLAIN must return the bytes read";
    std::vector<std::byte> buffer(size + 16, std::byte{0x5a});
    auto read = dma->get(key, buffer);
    ASSERT_TRUE(read) << read.error().describe();
    ASSERT_TRUE(read->has_value());
    ASSERT_EQ(size, **read);
    EXPECT_TRUE(size == 0 || std::memcmp(buffer.data(), value.data(), size) == 0);
    EXPECT_EQ(std::byte{0x5a}, buffer[size]) << "nothing may be written past the value";
  }
}

TEST_F(Module, a_busy_polling_client_moves_the_same_bytes_and_its_target_sleeps_after) {
  // If this fails, Client::Options::busy_poll changes what a client reads or writes, or leaves
  // its target polling after the reply (a whole core per idle client).
  Client::Options options;
  options.busy_poll = true;
  auto made = Client::connect("127.0.0.1", port(), loopback("tcp"), options);
  ASSERT_TRUE(made) << made.error().describe();
  auto& dma = *made;
  Status hello = dma->hello();
  ASSERT_TRUE(hello) << hello.error().describe();
  for (std::size_t size : {std::size_t{4096}, std::size_t{1} << 20}) {
    const std::string key = "busy-" + std::to_string(size);
    const auto value = pattern(size, static_cast<std::uint32_t>(size));
    Status stored = dma->set(key, value);
    ASSERT_TRUE(stored) << stored.error().describe();
    std::vector<std::byte> back(size);
    auto got = dma->get(key, back);
    ASSERT_TRUE(got && got->has_value()) << (got ? "nil" : got.error().describe());
    EXPECT_TRUE(back == value);
  }
  // Replies in: the default 50 us poll interval again, so at most a few polls per ms.
  const std::uint64_t after = dma->target().progress_polls();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_LT(dma->target().progress_polls() - after, 5000u) << "the target kept busy polling";
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
    Reply got = plain.command({"DMA.GETPLAIN", "exposed-once"});
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
  Reply kept = plain.command({"DMA.GETPLAIN", "exposed-once"});
  ASSERT_TRUE(kept && kept->type == REDIS_REPLY_STRING);
  EXPECT_EQ(257u * 128, kept->len) << "a refused SET changed the key";
}

TEST_F(Module, dma_get_returns_a_value_stored_by_plain_set) {
  // If this fails, values written by ordinary clients (integer-encoded ones included) cannot be
  // read over DMA.
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
  // If this fails, a missing key reads as an empty value or an error instead of nil.
  auto dma = client();
  ASSERT_TRUE(dma);
  std::vector<std::byte> buffer(16);
  auto read = dma->get("no-such-key", buffer);
  ASSERT_TRUE(read) << read.error().describe();
  EXPECT_FALSE(read->has_value());
}

TEST_F(Module, dma_get_of_a_list_is_wrongtype) {
  // If this fails, DMA.GET of a value that is not a string moves other bytes or fails without the
  // usual WRONGTYPE: only strings have bytes to move.
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
  // If this fails, bytes that do not match the client's checksum replace a good value.
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
  value = connection->command({"DMA.GETPLAIN", "guarded"});
  EXPECT_EQ(as_string(bytes), std::string(value->str, value->len));
}

TEST_F(Module, multi_region_transfers_fill_and_drain_regions_in_order) {
  // If this fails, a value spread over several regions lands in (or is read from) them out of the
  // order given, or a region is not filled before the next.
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
  Reply back = connection->command({"DMA.GETPLAIN", "spread-back"});
  ASSERT_TRUE(back && back->type == REDIS_REPLY_STRING);
  EXPECT_EQ(as_string(value), std::string(back->str, back->len));
}

TEST_F(Module, a_command_with_more_arguments_than_redis_send_keeps_on_its_stack_goes_out_whole) {
  // If this fails, redis::send (every command of dma::Client and of the tools) drops or mixes
  // up arguments past the ones it keeps on its stack (16), as a DMA.SET over many regions has.
  Connection connection(port());
  ASSERT_TRUE(connection.ok());
  for (const std::size_t count : {std::size_t{15}, std::size_t{16}, std::size_t{17}, std::size_t{40}}) {
    const std::string key = "many-arguments-" + std::to_string(count);
    std::vector<std::string> command = {"RPUSH", key};
    for (std::size_t index = 0; index + 2 < count; ++index) {
      command.push_back("element-" + std::to_string(index));
    }
    ASSERT_EQ(count, command.size());
    Reply pushed = connection.command(command);
    ASSERT_TRUE(pushed && pushed->type == REDIS_REPLY_INTEGER) << error_of(pushed);
    EXPECT_EQ(static_cast<long long>(count - 2), pushed->integer);
    Reply listed = connection.command({"LRANGE", key, "0", "-1"});
    ASSERT_TRUE(listed && listed->type == REDIS_REPLY_ARRAY) << error_of(listed);
    ASSERT_EQ(count - 2, listed->elements);
    for (std::size_t index = 0; index < listed->elements; ++index) {
      EXPECT_EQ(command[index + 2],
                std::string(listed->element[index]->str, listed->element[index]->len));
    }
  }
}

TEST_F(Module, several_clients_at_once_each_get_their_own_values) {
  // If this fails, concurrent clients see each other's bytes: sessions are not per connection.
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
  // If this fails, DMA.GET delivers bytes the next command freed or rewrote while its write was
  // still on the wire, instead of the value as it was when DMA.GET ran.
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
  const long long transfers = info_field(other, "transfers");
  connection->send(command);
  // Once the server has taken the DMA.GET (its transfer submitted: commands on two connections
  // may be read in either order), these run while its write is in flight or after it.
  ASSERT_TRUE(eventually([&] { return info_field(other, "transfers") > transfers; }));
  ASSERT_TRUE(other.command({"SET", "changing", as_string(pattern(size, 22))}));
  ASSERT_TRUE(other.command({"DEL", "changing"}));
  Reply got = connection->receive();
  ASSERT_TRUE(got && got->type == REDIS_REPLY_ARRAY) << error_of(got);
  EXPECT_EQ(static_cast<long long>(size), got->element[0]->integer);
  EXPECT_EQ(static_cast<long long>(crc32c(old_value)), got->element[1]->integer);
  EXPECT_TRUE(memory == old_value);
}

TEST_F(Module, transfers_without_a_hello_are_refused) {
  // If this fails, a connection without a session reaches the fabric, where the server has no
  // address to write to.
  Connection connection(port());
  EXPECT_TRUE(contains(error_of(connection.command({"DMA.GET", "k", "1", "0", "8"})), "no session"));
  EXPECT_TRUE(contains(error_of(connection.command({"DMA.SET", "k", "8", "1", "0", "8"})),
                       "no session"));
}

TEST_F(Module, every_malformed_command_is_refused_naming_its_fault_and_writes_nothing) {
  // If this fails, a malformed argument reaches the fabric, or its refusal does not name what is
  // wrong with it.
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
  const std::string max = std::to_string(module::kDefaultMaxValueSize);
  const std::vector<Case> cases = {
      {{"DMA.GET", "hundred", key, base}, "wrong number of arguments"},
      {{"DMA.GET", "hundred", key, base, "10", "1"}, "wrong number of arguments"},
      {{"DMA.SET", "hundred", "5", key, base}, "wrong number of arguments"},
      {{"DMA.HELLO"}, "wrong number of arguments"},
      {{"DMA.INFO", "extra"}, "wrong number of arguments"},
      {{"DMA.GET", "hundred", "abc", base, "100"}, "rkey \"abc\" is not a decimal number"},
      {{"DMA.GET", "hundred", key, "-1", "100"}, "addr \"-1\" is not a decimal number"},
      {{"DMA.GET", "hundred", key, base, "18446744073709551616"},
       "len \"18446744073709551616\" does not fit in 64 bits"},
      {{"DMA.GET", "hundred", key, base, "+100"}, "len \"+100\" is not a decimal number"},
      {{"DMA.GET", "hundred", key, base, "0"}, "region 0 has zero length"},
      {{"DMA.GET", "hundred", key, "18446744073709551615", "2"},
       "region 0 overflows the address space"},
      {{"DMA.GET", "hundred", key, base, "50"}, "hold 50 bytes, fewer than the value's 100"},
      {{"DMA.SET", "hundred", "100", key, base, "50"},
       "regions hold 50 bytes, fewer than the 100 to read"},
      {{"DMA.SET", "hundred", "x", key, base, "50"}, "length \"x\" is not a decimal number"},
      {{"DMA.SET", "hundred", "10", "CRC", "4294967296", key, base, "50"},
       "crc32c 4294967296 does not fit in 32 bits"},
      {{"DMA.SET", "hundred", "10", "CRC", "-1", key, base, "50"},
       "crc32c \"-1\" is not a decimal number"},
      {{"DMA.SET", "hundred", std::to_string(module::kDefaultMaxValueSize + 1), key, base, "4096"},
       "length " + std::to_string(module::kDefaultMaxValueSize + 1) + " exceeds max-value-size " +
           max},
      {too_many, "257 regions; at most 256 are allowed"},
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
  // If this fails, a DMA.SET whose read fails (here: a key the target never exposed) changes the
  // key.
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
  // The provider's reason follows ("Operation canceled" on tcp); the module's part is fixed.
  EXPECT_TRUE(contains(error_of(failed), "ERR fabric: read from peer failed")) << error_of(failed);
  Reply value = connection->command({"GET", "kept"});
  ASSERT_TRUE(value && value->type == REDIS_REPLY_STRING);
  EXPECT_EQ("before", std::string(value->str, value->len));
}

TEST_F(Module, transfers_inside_multi_are_refused_with_the_reason) {
  // If this fails, a blocking command inside MULTI never gets its reply (the connection hangs)
  // instead of being refused with the reason.
  auto target = open_target();
  ASSERT_TRUE(target);
  auto connection = session(*target);
  ASSERT_TRUE(connection->command({"MULTI"}));
  connection->command({"DMA.GET", "anything", "1", "0", "8"});
  Reply executed = connection->command({"EXEC"});
  ASSERT_TRUE(executed && executed->type == REDIS_REPLY_ARRAY);
  ASSERT_EQ(1u, executed->elements);
  ASSERT_EQ(REDIS_REPLY_ERROR, executed->element[0]->type);
  const std::string error(executed->element[0]->str, executed->element[0]->len);
  EXPECT_TRUE(contains(
      error, "DMA transfers block their client; they cannot run inside MULTI or a script"))
      << error;
}

TEST_F(Module, info_reports_sessions_and_traffic) {
  // If this fails, operators lose the counters: INFO dma and DMA.INFO no longer report sessions and
  // bytes moved.
  auto dma = client();
  ASSERT_TRUE(dma);
  // Above inline-max, so it crosses the fabric and counts as a transfer.
  ASSERT_TRUE(dma->set("counted", pattern(module::kDefaultInlineMax + 1000, 5)));
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
  // If this fails, people at a shell cannot move a file through the module with dma-cli set and get
  // byte for byte, visible to plain GET.
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
  // If this fails, an oversized SET reads or allocates before it is refused, does not name the
  // limit it hit and its value, or changes the stored value.
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
  // If this fails, a GET that does not fit writes a prefix (or past the region) over whatever the
  // client keeps next to it, instead of being refused before the write.
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

TEST(ModuleLoad, a_bad_module_argument_fails_the_load_and_names_it) {
  // If this fails, a typo in the module's arguments lets the server run with a silently different
  // configuration, or stops it at startup without naming the argument.
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
    RedisServer::Options options = server_options();
    options.module_arguments = bad.arguments;
    auto exit = RedisServer::run_to_exit(options);
    ASSERT_TRUE(exit) << "the server kept running: " << exit.error().describe();
    EXPECT_NE(0, exit->status) << exit->log;
    EXPECT_TRUE(contains(exit->log, bad.expect)) << exit->log;
  }
}

TEST(ModuleServices, several_services_share_the_load_and_a_custom_limit_holds) {
  // If this fails, with services-per-domain 2 a hello does not name both endpoints, transfers do
  // not spread over them (balancing by outstanding work), or max-value-size is not the configured
  // one.
  auto server = start_server({"services-per-domain", "2", "interfaces", "lo",
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

}  // namespace
}  // namespace dma::testing
