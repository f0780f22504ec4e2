// Small values go inline: a DMA.GET ... INLINE answers a value of at most inline-max bytes in its
// reply and dma::Client sets such values with DMA.SETPLAIN, so a 4 KiB value costs one socket
// round trip instead of exposing a buffer and a one-sided transfer; larger values still cross
// the fabric. Real redis-servers with the module, tcp over loopback.
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include "core.hpp"
#include "module_fixtures.hpp"

namespace dma::testing {
namespace {

constexpr std::size_t kInline = module::kDefaultInlineMax;

struct Traffic {
  long long inline_gets, transfers_to_clients, plain_sets, transfers_from_clients;
};
Traffic traffic(Connection& connection) {
  return {info_field(connection, "inline_gets"), info_field(connection, "transfers_to_clients"),
          info_field(connection, "plain_sets"), info_field(connection, "transfers_from_clients")};
}

TEST_F(Module, values_up_to_inline_max_travel_in_the_reply_and_larger_ones_over_the_fabric) {
  // If this fails, small values pay for a buffer exposure and a transfer (slower than the
  // socket they replace), large ones are pushed through the socket, or a value changes on
  // either path.
  auto dma = client();
  ASSERT_TRUE(dma);
  EXPECT_EQ(kInline, dma->inline_max()) << "the client did not learn the server's inline-max";
  Connection plain(port());
  for (std::size_t size : {std::size_t{0}, std::size_t{1}, std::size_t{4096}, kInline,
                           kInline + 1, std::size_t{1} << 20}) {
    SCOPED_TRACE("size " + std::to_string(size));
    const bool inline_path = size <= kInline;
    const std::string key = "inline-" + std::to_string(size);
    const auto value = pattern(size, static_cast<std::uint32_t>(size) + 3);
    const Traffic before = traffic(plain);
    ASSERT_TRUE(dma->set(key, value));
    std::vector<std::byte> back(size, std::byte{0x5a});
    auto read = dma->get(key, back);
    ASSERT_TRUE(read && read->has_value()) << (read ? "nil" : read.error().describe());
    EXPECT_EQ(size, **read);
    EXPECT_TRUE(back == value);
    EXPECT_EQ(crc32c(value), dma->last_checksum())
        << "last_checksum() is not the CRC32C the value was checked against";
    // The same through buffers exposed once, as a server-heavy client keeps them.
    std::vector<std::byte> landing(size + 64, std::byte{0});
    auto exposed = dma->target().expose(landing.data(), landing.size());
    ASSERT_TRUE(exposed);
    auto again = dma->get(key, *exposed);
    ASSERT_TRUE(again && again->has_value()) << (again ? "nil" : again.error().describe());
    EXPECT_EQ(size, **again);
    EXPECT_TRUE(std::equal(value.begin(), value.end(), landing.begin()));
    EXPECT_EQ(crc32c(value), dma->last_checksum());
    const Traffic after = traffic(plain);
    EXPECT_EQ(inline_path ? 2 : 0, after.inline_gets - before.inline_gets);
    EXPECT_EQ(inline_path ? 0 : 2, after.transfers_to_clients - before.transfers_to_clients);
    EXPECT_EQ(inline_path ? 1 : 0, after.plain_sets - before.plain_sets);
    EXPECT_EQ(inline_path ? 0 : 1, after.transfers_from_clients - before.transfers_from_clients);
    Reply stored = plain.command({"DMA.GETPLAIN", key});
    ASSERT_TRUE(stored && stored->type == REDIS_REPLY_STRING) << error_of(stored);
    EXPECT_EQ(as_string(value), std::string(stored->str, stored->len));
  }
}

TEST_F(Module, a_buffer_too_small_for_an_inline_value_is_refused_naming_both_sizes_and_left_untouched) {
  // If this fails, a short buffer silently gets a truncated value (or bytes past its end), or
  // the caller cannot tell how large a buffer the value needs.
  auto dma = client();
  ASSERT_TRUE(dma);
  ASSERT_TRUE(dma->set("inline-short", pattern(3000, 9)));
  std::vector<std::byte> small(1000, std::byte{0x11});
  auto read = dma->get("inline-short", small);
  ASSERT_FALSE(read);
  EXPECT_EQ(ErrorCode::kInvalidArgument, read.error().code());
  EXPECT_TRUE(contains(read.error().message(), "3000")) << read.error().describe();
  EXPECT_TRUE(contains(read.error().message(), "1000")) << read.error().describe();
  EXPECT_TRUE(std::all_of(small.begin(), small.end(), [](std::byte b) { return b == std::byte{0x11}; }))
      << "a refused GET wrote into the buffer";
  EXPECT_FALSE(dma->last_checksum()) << "a refused GET left the previous GET's checksum";
  auto missing = dma->get("inline-never-set", small);
  ASSERT_TRUE(missing) << missing.error().describe();
  EXPECT_FALSE(missing->has_value());
  EXPECT_FALSE(dma->last_checksum()) << "a GET that found no key has no checksum";
}

TEST_F(Module, a_whole_value_and_its_length_are_read_without_the_caller_sizing_a_buffer) {
  // If this fails, a client that does not know a value's size (Python's get(key)) cannot read
  // it, or reads the wrong bytes when it is larger than inline-max.
  auto dma = client();
  ASSERT_TRUE(dma);
  for (std::size_t size : {std::size_t{0}, std::size_t{10}, kInline + 1, std::size_t{3} << 20}) {
    SCOPED_TRACE("size " + std::to_string(size));
    const std::string key = "whole-" + std::to_string(size);
    const auto value = pattern(size, static_cast<std::uint32_t>(size) + 11);
    ASSERT_TRUE(dma->set(key, value));
    auto length = dma->length(key);
    ASSERT_TRUE(length && length->has_value()) << (length ? "nil" : length.error().describe());
    EXPECT_EQ(size, **length);
    auto whole = dma->get(key);
    ASSERT_TRUE(whole && whole->has_value()) << (whole ? "nil" : whole.error().describe());
    EXPECT_TRUE(**whole == value);
    // Each size after a different one: a get(key) that leaves the previous checksum fails.
    EXPECT_EQ(crc32c(value), dma->last_checksum())
        << "get(key) did not record the CRC32C its value was checked against";
  }
  auto absent = dma->get("whole-never-set");
  ASSERT_TRUE(absent) << absent.error().describe();
  EXPECT_FALSE(absent->has_value());
  EXPECT_FALSE(dma->last_checksum()) << "a get(key) that found no key has no checksum";
  auto no_length = dma->length("whole-never-set");
  ASSERT_TRUE(no_length) << no_length.error().describe();
  EXPECT_FALSE(no_length->has_value());
}

TEST_F(Module, the_inline_form_answers_only_length_and_crc_for_a_value_above_its_limit) {
  // If this fails, DMA.GET ... INLINE puts more than the client (or inline-max) allows into its
  // reply, answers a plain string with a wrong CRC, or needs a session it should not skip.
  auto target = open_target();
  ASSERT_TRUE(target);
  auto connection = session(*target);
  Connection plain(port());
  const auto value = pattern(5000, 21);
  ASSERT_TRUE(plain.command({"DMA.SETPLAIN", "inline-raw", as_string(value)}));
  ASSERT_TRUE(plain.command({"SET", "inline-string", as_string(value)}));
  const std::string size = std::to_string(value.size());
  const std::string crc = std::to_string(crc32c(value));
  for (const std::string key : {"inline-raw", "inline-string"}) {
    SCOPED_TRACE(key);
    Reply within = connection->command({"DMA.GET", key, "INLINE", "5000"});
    ASSERT_TRUE(within && within->type == REDIS_REPLY_ARRAY && within->elements == 3)
        << error_of(within);
    EXPECT_EQ(size, std::to_string(within->element[0]->integer));
    EXPECT_EQ(crc, std::to_string(within->element[1]->integer));
    EXPECT_EQ(as_string(value), std::string(within->element[2]->str, within->element[2]->len));
    Reply above = connection->command({"DMA.GET", key, "INLINE", "4999"});
    ASSERT_TRUE(above && above->type == REDIS_REPLY_ARRAY && above->elements == 2)
        << error_of(above);
    EXPECT_EQ(size, std::to_string(above->element[0]->integer));
    EXPECT_EQ(crc, std::to_string(above->element[1]->integer));
  }
  // The server's inline-max caps what the client asks for.
  const auto large = pattern(kInline + 1, 22);
  ASSERT_TRUE(plain.command({"DMA.SETPLAIN", "inline-large", as_string(large)}));
  Reply capped = connection->command({"DMA.GET", "inline-large", "INLINE", "100000000"});
  ASSERT_TRUE(capped && capped->type == REDIS_REPLY_ARRAY && capped->elements == 2)
      << error_of(capped);
  Reply nil = connection->command({"DMA.GET", "inline-absent", "INLINE", "100"});
  ASSERT_TRUE(nil);
  EXPECT_EQ(REDIS_REPLY_NIL, nil->type);
  EXPECT_TRUE(contains(error_of(plain.command({"DMA.GET", "inline-raw", "INLINE", "100"})),
                       "no session on this connection"))
      << "an inline GET skipped the session check";
  EXPECT_TRUE(contains(error_of(connection->command({"DMA.GET", "inline-raw", "INLINE", "x"})),
                       "inline length \"x\" is not a decimal number"));
  EXPECT_TRUE(contains(error_of(connection->command({"DMA.GET", "inline-raw", "INLINE", "9", "1"})),
                       "wrong number of arguments"));
  // An inline answer never blocks, so it may run inside MULTI; a transfer may not.
  ASSERT_TRUE(connection->command({"MULTI"}));
  connection->command({"DMA.GET", "inline-raw", "INLINE", "5000"});
  connection->command({"DMA.GET", "inline-large", "INLINE", "5000", "1", "0", "100000"});
  Reply executed = connection->command({"EXEC"});
  ASSERT_TRUE(executed && executed->type == REDIS_REPLY_ARRAY && executed->elements == 2)
      << error_of(executed);
  EXPECT_EQ(3u, executed->element[0]->elements);
  ASSERT_EQ(REDIS_REPLY_ERROR, executed->element[1]->type);
  EXPECT_TRUE(contains(std::string(executed->element[1]->str, executed->element[1]->len),
                       "cannot run inside MULTI"));
}

TEST(ModuleInline, inline_max_zero_sends_every_value_over_the_fabric) {
  // If this fails, an operator who turns inline values off (inline-max 0) still gets values in
  // replies, or the client ignores the server's limit.
  auto server = start_server({"inline-max", "0"});
  ASSERT_TRUE(server);
  auto made = Client::connect("127.0.0.1", server->port(), loopback("tcp"));
  ASSERT_TRUE(made && (*made)->hello());
  auto& dma = *made;
  EXPECT_EQ(0u, dma->inline_max());
  Connection plain(server->port());
  const auto value = pattern(100, 31);
  ASSERT_TRUE(dma->set("fabric-only", value));
  std::vector<std::byte> back(100);
  auto read = dma->get("fabric-only", back);
  ASSERT_TRUE(read && read->has_value()) << (read ? "nil" : read.error().describe());
  EXPECT_TRUE(back == value);
  EXPECT_EQ(0, info_field(plain, "inline_gets"));
  EXPECT_EQ(0, info_field(plain, "plain_sets"));
  EXPECT_EQ(1, info_field(plain, "transfers_to_clients"));
  EXPECT_EQ(1, info_field(plain, "transfers_from_clients"));
  made->reset();
  server->stop();
  expect_clean_log(server->log());
}

}  // namespace
}  // namespace dma::testing
