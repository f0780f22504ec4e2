// The value store's arena (module/store/arena.hpp) without a server: blocks come from the one
// reservation, their references keep them alive, the counters say what is in use, a full arena
// refuses with an error naming arena-bytes, and freed memory is reused rather than grown. And
// its mirror in the server's used_memory (module/store/ballast.hpp), with malloc standing in for
// the server's allocator.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "dma/protocol.hpp"
#include "fixtures.hpp"
#include "store/arena.hpp"
#include "store/ballast.hpp"

namespace dma::testing {
namespace {

std::unique_ptr<store::Arena> make_arena(std::size_t capacity) {
  auto arena = store::Arena::create(capacity);
  EXPECT_TRUE(arena) << arena.error().describe();
  return arena ? std::move(*arena) : nullptr;
}

bool inside(const store::Arena& arena, const store::Block& block) {
  const auto start = reinterpret_cast<std::uintptr_t>(block.data());
  return arena.span().contains(start, std::max<std::size_t>(block.length(), 1));
}

TEST(Arena, every_block_lies_inside_the_one_registered_reservation) {
  // If this fails, a value's bytes fall outside the range registered at load, so a transfer
  // from or into them would register memory per operation (or, on efa, fail).
  auto arena = make_arena(std::size_t{256} << 20);
  ASSERT_TRUE(arena);
  std::vector<store::Block> blocks;
  for (std::size_t size : {std::size_t{0}, std::size_t{1}, std::size_t{100}, std::size_t{4096},
                           std::size_t{1} << 20, std::size_t{16} << 20, std::size_t{64} << 20}) {
    auto block = arena->allocate(size);
    ASSERT_TRUE(block) << block.error().describe();
    EXPECT_EQ(size, block->length());
    EXPECT_TRUE(inside(*arena, *block)) << size;
    if (size != 0) std::memset(block->data(), 0x5a, size);
    blocks.push_back(std::move(*block));
  }
  EXPECT_EQ(blocks.size(), arena->stats().blocks);
}

TEST(Arena, the_last_reference_frees_the_block_and_the_counters_return) {
  // If this fails, a block is freed while a transfer still holds it (the GET would send freed
  // bytes), or never freed (the arena leaks with every overwrite).
  auto arena = make_arena(std::size_t{64} << 20);
  ASSERT_TRUE(arena);
  const store::ArenaStats before = arena->stats();
  const auto value = pattern(1 << 20, 3);
  auto made = arena->copy_of(value);
  ASSERT_TRUE(made) << made.error().describe();
  EXPECT_EQ(crc32c(value), made->crc());
  void* key_value = made->release_to_opaque();  // what a Redis key holds
  store::Block in_flight = store::Block::share(key_value);
  EXPECT_EQ(2u, in_flight.references());
  const store::ArenaStats holding = arena->stats();
  EXPECT_GE(holding.in_use, before.in_use + value.size());
  (void)store::Block::adopt(key_value);  // DEL: the key's reference goes
  EXPECT_EQ(holding.in_use, arena->stats().in_use) << "freed under a transfer";
  EXPECT_EQ(0, std::memcmp(in_flight.data(), value.data(), value.size()));
  in_flight = store::Block();
  EXPECT_EQ(before.in_use, arena->stats().in_use);
  EXPECT_EQ(before.blocks, arena->stats().blocks);
}

TEST(Arena, a_full_arena_refuses_naming_arena_bytes_and_keeps_what_it_holds) {
  // If this fails, an arena that cannot hold a value aborts or returns a null block instead of
  // an error the module can reply with, or the refusal damages the values already stored.
  auto arena = make_arena(std::size_t{32} << 20);
  ASSERT_TRUE(arena);
  std::vector<store::Block> kept;
  std::optional<Error> refusal;
  for (int index = 0; index < 64 && !refusal; ++index) {
    auto block = arena->copy_of(pattern(1 << 20, static_cast<std::uint32_t>(index)));
    if (block) {
      kept.push_back(std::move(*block));
    } else {
      refusal = block.error();
    }
  }
  ASSERT_TRUE(refusal) << "32 MiB held 64 MiB";
  EXPECT_EQ(ErrorCode::kResourceExhausted, refusal->code());
  EXPECT_NE(std::string::npos, refusal->message().find("arena-bytes 33554432")) << refusal->message();
  EXPECT_GE(arena->stats().refused, 1u);
  for (std::size_t index = 0; index < kept.size(); ++index) {
    EXPECT_EQ(crc32c(pattern(1 << 20, static_cast<std::uint32_t>(index))), crc32c(kept[index].bytes()));
  }
  // Freeing makes room again.
  kept.clear();
  auto again = arena->allocate(std::size_t{8} << 20);
  EXPECT_TRUE(again) << again.error().describe();
}

TEST(Arena, freed_blocks_are_reused_so_a_steady_workload_stops_growing) {
  // If this fails, every overwrite takes fresh pages (a page fault per operation, and the
  // reservation runs out under a workload whose live size is constant).
  auto arena = make_arena(std::size_t{512} << 20);
  ASSERT_TRUE(arena);
  store::Block current = *arena->allocate(std::size_t{16} << 20);
  for (int round = 0; round < 8; ++round) {  // warm-up: jemalloc settles its extents
    store::Block next = *arena->allocate(std::size_t{16} << 20);
    current = std::move(next);
  }
  const std::size_t mapped = arena->stats().mapped;
  for (int round = 0; round < 64; ++round) {
    auto next = arena->allocate(std::size_t{16} << 20);
    ASSERT_TRUE(next) << next.error().describe();
    current = std::move(*next);
  }
  EXPECT_EQ(mapped, arena->stats().mapped) << "the arena grew in steady state";
}

TEST(Arena, blocks_freed_on_other_threads_are_counted_exactly) {
  // If this fails, a block whose last reference drops on a fabric worker (an expired transfer)
  // corrupts the arena or its counters.
  auto arena = make_arena(std::size_t{64} << 20);
  ASSERT_TRUE(arena);
  const std::size_t before = arena->stats().in_use;
  std::vector<store::Block> blocks;
  for (int index = 0; index < 256; ++index) blocks.push_back(*arena->allocate(1000 + index));
  std::vector<std::thread> threads;
  for (int part = 0; part < 4; ++part) {
    threads.emplace_back([&blocks, part] {
      for (std::size_t index = part; index < blocks.size(); index += 4) blocks[index] = store::Block();
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(before, arena->stats().in_use);
  EXPECT_EQ(0u, arena->stats().blocks);
}

// An allocator that counts what it holds, standing in for RedisModule_TryAlloc/Free.
struct Counted {
  static inline std::atomic<std::size_t> live{0};
  static inline std::atomic<bool> refuse{false};
  static inline std::atomic<std::size_t> allocations{0};
  static void* allocate(std::size_t bytes) {
    if (refuse.load()) return nullptr;
    ++allocations;
    live += bytes;
    auto* memory = static_cast<std::size_t*>(std::malloc(bytes + sizeof(std::size_t)));
    *memory = bytes;
    return memory + 1;
  }
  static void release(void* memory) {
    auto* start = static_cast<std::size_t*>(memory) - 1;
    live -= *start;
    std::free(start);
  }
};

TEST(Ballast, holds_what_the_arena_uses_within_its_band_and_nothing_once_it_is_empty) {
  // If this fails, the server's used_memory misses the value store (maxmemory never evicts a
  // DMA value, deny-oom never refuses) or over-counts it by more than the documented slack, or
  // keeps counting after every value is gone.
  Counted::live = 0;
  {
    store::Ballast ballast({Counted::allocate, Counted::release}, 4096);
    for (std::size_t bytes : {std::size_t{1}, std::size_t{4096}, std::size_t{4097},
                              std::size_t{1} << 20, std::size_t{100000}, std::size_t{5000},
                              std::size_t{12000}, std::size_t{3}}) {
      SCOPED_TRACE(bytes);
      ballast.follow(bytes);
      EXPECT_GE(ballast.held(), bytes);
      EXPECT_LT(ballast.held(), bytes + std::max<std::size_t>(2 * 4096, bytes / 32));
      EXPECT_EQ(ballast.held(), Counted::live.load()) << "held is what the allocator handed out";
    }
    // A value stored and deleted at a chunk boundary allocates nothing each time.
    ballast.follow(8192);
    const std::size_t steady = ballast.held();
    for (int round = 0; round < 10; ++round) {
      ballast.follow(8193);
      ballast.follow(8192);
    }
    EXPECT_LE(ballast.held(), steady + 4096);
    // A larger store: a DMA.SET's swap (the new block allocated before the old is freed) of a
    // value up to 1/32 of the store allocates nothing each time either, and the slack stays
    // under 1/32 of the store.
    const std::size_t store = std::size_t{10} << 20;
    const std::size_t value = store / 40;
    ballast.follow(store);
    ballast.follow(store + value);
    ballast.follow(store);
    const std::size_t allocations = Counted::allocations.load();
    for (int round = 0; round < 10; ++round) {
      ballast.follow(store + value);
      ballast.follow(store);
    }
    EXPECT_EQ(allocations, Counted::allocations.load()) << "chunks taken and given back per swap";
    EXPECT_GE(ballast.held(), store);
    EXPECT_LT(ballast.held(), store + store / 32);
    ballast.follow(0);
    EXPECT_EQ(0u, ballast.held());
    EXPECT_EQ(0u, Counted::live.load());
    Counted::refuse = true;
    ballast.follow(10000);
    Counted::refuse = false;
    EXPECT_EQ(0u, ballast.held());
    EXPECT_EQ(1u, ballast.refused()) << "a refused chunk is counted, not retried in a loop";
    ballast.follow(10000);
  }
  EXPECT_EQ(0u, Counted::live.load()) << "the destructor gives every chunk back";
}

TEST(Ballast, follows_an_arena_whose_blocks_are_freed_on_other_threads) {
  // If this fails, the arena's usage listener misses a block freed off the main thread (a
  // transfer held the last reference), so used_memory stays high after the value is gone.
  Counted::live = 0;
  store::Ballast ballast({Counted::allocate, Counted::release}, 65536);
  auto created = store::Arena::create(std::size_t{64} << 20,
                                      [&ballast](std::size_t in_use) { ballast.follow(in_use); });
  ASSERT_TRUE(created) << created.error().describe();
  auto& arena = *created;
  std::vector<store::Block> blocks;
  for (int index = 0; index < 64; ++index) blocks.push_back(*arena->allocate(100000 + index));
  EXPECT_GE(ballast.held(), arena->stats().in_use);
  EXPECT_LT(ballast.held(), arena->stats().in_use + 2 * 65536);
  std::vector<std::thread> threads;
  for (int part = 0; part < 4; ++part) {
    threads.emplace_back([&blocks, part] {
      for (std::size_t index = part; index < blocks.size(); index += 4) blocks[index] = store::Block();
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(0u, arena->stats().in_use);
  EXPECT_EQ(0u, ballast.held());
  EXPECT_EQ(0u, Counted::live.load());
}

}  // namespace
}  // namespace dma::testing
