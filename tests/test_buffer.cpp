// dma::Buffer: memory for values that cross the fabric. Its own mapping, zeroed and faulted in,
// 2 MiB-aligned and advised onto huge pages from 1 MiB, retired from the registration cache
// before it is unmapped, and usable as a Target's exposed memory on every provider.
#include <gtest/gtest.h>

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "dma/memory.hpp"
#include "dma/protocol.hpp"
#include "dma/service.hpp"
#include "dma/target.hpp"
#include "fabric/endpoint.hpp"
#include "fabric/local_regions.hpp"
#include "fabric/registration_cache.hpp"
#include "fixtures.hpp"

namespace dma {
namespace {

using testing::loopback;

std::uintptr_t address_of(const void* pointer) { return reinterpret_cast<std::uintptr_t>(pointer); }

// Whether every page of [data, data + length) is mapped: mincore fails with ENOMEM on a range
// that holds an unmapped page.
bool mapped(const void* data, std::size_t length) {
  std::vector<unsigned char> residency((length + 4095) / 4096);
  return mincore(const_cast<void*>(data), length, residency.data()) == 0 || errno != ENOMEM;
}

// The transparent huge page mode the system is in: "always", "madvise" or "never".
std::string transparent_huge_pages() {
  std::ifstream file("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  std::getline(file, line);
  const auto open = line.find('[');
  const auto close = line.find(']');
  if (open == std::string::npos || close == std::string::npos) return "never";
  return line.substr(open + 1, close - open - 1);
}

// AnonHugePages (bytes) of the mapping that starts at `start`, from /proc/self/smaps.
std::optional<std::size_t> anon_huge_bytes(const void* start) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    std::uintptr_t from = 0;
    std::uintptr_t to = 0;
    char dash = 0;
    std::istringstream header(line);
    if (header >> std::hex >> from >> dash >> to && dash == '-') {
      inside = from == address_of(start);
      continue;
    }
    if (inside && line.rfind("AnonHugePages:", 0) == 0) {
      std::istringstream field(line.substr(14));
      std::size_t kib = 0;
      field >> kib;
      return kib * 1024;
    }
  }
  return std::nullopt;
}

TEST(Buffer, a_small_buffer_is_whole_4_KiB_pages_and_a_large_one_whole_aligned_huge_pages) {
  // If this fails, a 1 MiB value cannot sit on a huge page (malloc's alignment), or a small
  // value maps 2 MiB.
  auto small = Buffer::allocate(5000);
  ASSERT_TRUE(small) << small.error().describe();
  EXPECT_EQ(5000u, small->size());
  EXPECT_EQ(8192u, small->mapped());
  EXPECT_FALSE(small->huge_pages());
  EXPECT_EQ(0u, address_of(small->data()) % 4096);

  auto large = Buffer::allocate(Buffer::kHugePagesFrom + 1);
  ASSERT_TRUE(large) << large.error().describe();
  EXPECT_EQ(Buffer::kHugePagesFrom + 1, large->size());
  EXPECT_EQ(Buffer::kHugePageBytes, large->mapped());
  EXPECT_EQ(0u, address_of(large->data()) % Buffer::kHugePageBytes);
  EXPECT_TRUE(large->huge_pages()) << "madvise(MADV_HUGEPAGE) refused on a THP kernel";
  EXPECT_EQ(large->bytes().data(), large->data());
  EXPECT_EQ(large->bytes().size(), large->size());

  auto forced = Buffer::allocate(100, Buffer::HugePages::kAlways);
  ASSERT_TRUE(forced) << forced.error().describe();
  EXPECT_EQ(Buffer::kHugePageBytes, forced->mapped());
  EXPECT_EQ(0u, address_of(forced->data()) % Buffer::kHugePageBytes);

  auto refused = Buffer::allocate(3 * Buffer::kHugePageBytes, Buffer::HugePages::kNever);
  ASSERT_TRUE(refused) << refused.error().describe();
  EXPECT_EQ(3 * Buffer::kHugePageBytes, refused->mapped());
  EXPECT_FALSE(refused->huge_pages());
  EXPECT_EQ(0u, anon_huge_bytes(refused->data()).value_or(0));
}

TEST(Buffer, the_trimmed_reservation_leaves_nothing_mapped_around_a_huge_buffer) {
  // If this fails, every huge Buffer leaks up to 2 MiB of address space (and, once written,
  // memory) around it: the head and tail of the over-sized reservation were not unmapped. The
  // only huge-advised mapping in this process, so the kernel merges no neighbour into it.
  auto buffer = Buffer::allocate(Buffer::kHugePageBytes * 2 + 1);
  ASSERT_TRUE(buffer) << buffer.error().describe();
  ASSERT_TRUE(buffer->huge_pages());
  const std::uintptr_t start = address_of(buffer->data());
  std::ifstream maps("/proc/self/maps");
  std::string line;
  bool found = false;
  while (std::getline(maps, line)) {
    std::uintptr_t from = 0;
    std::uintptr_t to = 0;
    char dash = 0;
    std::istringstream(line) >> std::hex >> from >> dash >> to;
    if (from <= start && start < to) {
      found = true;
      EXPECT_EQ(start, from) << "mapped before the buffer: " << line;
      EXPECT_EQ(start + 3 * Buffer::kHugePageBytes, to) << "mapped past the buffer: " << line;
    }
  }
  EXPECT_TRUE(found) << "the buffer is not in /proc/self/maps";
}

TEST(Buffer, it_is_zeroed_writable_and_faulted_in) {
  // If this fails, a transfer into a fresh Buffer pays its page faults (or reads garbage).
  auto buffer = Buffer::allocate(3 * 1024 * 1024 + 17);
  ASSERT_TRUE(buffer) << buffer.error().describe();
  EXPECT_TRUE(std::all_of(buffer->data(), buffer->data() + buffer->size(),
                          [](std::byte b) { return b == std::byte{0}; }));
  std::vector<unsigned char> residency(buffer->mapped() / 4096);
  ASSERT_EQ(0, mincore(buffer->data(), buffer->mapped(), residency.data()));
  EXPECT_TRUE(std::all_of(residency.begin(), residency.end(), [](unsigned char r) { return r & 1; }))
      << "allocate() returned pages that are not resident";
  const auto value = testing::pattern(buffer->size(), 3);
  std::copy(value.begin(), value.end(), buffer->data());
  EXPECT_TRUE(std::equal(value.begin(), value.end(), buffer->data()));
}

TEST(Buffer, a_large_buffer_is_backed_by_huge_pages_where_the_system_allows_them) {
  // If this fails, the advice does not reach the kernel and a DMA.SET's value is copied out of
  // the client one 4 KiB page at a time (docs/PERFORMANCE.md, "Speed, seventh pass").
  const std::string mode = transparent_huge_pages();
  auto buffer = Buffer::allocate(4 * Buffer::kHugePageBytes);
  ASSERT_TRUE(buffer) << buffer.error().describe();
  const auto huge = anon_huge_bytes(buffer->data());
  ASSERT_TRUE(huge) << "the buffer's mapping is not in /proc/self/smaps";
  if (mode == "never") {
    // The system refuses huge pages: the buffer still works, on 4 KiB pages.
    EXPECT_EQ(0u, *huge);
  } else {
    // At least one of the four (the kernel may lack a free huge page for some).
    EXPECT_GE(*huge, Buffer::kHugePageBytes)
        << "transparent_hugepage is '" << mode << "' but no huge page backs the buffer";
  }
}

TEST(Buffer, lengths_it_cannot_map_are_clear_errors) {
  // If this fails, a bad length crashes the caller or returns a buffer smaller than asked.
  auto empty = Buffer::allocate(0);
  ASSERT_FALSE(empty);
  EXPECT_EQ(ErrorCode::kInvalidArgument, empty.error().code());

  auto overflowing = Buffer::allocate(std::numeric_limits<std::size_t>::max());
  ASSERT_FALSE(overflowing);
  EXPECT_EQ(ErrorCode::kInvalidArgument, overflowing.error().code());
  auto overflowing_small = Buffer::allocate(std::numeric_limits<std::size_t>::max() - 100,
                                            Buffer::HugePages::kNever);
  ASSERT_FALSE(overflowing_small);
  EXPECT_EQ(ErrorCode::kInvalidArgument, overflowing_small.error().code());

  // 1 PiB: more than the address space the kernel gives a process.
  const std::size_t petabyte = std::size_t{1} << 50;
  auto enormous = Buffer::allocate(petabyte);
  ASSERT_FALSE(enormous);
  EXPECT_EQ(ErrorCode::kResourceExhausted, enormous.error().code());
  EXPECT_NE(std::string::npos, enormous.error().describe().find(std::to_string(petabyte)))
      << enormous.error().describe();
}

TEST(Buffer, moving_hands_over_the_mapping_and_destroying_unmaps_it) {
  // If this fails, a moved-from Buffer unmaps memory its successor still uses, or a destroyed
  // one leaks its mapping.
  auto allocated = Buffer::allocate(Buffer::kHugePageBytes);
  ASSERT_TRUE(allocated) << allocated.error().describe();
  std::byte* const data = allocated->data();
  const std::size_t size = allocated->mapped();
  Buffer first = std::move(*allocated);
  EXPECT_EQ(nullptr, allocated->data());
  EXPECT_EQ(0u, allocated->size());
  EXPECT_EQ(0u, allocated->mapped());
  Buffer second;
  EXPECT_EQ(nullptr, second.data());
  second = std::move(first);
  EXPECT_EQ(data, second.data());
  second.data()[size - 1] = std::byte{7};
  EXPECT_TRUE(mapped(data, size));

  auto other = Buffer::allocate(4096);
  ASSERT_TRUE(other) << other.error().describe();
  std::byte* const other_data = other->data();
  second = std::move(*other);  // unmaps the first mapping
  EXPECT_FALSE(mapped(data, size)) << "assigning over a Buffer kept its old mapping";
  EXPECT_EQ(other_data, second.data());
  {
    Buffer last = std::move(second);
  }
  EXPECT_FALSE(mapped(other_data, 4096)) << "a destroyed Buffer kept its mapping";
}

TEST(Buffer, destroying_it_retires_a_cached_registration_over_it) {
  // If this fails, a later value mapped at the same address binds to the registration of the
  // destroyed Buffer's pages, and a transfer moves bytes to or from memory nobody owns.
  Configuration configuration;
  configuration.providers = {"tcp"};
  configuration.bind = "127.0.0.1";
  auto endpoint = internal::Endpoint::open(configuration, internal::Role::kInitiator, {},
                                           internal::DomainOwner::calling_thread());
  ASSERT_TRUE(endpoint) << endpoint.error().describe();
  const std::uintptr_t domain = (*endpoint)->domain_key();
  internal::LocalRegions regions(**endpoint, /*register_operands=*/true);
  auto buffer = Buffer::allocate(Buffer::kHugePageBytes);
  ASSERT_TRUE(buffer) << buffer.error().describe();
  const std::uintptr_t base = address_of(buffer->data());
  const std::uintptr_t end = base + buffer->mapped();
  ASSERT_TRUE(regions.pin(base, buffer->mapped()));
  ASSERT_TRUE(internal::registry::covering(base, end, domain)) << "just pinned";
  *buffer = Buffer();
  EXPECT_FALSE(internal::registry::covering(base, end, domain))
      << "the registration outlived the Buffer it covered";
}

class BufferTransfers : public ::testing::TestWithParam<const char*> {};

TEST_P(BufferTransfers, a_target_exposes_a_buffer_and_a_value_goes_in_and_out_whole) {
  // If this fails, huge-page client memory breaks a provider's copy (shm's process_vm_readv and
  // writev, tcp's socket path): the library's recommended allocation would lose bytes.
  auto target = Target::open(loopback(GetParam()));
  ASSERT_TRUE(target) << target.error().describe();
  const std::size_t length = Buffer::kHugePageBytes + 4096 + 5;  // spans a huge page boundary
  auto memory = Buffer::allocate(length);
  ASSERT_TRUE(memory) << memory.error().describe();
  auto exposed = (*target)->expose(memory->data(), memory->size());
  ASSERT_TRUE(exposed) << exposed.error().describe();

  testing::Collector collector;
  auto service = testing::start_service(loopback(GetParam()), collector);
  ASSERT_NE(nullptr, service);
  const std::vector<std::byte> value = testing::pattern(length, 29);
  ASSERT_TRUE(service->submit(testing::write_into(**target, *exposed, value)));
  auto written = collector.wait_for(1);
  ASSERT_EQ(1u, written.size());
  ASSERT_TRUE(written[0].outcome) << written[0].outcome.error().describe();
  (*target)->synchronize();
  EXPECT_TRUE(std::equal(value.begin(), value.end(), memory->data()))
      << "the write completed but its bytes are not in the Buffer";

  // The other way, from a second pattern written by the client.
  const std::vector<std::byte> stored = testing::pattern(length, 31);
  std::copy(stored.begin(), stored.end(), memory->data());
  TransferRequest read;
  read.client_id = 1;
  read.peer_address = testing::address_of((*target)->local_address());
  read.regions.push_back(exposed->whole());
  read.direction = Direction::kFromPeer;
  read.length = length;
  read.want_checksum = true;
  read.context = std::make_unique<testing::Buffer>();
  ASSERT_TRUE(service->submit(std::move(read)));
  auto finished = collector.wait_for(1);
  ASSERT_EQ(1u, finished.size());
  ASSERT_TRUE(finished[0].outcome) << finished[0].outcome.error().describe();
  EXPECT_EQ(stored, testing::buffer_of(finished[0].context)->bytes);
  EXPECT_EQ(crc32c(stored), finished[0].outcome->checksum.value());
}

INSTANTIATE_TEST_SUITE_P(Providers, BufferTransfers, ::testing::Values("tcp", "net", "shm"),
                         [](const auto& param_info) { return param_info.param; });

}  // namespace
}  // namespace dma
