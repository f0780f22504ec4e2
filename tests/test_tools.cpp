// The command-line tools as real processes: `dma-cli target` in a child process against a
// FabricService in this one (tcp, net and shm over loopback), `dma-cli initiator` against it,
// and dma-info. Every read from a child has a deadline (poll), and every child is killed and
// reaped when its test ends, pass or fail.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "child_process.hpp"
#include "dma/protocol.hpp"
#include "dma/service.hpp"
#include "fixtures.hpp"

namespace dma {
namespace {

using testing::Buffer;
using testing::pattern;

using testing::Child;
const std::string kCli = DMA_BINARY_DIR "/bin/dma-cli";
const std::string kInfo = DMA_BINARY_DIR "/bin/dma-info";
const std::string kSoak = DMA_BINARY_DIR "/bin/dma-soak";

std::string range(std::size_t offset, std::size_t length) {
  return " " + std::to_string(offset) + " " + std::to_string(length);
}

constexpr std::size_t kTargetBytes = 64 << 20;

class ToolsLoopback : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    target_ = std::make_unique<Child>(std::vector<std::string>{
        kCli, "target", "--provider", GetParam(), "--bind", "127.0.0.1", "--size",
        std::to_string(kTargetBytes)});
    ASSERT_TRUE(target_->running());
    wire_ = target_->read_line();
    auto advertisement = parse_advertisement(wire_);
    ASSERT_TRUE(advertisement) << "'" << wire_ << "': " << advertisement.error().describe();
    advertisement_ = *advertisement;
    auto service = FabricService::start(testing::loopback(GetParam()), nullptr, nullptr);
    ASSERT_TRUE(service) << service.error().describe();
    service_ = std::move(*service);
    ASSERT_EQ("ok", target_->ask("initiator " + hex_encode(service_->local_address())));
  }
  void TearDown() override {
    service_.reset();
    if (target_ && target_->running()) {
      target_->write_line("quit");
      EXPECT_EQ(0, target_->finish()) << "the target must exit cleanly on quit";
    }
    target_.reset();
  }

  TransferRequest request(Direction direction, std::size_t offset, std::size_t length,
                          std::unique_ptr<Operands> context) {
    auto out = TransferRequest::single(1, testing::address_of(advertisement_.address),
                                       advertisement_.key, advertisement_.remote_address + offset,
                                       direction, length, std::move(context));
    out.want_checksum = true;
    return out;
  }

  Outcome run(TransferRequest request) {
    auto handle = service_->transfer(std::move(request));
    if (!handle) return fail(handle.error());
    return handle->wait_for(testing::kDeadline);
  }

  std::unique_ptr<Child> target_;
  std::string wire_;
  Advertisement advertisement_;
  std::unique_ptr<FabricService> service_;
};

TEST_P(ToolsLoopback, bytes_written_from_here_land_in_the_target_process) {
  // If this fails, a write that reports success left other bytes in the client's buffer: the
  // two processes disagree on what was moved.
  std::uint32_t seed = 100;
  for (std::size_t size : {std::size_t{1}, std::size_t{4096}, std::size_t{1} << 20, kTargetBytes}) {
    SCOPED_TRACE("size " + std::to_string(size));
    const auto value = pattern(size, seed);
    Outcome outcome = run(request(Direction::kToPeer, 0, size, std::make_unique<Buffer>(value)));
    ASSERT_TRUE(outcome) << outcome.error().describe();
    EXPECT_EQ(size, outcome->bytes);
    EXPECT_EQ(crc32c(value), outcome->checksum.value());
    EXPECT_EQ("ok", target_->ask("verify " + std::to_string(seed) + range(0, size)));
    EXPECT_EQ(std::to_string(crc32c(value)), target_->ask("crc" + range(0, size)));
    ++seed;
  }
}

TEST_P(ToolsLoopback, bytes_the_target_process_fills_are_the_bytes_read_here) {
  // If this fails, a read returned stale or misplaced bytes from another process's buffer.
  std::uint32_t seed = 200;
  for (std::size_t size : {std::size_t{1}, std::size_t{4096}, std::size_t{1} << 20, kTargetBytes}) {
    SCOPED_TRACE("size " + std::to_string(size));
    ASSERT_EQ("ok", target_->ask("fill " + std::to_string(seed) + range(0, size)));
    const std::string their_crc = target_->ask("crc" + range(0, size));
    Outcome outcome = run(request(Direction::kFromPeer, 0, size, std::make_unique<Buffer>()));
    ASSERT_TRUE(outcome) << outcome.error().describe();
    EXPECT_EQ(size, outcome->bytes);
    EXPECT_EQ(their_crc, std::to_string(outcome->checksum.value()));
    EXPECT_EQ(crc32c(pattern(size, seed)), outcome->checksum.value());
    ++seed;
  }
}

TEST_P(ToolsLoopback, a_multi_region_value_lands_in_order_in_the_target_process) {
  // If this fails, a value spread over regions arrives in the other process out of order or
  // misplaced, piece by piece, when piece boundaries fall inside regions (the service splits at
  // 1000 bytes here).
  Configuration configuration = testing::loopback(GetParam());
  configuration.max_piece_bytes = 1000;
  auto service = FabricService::start(configuration, nullptr, nullptr);
  ASSERT_TRUE(service) << service.error().describe();
  ASSERT_EQ("ok", target_->ask("initiator " + hex_encode((*service)->local_address())));
  // Regions: [1 MiB, +3001), [0, +1500), [2 MiB + 7, +2500): 7001 bytes of one value.
  const std::vector<std::pair<std::size_t, std::size_t>> ranges = {
      {1 << 20, 3001}, {0, 1500}, {(2 << 20) + 7, 2500}};
  const auto value = pattern(7001, 55);
  TransferRequest write;
  write.client_id = 1;
  write.peer_address = testing::address_of(advertisement_.address);
  for (const auto& [offset, length] : ranges) {
    write.regions.push_back(
        RemoteRegion{advertisement_.key, advertisement_.remote_address + offset, length});
  }
  write.want_checksum = true;
  write.context = std::make_unique<Buffer>(value);
  auto handle = (*service)->transfer(std::move(write));
  ASSERT_TRUE(handle);
  Outcome outcome = handle->wait_for(testing::kDeadline);
  ASSERT_TRUE(outcome) << outcome.error().describe();
  EXPECT_EQ(crc32c(value), outcome->checksum.value());
  std::size_t consumed = 0;
  for (const auto& [offset, length] : ranges) {
    const auto part = std::span<const std::byte>(value).subspan(consumed, length);
    EXPECT_EQ(std::to_string(crc32c(part)), target_->ask("crc" + range(offset, length)))
        << "region at " << offset;
    consumed += length;
  }
}

TEST_P(ToolsLoopback, concurrent_transfers_each_land_in_their_own_range) {
  // If this fails, transfers in flight together overwrite each other's ranges in the target.
  constexpr std::size_t kCount = 16;
  constexpr std::size_t kSize = 256 << 10;
  std::vector<Transfer> handles;
  for (std::size_t index = 0; index < kCount; ++index) {
    auto handle = service_->transfer(
        request(Direction::kToPeer, index * kSize, kSize,
                std::make_unique<Buffer>(pattern(kSize, 300 + static_cast<std::uint32_t>(index)))));
    ASSERT_TRUE(handle) << handle.error().describe();
    handles.push_back(std::move(*handle));
  }
  for (Transfer& handle : handles) {
    Outcome outcome = handle.wait_for(testing::kDeadline);
    ASSERT_TRUE(outcome) << outcome.error().describe();
  }
  for (std::size_t index = 0; index < kCount; ++index) {
    EXPECT_EQ("ok", target_->ask("verify " + std::to_string(300 + index) + range(index * kSize, kSize)))
        << "range " << index;
  }
}

TEST_P(ToolsLoopback, the_initiator_tool_moves_bytes_the_target_tool_verifies) {
  // If this fails, the two halves of dma-cli cannot talk to each other on this provider.
  constexpr std::size_t kSize = 1 << 20;
  Child initiator({kCli, "initiator", "--provider", GetParam(), "--bind", "127.0.0.1", "--op",
                   "write", "--length", std::to_string(kSize), "--offset", "4096", "--seed", "77",
                   "--advertisement", wire_});
  const std::string line = initiator.read_line();
  EXPECT_EQ("bytes=" + std::to_string(kSize) + " crc32c=" + std::to_string(crc32c(pattern(kSize, 77))),
            line.substr(0, line.find(" seconds=")));
  EXPECT_NE(std::string::npos, line.find(" gbps=")) << line;
  EXPECT_EQ(0, initiator.finish());
  EXPECT_EQ("ok", target_->ask("verify 77" + range(4096, kSize)));

  // And a read through the tool, with the advertisement on its stdin.
  ASSERT_EQ("ok", target_->ask("fill 78" + range(0, kSize)));
  Child reader({kCli, "initiator", "--provider", GetParam(), "--bind", "127.0.0.1", "--op", "read",
                "--length", std::to_string(kSize)});
  reader.write_line(wire_);
  const std::string read = reader.read_line();
  EXPECT_EQ("bytes=" + std::to_string(kSize) + " crc32c=" + std::to_string(crc32c(pattern(kSize, 78))),
            read.substr(0, read.find(" seconds=")));
  EXPECT_EQ(0, reader.finish());
}

INSTANTIATE_TEST_SUITE_P(Providers, ToolsLoopback, ::testing::Values("tcp", "net", "shm"),
                         [](const auto& param_info) { return param_info.param; });

TEST(DmaCli, a_malformed_advertisement_exits_2_naming_the_field) {
  // If this fails, a typo in a pasted advertisement fails later and vaguely (or not at all).
  Child initiator({kCli, "initiator", "--provider", "tcp", "--op", "read", "--length", "8",
                   "--advertisement", "0200abcd x1 0"},
                  /*merge_stderr=*/true);
  std::string output;
  EXPECT_EQ(2, initiator.finish(&output));
  EXPECT_NE(std::string::npos, output.find("rkey")) << output;

  Child spaced({kCli, "initiator", "--provider", "tcp", "--op", "read", "--length", "8",
                "--advertisement", "0200abcd 1 -5"},
               /*merge_stderr=*/true);
  EXPECT_EQ(2, spaced.finish(&output));
  EXPECT_NE(std::string::npos, output.find("remote address")) << output;
}

TEST(DmaSoak, a_usage_error_exits_2_like_the_other_tools) {
  // If this fails, a script driving dma-soak cannot tell a mistyped option (CLI11's own codes,
  // 105-109) from a run that could not start, or from the tools' shared "2: usage".
  std::string output;
  Child unknown({kSoak, "--no-such-option"}, /*merge_stderr=*/true);
  EXPECT_EQ(2, unknown.finish(&output)) << output;
  Child out_of_range({kSoak, "--provider", "tcp", "--clients", "0"}, /*merge_stderr=*/true);
  EXPECT_EQ(2, out_of_range.finish(&output)) << output;
  Child help({kSoak, "--help"}, /*merge_stderr=*/true);
  EXPECT_EQ(0, help.finish(&output)) << output;
  EXPECT_NE(std::string::npos, output.find("--kill-every")) << output;
}

TEST(DmaCli, the_target_answers_bad_commands_with_an_error_line_and_keeps_serving) {
  // If this fails, one bad command desynchronises (or kills) a script driving the target.
  Child target({kCli, "target", "--provider", "tcp", "--size", "64", "--fill", "5"});
  ASSERT_TRUE(parse_advertisement(target.read_line()));
  EXPECT_EQ(0u, target.ask("bogus").find("error:"));
  EXPECT_EQ(0u, target.ask("crc 0 65").find("error:"));
  EXPECT_EQ(0u, target.ask("verify").find("error:"));
  EXPECT_EQ("ok", target.ask("verify 5"));
  EXPECT_EQ("mismatch at 0", target.ask("verify 6"));
  EXPECT_EQ(std::to_string(crc32c(pattern(64, 5))), target.ask("crc"));
  // put writes exactly its bytes; a range past the end or bad hex changes nothing.
  EXPECT_EQ(0u, target.ask("put 62 010203").find("error:"));
  EXPECT_EQ(0u, target.ask("put 0 0g").find("error:"));
  EXPECT_EQ(0u, target.ask("put 0").find("error:"));
  EXPECT_EQ("ok", target.ask("verify 5"));
  EXPECT_EQ("ok", target.ask("put 60 0a0B0c"));
  std::vector<std::byte> expected = pattern(64, 5);
  expected[60] = std::byte{0x0a};
  expected[61] = std::byte{0x0b};
  expected[62] = std::byte{0x0c};
  EXPECT_EQ(std::to_string(crc32c(expected)), target.ask("crc"));
  EXPECT_EQ("ok", target.ask("verify 5 0 60"));
  EXPECT_EQ(0, target.finish()) << "EOF on stdin must exit 0";
}

TEST(DmaInfo, reports_the_tcp_provider_and_exits_0) {
  // If this fails, dma-info cannot open the provider every deployment falls back to.
  Child info({kInfo, "--provider", "tcp", "--bind", "127.0.0.1"});
  std::string output;
  EXPECT_EQ(0, info.finish(&output));
  EXPECT_NE(std::string::npos, output.find("tcp;ofi_rxm")) << output;
}

}  // namespace
}  // namespace dma
