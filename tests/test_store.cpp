// The value store's arena (module/store/arena.hpp) without a server: blocks come from the one
// reservation, their references keep them alive, the counters say what is in use, a full arena
// refuses with an error naming arena-bytes, and freed memory is reused rather than grown.
#include <gtest/gtest.h>

#include <cstring>
#include <thread>
#include <vector>

#include "dma/protocol.hpp"
#include "fixtures.hpp"
#include "store/arena.hpp"

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

}  // namespace
}  // namespace dma::testing
