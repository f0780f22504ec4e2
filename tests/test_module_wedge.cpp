// The module through a real wedge: a shm endpoint wedged by a write shm never completes is
// replaced under the server while another client's DMA.GET waits behind it; that client and an
// idle one say hello again by themselves and are served. Real redis-server, shm on loopback.
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <cstring>
#include <thread>

#include "module_fixtures.hpp"

namespace dma::testing {
namespace {

using namespace std::chrono_literals;

std::vector<std::byte> bytes_of(std::size_t length, unsigned seed) {
  std::vector<std::byte> value(length);
  for (std::size_t index = 0; index < length; ++index) {
    value[index] = std::byte(static_cast<unsigned char>(index * 31 + seed));
  }
  return value;
}

TEST(ModuleReplacement, a_wedged_shm_endpoint_is_replaced_and_clients_say_hello_again_by_themselves) {
  // If this fails, one client whose write shm never completes costs every later DMA.GET on the
  // server's endpoint until the server restarts, or the replacement leaves clients with a
  // session to addresses that are gone.
  auto server = start_server({"completion-deadline-ms", "300"}, "shm");
  ASSERT_TRUE(server);
  const Configuration configuration = loopback("shm");

  // `idle` says hello before the wedge and sends nothing until after the replacement.
  auto idle = Client::connect("127.0.0.1", server->port(), configuration);
  ASSERT_TRUE(idle) << idle.error().describe();
  ASSERT_TRUE((*idle)->hello());
  auto busy = Client::connect("127.0.0.1", server->port(), configuration);
  ASSERT_TRUE(busy) << busy.error().describe();
  ASSERT_TRUE((*busy)->hello());
  const std::vector<std::byte> stored = bytes_of(65536, 3);  // over inline-max: over the fabric
  ASSERT_TRUE((*busy)->set("fine", stored));

  // The wedge: 64 bytes exposed, 4096 claimed (docs/PROVIDERS.md, "shm").
  auto target = Target::open(configuration);
  ASSERT_TRUE(target) << target.error().describe();
  Connection raw(server->port());
  ASSERT_TRUE(raw.ok());
  Status proven = hello_and_prove(raw, **target);
  ASSERT_TRUE(proven) << proven.error().describe();
  ASSERT_TRUE(raw.command({"SET", "stuck", std::string(4096, 'v')}));
  std::vector<std::byte> memory(8192);
  auto exposed = (*target)->expose(memory.data(), 64);
  ASSERT_TRUE(exposed);
  raw.send(with_region({"DMA.GET", "stuck"}, exposed->region(0, 4096)));
  std::this_thread::sleep_for(50ms);  // posted before the GET below

  // This GET's write is posted behind the wedged one: the endpoint is replaced under it, and
  // the client says hello again and gets the value anyway.
  std::vector<std::byte> back(stored.size());
  auto got = (*busy)->get("fine", back);
  if (!got) {
    // Under a slow build (tsan) this write can pass its own completion deadline in the same
    // scan as the wedged one, and fail as timed out (not retried) before the replacement: the
    // next GET must then be served on the new endpoint.
    EXPECT_TRUE(contains(got.error().describe(), "completion deadline")) << got.error().describe();
    got = (*busy)->get("fine", back);
  }
  ASSERT_TRUE(got) << got.error().describe();
  ASSERT_TRUE(got->has_value());
  EXPECT_EQ(stored, back);
  Reply stuck = raw.receive();
  ASSERT_TRUE(stuck && stuck->type == REDIS_REPLY_ERROR);
  EXPECT_TRUE(contains(error_of(stuck), "completion deadline")) << error_of(stuck);

  Connection info(server->port());
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(1, info.info_field("endpoint_replacements"));

  // The idle client's session predates the replacement: REHELLO, then served.
  std::vector<std::byte> again(stored.size());
  auto idle_got = (*idle)->get("fine", again);
  ASSERT_TRUE(idle_got) << idle_got.error().describe();
  EXPECT_EQ(stored, again);
  EXPECT_GE(info.info_field("rehellos"), 2);
  // And a DMA.SET through a client that had to say hello again.
  const std::vector<std::byte> other = bytes_of(65536, 9);
  ASSERT_TRUE((*idle)->set("fine", other));
  Reply plain = info.command({"DMA.GETPLAIN", "fine"});
  ASSERT_TRUE(plain && plain->type == REDIS_REPLY_STRING);
  ASSERT_EQ(other.size(), plain->len);
  EXPECT_EQ(0, std::memcmp(other.data(), plain->str, other.size()));

  // A client without our library sees the REHELLO reply itself (its session is from before).
  std::vector<std::byte> landing(stored.size());
  auto whole = (*target)->expose(landing.data(), landing.size());
  ASSERT_TRUE(whole);
  Reply stale = raw.command(with_region({"DMA.GET", "fine"}, whole->whole()));
  ASSERT_TRUE(stale && stale->type == REDIS_REPLY_ERROR);
  EXPECT_EQ(0u, error_of(stale).rfind("REHELLO", 0)) << error_of(stale);

  idle->reset();
  busy->reset();
  raw.close();
  info.close();
  EXPECT_EQ(0, server->stop()) << "the server did not exit 0 after a replacement";
  expect_clean_log(server->log());
}

}  // namespace
}  // namespace dma::testing
