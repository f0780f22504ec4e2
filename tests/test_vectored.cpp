// Vectored transfers and several clients: one transfer naming many remote regions, split into
// pieces, against real targets on tcp, net and shm over loopback.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <deque>

#include "dma/service.hpp"
#include "dma/target.hpp"
#include "fixtures.hpp"
#include "worker/post_hook.hpp"

namespace dma {
namespace {

using testing::Buffer;
using testing::Collector;
using testing::pattern;

// One client: a target with some exposed buffers.
struct Client {
  std::unique_ptr<Target> target;
  std::vector<std::unique_ptr<std::vector<std::byte>>> buffers;
  std::deque<Exposed> exposed;  // a deque: references stay valid as buffers are added

  static Client open(const Configuration& configuration) {
    Client client;
    auto target = Target::open(configuration);
    EXPECT_TRUE(target) << target.error().describe();
    if (target) client.target = std::move(*target);
    return client;
  }
  Exposed& expose(std::size_t length, std::uint32_t seed) {
    buffers.push_back(std::make_unique<std::vector<std::byte>>(pattern(length, seed)));
    auto region = target->expose(buffers.back()->data(), length);
    EXPECT_TRUE(region) << region.error().describe();
    exposed.push_back(std::move(*region));
    return exposed.back();
  }
  std::vector<std::byte>& bytes(std::size_t index) { return *buffers[index]; }
  FabricAddress address() const { return testing::address_of(target->local_address()); }
};

class Vectored : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    configuration_ = testing::loopback(GetParam());
    // Small pieces, so one region needs several and piece ends fall at odd places.
    configuration_.max_piece_bytes = 1000;
    auto service = FabricService::start(configuration_, collector_.completer(), nullptr);
    ASSERT_TRUE(service) << service.error().describe();
    service_ = std::move(*service);
  }
  void TearDown() override { service_.reset(); }

  Outcome run(TransferRequest request) {
    request.want_checksum = true;
    EXPECT_TRUE(service_->submit(std::move(request)));
    auto finished = collector_.wait_for(1);
    if (finished.size() != 1) return fail(ErrorCode::kTimedOut, "no completion");
    last_context_ = std::move(finished[0].context);
    return std::move(finished[0].outcome);
  }

  Configuration configuration_;
  Collector collector_;
  std::unique_ptr<FabricService> service_;
  std::unique_ptr<Operands> last_context_;
};

TEST_P(Vectored, a_value_spread_over_regions_lands_in_order_and_reads_back_whole) {
  // A GET into several regions must fill them in the order named, each from the right part of
  // the value, across piece and region boundaries; a SET from them must reassemble the value.
  Client client = Client::open(configuration_);
  ASSERT_TRUE(client.target);
  Exposed& a = client.expose(1500, 1);
  Exposed& b = client.expose(3001, 2);
  Exposed& c = client.expose(5000, 3);
  const std::vector<RemoteRegion> regions = {a.whole(), c.region(100, 2500), b.whole()};
  const std::size_t total = 1500 + 2500 + 3001;
  const auto value = pattern(total, 4);

  TransferRequest write;
  write.client_id = 1;
  write.peer_address = client.address();
  for (const auto& region : regions) write.regions.push_back(region);
  write.direction = Direction::kToPeer;
  write.context = std::make_unique<Buffer>(value);
  Outcome wrote = run(std::move(write));
  ASSERT_TRUE(wrote) << wrote.error().describe();
  EXPECT_EQ(total, wrote->bytes);
  EXPECT_EQ(crc32c(value), wrote->checksum.value());
  EXPECT_EQ(0, std::memcmp(client.bytes(0).data(), value.data(), 1500));
  EXPECT_EQ(0, std::memcmp(client.bytes(2).data() + 100, value.data() + 1500, 2500));
  EXPECT_EQ(0, std::memcmp(client.bytes(1).data(), value.data() + 4000, 3001));
  const auto untouched = pattern(5000, 3);
  EXPECT_EQ(0, std::memcmp(client.bytes(2).data(), untouched.data(), 100))
      << "bytes before the region must be left alone";
  EXPECT_EQ(0, std::memcmp(client.bytes(2).data() + 2600, untouched.data() + 2600, 2400))
      << "bytes after the region must be left alone";

  TransferRequest read;
  read.client_id = 1;
  read.peer_address = client.address();
  for (const auto& region : regions) read.regions.push_back(region);
  read.direction = Direction::kFromPeer;
  read.length = total;
  read.context = std::make_unique<Buffer>();
  Outcome got = run(std::move(read));
  ASSERT_TRUE(got) << got.error().describe();
  EXPECT_TRUE(testing::buffer_of(last_context_)->bytes == value);
  EXPECT_EQ(crc32c(value), got->checksum.value());
}

TEST_P(Vectored, regions_larger_than_the_value_receive_only_the_value) {
  // Clients advertise buffers sized for the largest value; a smaller value must write only its
  // own bytes, from the start of the first region.
  Client client = Client::open(configuration_);
  ASSERT_TRUE(client.target);
  Exposed& a = client.expose(2000, 5);
  Exposed& b = client.expose(2000, 6);
  const auto value = pattern(2500, 7);
  TransferRequest write;
  write.client_id = 1;
  write.peer_address = client.address();
  write.regions.push_back(a.whole());
  write.regions.push_back(b.whole());
  write.context = std::make_unique<Buffer>(value);
  Outcome wrote = run(std::move(write));
  ASSERT_TRUE(wrote) << wrote.error().describe();
  EXPECT_EQ(2500u, wrote->bytes);
  EXPECT_EQ(0, std::memcmp(client.bytes(0).data(), value.data(), 2000));
  EXPECT_EQ(0, std::memcmp(client.bytes(1).data(), value.data() + 2000, 500));
  const auto untouched = pattern(2000, 6);
  EXPECT_EQ(0, std::memcmp(client.bytes(1).data() + 500, untouched.data() + 500, 1500));
}

TEST_P(Vectored, many_clients_at_once_each_get_their_own_bytes) {
  // Transfers of several clients interleaved on one worker must never cross: each client's
  // buffer holds exactly its own values, and reads return exactly its bytes.
  constexpr int kClients = 4;
  constexpr int kPerClient = 24;
  constexpr std::size_t kSlot = 20000;
  std::vector<Client> clients;
  for (int index = 0; index < kClients; ++index) {
    clients.push_back(Client::open(configuration_));
    ASSERT_TRUE(clients.back().target);
    clients.back().expose(kSlot * kPerClient, 100 + index);
  }
  for (int round = 0; round < kPerClient; ++round) {
    for (int index = 0; index < kClients; ++index) {
      TransferRequest write;
      write.client_id = static_cast<std::uint64_t>(index);
      write.peer_address = clients[index].address();
      // Two regions per value, split unevenly.
      write.regions.push_back(clients[index].exposed[0].region(round * kSlot, 7000));
      write.regions.push_back(clients[index].exposed[0].region(round * kSlot + 7000, kSlot - 7000));
      write.want_checksum = round % 2 == 0;
      write.context = std::make_unique<Buffer>(pattern(kSlot, 1000 * index + round));
      ASSERT_TRUE(service_->submit(std::move(write)));
    }
  }
  auto finished = collector_.wait_for(kClients * kPerClient);
  ASSERT_EQ(static_cast<std::size_t>(kClients * kPerClient), finished.size());
  for (auto& done : finished) ASSERT_TRUE(done.outcome) << done.outcome.error().describe();
  for (int index = 0; index < kClients; ++index) {
    for (int round = 0; round < kPerClient; ++round) {
      const auto expected = pattern(kSlot, 1000 * index + round);
      ASSERT_EQ(0, std::memcmp(clients[index].bytes(0).data() + round * kSlot, expected.data(), kSlot))
          << "client " << index << " value " << round;
    }
  }
  EXPECT_EQ(0u, service_->outstanding());
}

INSTANTIATE_TEST_SUITE_P(Providers, Vectored, ::testing::Values("tcp", "net", "shm"),
                         [](const auto& param_info) { return param_info.param; });

// shm ignores keys and does not bounds-check (docs/PROVIDERS.md, "shm"), so a bad key is only
// detectable on the providers that check it.
class BadKey : public Vectored {};

TEST_P(BadKey, a_wrong_key_fails_that_transfer_and_other_clients_keep_working) {
  // On tcp a bad key tears down the connection to that peer; the failure must stay with that
  // transfer, other clients must be unaffected, and the same client must be able to go on.
  Client first = Client::open(configuration_);
  Client second = Client::open(configuration_);
  ASSERT_TRUE(first.target && second.target);
  Exposed& mine = first.expose(4096, 1);
  Exposed& theirs = second.expose(4096, 2);

  TransferRequest bad;
  bad.client_id = 1;
  bad.peer_address = first.address();
  RemoteRegion wrong = mine.whole();
  wrong.key += 4242;
  bad.regions.push_back(wrong);
  bad.context = std::make_unique<Buffer>(pattern(4096, 3));
  Outcome refused = run(std::move(bad));
  ASSERT_FALSE(refused) << "a write with a key nobody exposed must fail";
  EXPECT_EQ(ErrorCode::kFabric, refused.error().code()) << refused.error().describe();
  EXPECT_TRUE(first.bytes(0) == pattern(4096, 1)) << "nothing may land on a refused write";

  TransferRequest other;
  other.client_id = 2;
  other.peer_address = second.address();
  other.regions.push_back(theirs.whole());
  other.context = std::make_unique<Buffer>(pattern(4096, 4));
  Outcome fine = run(std::move(other));
  ASSERT_TRUE(fine) << fine.error().describe();
  EXPECT_TRUE(second.bytes(0) == pattern(4096, 4));

  TransferRequest again;
  again.client_id = 1;
  again.peer_address = first.address();
  again.regions.push_back(mine.whole());
  again.context = std::make_unique<Buffer>(pattern(4096, 5));
  Outcome recovered = run(std::move(again));
  ASSERT_TRUE(recovered) << recovered.error().describe();
  EXPECT_TRUE(first.bytes(0) == pattern(4096, 5));
}

TEST_P(BadKey, exposed_buffers_never_share_a_key_and_unexposing_revokes_access) {
  // Two buffers under one key would let a client's advertisement reach the wrong buffer; a
  // buffer no longer exposed must no longer be writable.
  Client client = Client::open(configuration_);
  ASSERT_TRUE(client.target);
  Exposed& a = client.expose(4096, 1);
  Exposed& b = client.expose(4096, 2);
  EXPECT_NE(a.advertisement().key, b.advertisement().key);
  const RemoteRegion gone = b.whole();
  client.exposed.pop_back();  // un-expose b
  TransferRequest late;
  late.client_id = 1;
  late.peer_address = client.address();
  late.regions.push_back(gone);
  late.context = std::make_unique<Buffer>(pattern(4096, 9));
  Outcome refused = run(std::move(late));
  EXPECT_FALSE(refused) << "a write to an un-exposed buffer must fail";
  EXPECT_TRUE(client.bytes(1) == pattern(4096, 2));
}

INSTANTIATE_TEST_SUITE_P(CheckingProviders, BadKey, ::testing::Values("tcp", "net"),
                         [](const auto& param_info) { return param_info.param; });

// How many pieces a transfer goes out in: by default a write over tcp in 512 KiB pieces (faster
// there, worker.cpp) and everything else whole; max_piece_bytes, when set, bounds both
// directions on every provider. Counted at the poster's hook, which runs once per post.
class Pieces : public ::testing::TestWithParam<std::string> {
 protected:
  void TearDown() override { internal::set_post_hook({}); }

  // Starts a service and a client target with `configuration`, writes `length` bytes to a fresh
  // buffer of the client and reads them back; returns the posts each took.
  std::pair<std::size_t, std::size_t> posts_for(const Configuration& configuration,
                                                std::size_t length) {
    Collector collector;
    auto started = FabricService::start(configuration, collector.completer(), nullptr);
    EXPECT_TRUE(started) << started.error().describe();
    Client client = Client::open(configuration);
    EXPECT_TRUE(client.target);
    if (!started || !client.target) return {0, 0};
    FabricService& service = **started;
    Exposed& landing = client.expose(length, 9);
    // First contact: tcp, net and shm refuse posts (-FI_EAGAIN, each a post at the hook) until
    // the connection is up, so one small write goes first, uncounted.
    TransferRequest hello;
    hello.client_id = 1;
    hello.peer_address = client.address();
    hello.regions.push_back(landing.region(0, 1));
    hello.direction = Direction::kToPeer;
    hello.context = std::make_unique<Buffer>(pattern(1, 11));
    EXPECT_TRUE(service.submit(std::move(hello)));
    EXPECT_EQ(1u, collector.wait_for(1).size());
    std::atomic<std::size_t> posts{0};
    internal::set_post_hook([&posts] { posts.fetch_add(1, std::memory_order_relaxed); });
    const auto value = pattern(length, 10);
    TransferRequest write;
    write.client_id = 1;
    write.peer_address = client.address();
    write.regions.push_back(landing.whole());
    write.direction = Direction::kToPeer;
    write.context = std::make_unique<Buffer>(value);
    EXPECT_TRUE(service.submit(std::move(write)));
    auto wrote = collector.wait_for(1);
    EXPECT_EQ(1u, wrote.size());
    if (wrote.size() == 1) {
      EXPECT_TRUE(wrote[0].outcome) << wrote[0].outcome.error().describe();
    }
    EXPECT_TRUE(client.bytes(client.buffers.size() - 1) == value) << "the write landed whole";
    const std::size_t write_posts = posts.exchange(0);

    TransferRequest read;
    read.client_id = 1;
    read.peer_address = client.address();
    read.regions.push_back(landing.whole());
    read.direction = Direction::kFromPeer;
    read.length = length;
    read.context = std::make_unique<Buffer>();
    EXPECT_TRUE(service.submit(std::move(read)));
    auto got = collector.wait_for(1);
    EXPECT_EQ(1u, got.size());
    if (got.size() == 1) {
      EXPECT_TRUE(got[0].outcome) << got[0].outcome.error().describe();
      EXPECT_TRUE(testing::buffer_of(got[0].context)->bytes == value) << "the read came back whole";
    }
    const std::size_t read_posts = posts.exchange(0);
    internal::set_post_hook({});
    return {write_posts, read_posts};
  }
};

TEST_P(Pieces, a_write_over_tcp_goes_in_512_kib_pieces_by_default_and_max_piece_bytes_bounds_both) {
  constexpr std::size_t kLength = (std::size_t{1} << 20) + 1;  // two full pieces and one byte
  const Configuration defaults = testing::loopback(GetParam());
  ASSERT_EQ(0u, defaults.max_piece_bytes) << "the default leaves the piece size to the service";
  {
    const auto [writes, reads] = posts_for(defaults, kLength);
    EXPECT_EQ(GetParam() == "tcp" ? 3u : 1u, writes);
    EXPECT_EQ(1u, reads);
  }
  Configuration bounded = defaults;
  bounded.max_piece_bytes = std::size_t{256} << 10;
  const auto [writes, reads] = posts_for(bounded, kLength);
  EXPECT_EQ(5u, writes);
  EXPECT_EQ(5u, reads);
}

INSTANTIATE_TEST_SUITE_P(Providers, Pieces, ::testing::Values("tcp", "net", "shm"),
                         [](const auto& param_info) { return param_info.param; });

}  // namespace
}  // namespace dma
