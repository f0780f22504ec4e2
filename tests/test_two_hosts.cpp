// Two hosts: the target runs in its own network namespace joined to this one by a veth pair, so
// the transfer really crosses an interface between two network stacks (tcp provider). The test
// makes and removes the namespace, the veth pair and a private test subnet itself.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "child_process.hpp"
#include "dma/protocol.hpp"
#include "dma/service.hpp"
#include "fixtures.hpp"

namespace dma {
namespace {

const std::string kCli = DMA_BINARY_DIR "/bin/dma-cli";

// Runs a shell command quietly; true on exit status 0.
bool run(const std::string& command) {
  return std::system((command + " >/dev/null 2>&1").c_str()) == 0;
}

// A namespace "dmans<pid>" with a veth pair on 10.213.<n>.0/24: .1 here, .2 inside.
class TwoHosts : public ::testing::Test {
 protected:
  void SetUp() override {
    const int id = static_cast<int>(::getpid() % 250) + 1;
    namespace_ = "dmans" + std::to_string(::getpid());
    host_link_ = "dmah" + std::to_string(::getpid() % 100000);
    peer_link_ = "dmap" + std::to_string(::getpid() % 100000);
    host_ip_ = "10.213." + std::to_string(id) + ".1";
    peer_ip_ = "10.213." + std::to_string(id) + ".2";
    const std::string in_namespace = "ip netns exec " + namespace_ + " ";
    const bool made =
        run("ip netns add " + namespace_) && (created_ = true) &&
        run("ip link add " + host_link_ + " type veth peer name " + peer_link_) &&
        run("ip link set " + peer_link_ + " netns " + namespace_) &&
        run("ip addr add " + host_ip_ + "/24 dev " + host_link_) &&
        run("ip link set " + host_link_ + " up") &&
        run(in_namespace + "ip addr add " + peer_ip_ + "/24 dev " + peer_link_) &&
        run(in_namespace + "ip link set " + peer_link_ + " up") &&
        run(in_namespace + "ip link set lo up");
    if (!made) {
      GTEST_SKIP() << "cannot make a network namespace with a veth pair here (needs root and "
                      "CAP_NET_ADMIN; `ip netns add` failed), so the two-host path is untested";
    }
  }
  void TearDown() override {
    target_.reset();
    if (created_) run("ip netns del " + namespace_);
    run("ip link del " + host_link_);  // gone with the namespace, unless moving it failed
  }

  std::string namespace_, host_link_, peer_link_, host_ip_, peer_ip_;
  bool created_ = false;
  std::unique_ptr<testing::Child> target_;
};

TEST_F(TwoHosts, a_transfer_crosses_a_veth_pair_between_two_network_namespaces) {
  // The product exists to move bytes between hosts; loopback alone would hide an address or
  // binding that only works on one stack.
  constexpr std::size_t kSize = 8 << 20;
  target_ = std::make_unique<testing::Child>(std::vector<std::string>{
      "/usr/bin/ip", "netns", "exec", namespace_, kCli, "target", "--provider", "tcp", "--bind",
      peer_ip_, "--size", std::to_string(kSize)});
  ASSERT_TRUE(target_->running());
  const std::string wire = target_->read_line();
  auto advertisement = parse_advertisement(wire);
  ASSERT_TRUE(advertisement) << "'" << wire << "': " << advertisement.error().describe();

  Configuration configuration = testing::loopback("tcp");
  configuration.bind = host_ip_;
  auto service = FabricService::start(configuration, nullptr, nullptr);
  ASSERT_TRUE(service) << service.error().describe();
  EXPECT_EQ(host_link_, (*service)->describe().domain) << "the service must sit on the veth";
  const FabricAddress peer = testing::address_of(advertisement->address);

  auto write = TransferRequest::single(1, peer, advertisement->key, advertisement->remote_address,
                                       Direction::kToPeer, 0,
                                       std::make_unique<testing::Buffer>(testing::pattern(kSize, 77)));
  auto wrote = (*service)->transfer(std::move(write));
  ASSERT_TRUE(wrote);
  Outcome written = wrote->wait_for(testing::kDeadline);
  ASSERT_TRUE(written) << written.error().describe();
  EXPECT_EQ("ok", target_->ask("verify 77"));

  ASSERT_EQ("ok", target_->ask("fill 78"));
  auto read = TransferRequest::single(1, peer, advertisement->key, advertisement->remote_address,
                                      Direction::kFromPeer, kSize,
                                      std::make_unique<testing::Buffer>());
  read.want_checksum = true;
  auto reading = (*service)->transfer(std::move(read));
  ASSERT_TRUE(reading);
  Outcome got = reading->wait_for(testing::kDeadline);
  ASSERT_TRUE(got) << got.error().describe();
  EXPECT_EQ(target_->ask("crc"), std::to_string(got->checksum.value()));
  EXPECT_TRUE(testing::buffer_of(reading->take_context())->bytes == testing::pattern(kSize, 78));
  service->reset();
  target_->write_line("quit");
  EXPECT_EQ(0, target_->finish());
}

}  // namespace
}  // namespace dma
