// Replays the kept libFuzzer corpus (fuzz/corpus/<target>/) through the same target bodies the
// fuzz executables run (fuzz/targets.hpp), so every normal build checks it without clang; plus
// the regression inputs fuzzing found.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "dma/configuration.hpp"
#include "targets.hpp"

namespace dma::fuzz {
namespace {

std::vector<std::uint8_t> read_bytes(const std::filesystem::path& path) {
  std::ifstream file(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>()};
}

std::span<const std::uint8_t> bytes_of(std::string_view text) {
  return {reinterpret_cast<const std::uint8_t*>(text.data()), text.size()};
}

// Runs every file of fuzz/corpus/<name>/ through the target named `name`; returns how many.
std::size_t replay(std::string_view name) {
  const Target* target = nullptr;
  for (const Target& candidate : kTargets) {
    if (candidate.name == name) target = &candidate;
  }
  if (target == nullptr) {
    ADD_FAILURE() << "no fuzz target named " << name;
    return 0;
  }
  const std::filesystem::path directory =
      std::filesystem::path(DMA_SOURCE_DIR) / "fuzz" / "corpus" / std::string(name);
  std::size_t replayed = 0;
  for (const auto& entry : std::filesystem::directory_iterator(directory)) {
    if (!entry.is_regular_file()) continue;
    const std::vector<std::uint8_t> input = read_bytes(entry.path());
    const Violation violation = target->run(input);
    EXPECT_FALSE(violation.has_value()) << entry.path() << ": " << violation.value_or("");
    ++replayed;
  }
  return replayed;
}

TEST(FuzzCorpus, EveryKeptAdvertisementInputKeepsTheParserInvariants) {
  // Breaks: an advertisement parser change re-opens a hole fuzzing once found (a wrapped number,
  // a second spelling, an error text that splits a RESP reply) and only a clang run would notice.
  EXPECT_GT(replay("advertisement"), 10u);
}

TEST(FuzzCorpus, EveryKeptConfigurationInputKeepsTheParserInvariants) {
  // Breaks: a TOML file the loader once handled (wrong types, unknown keys, odd syntax) now
  // throws out of it, is accepted but does not validate, or does not survive being written back.
  EXPECT_GT(replay("configuration"), 10u);
}

TEST(FuzzCorpus, EveryKeptModuleArgumentInputKeepsTheParserInvariants) {
  // Breaks: a DMA.SET/DMA.GET argument list or a load argument list that was refused or bounded
  // is accepted again: regions past kMaxRemoteRegions, a total that wraps, a length past
  // max-value-size or past the regions.
  EXPECT_GT(replay("module_arguments"), 10u);
}

TEST(FuzzCorpus, EveryTargetHasAKeptCorpus) {
  // Breaks: a target renamed or added without its corpus directory, so its replay above (or
  // `make fuzz`) silently runs nothing.
  for (const Target& target : kTargets) {
    const auto directory = std::filesystem::path(DMA_SOURCE_DIR) / "fuzz" / "corpus" /
                           std::string(target.name);
    EXPECT_TRUE(std::filesystem::is_directory(directory)) << directory;
  }
}

TEST(FuzzTargets, ValidInputsInOddSpellingsAreNotReportedAsViolations) {
  // Breaks: a target's reference is stricter than the parser's contract (uppercase hex, leading
  // zeros, a lowercase "crc", escapes in TOML strings), so `make fuzz` reports false crashes.
  EXPECT_EQ(advertisement(bytes_of("0A0b 007 18446744073709551615")), std::nullopt);
  EXPECT_EQ(module_arguments(bytes_of("100 crc 01 1 0 60 2 0 40")), std::nullopt);
  EXPECT_EQ(configuration(bytes_of("providers = [\"tcp\"]\nbind = \"a\\u0001\\\"b\"\n")),
            std::nullopt);
}

TEST(FuzzTargets, TheSchemasBoundsHoldInBothParsersAsTheTargetsCheckThem) {
  // Breaks: the targets' independent reference of the ranges (crc-threads 1..256, deadlines up
  // to 2^31-1 ms) and the schema disagree, so fuzzing either reports false crashes at the bounds
  // or misses a parser that widened one.
  EXPECT_EQ(module_arguments(bytes_of("crc-threads 256 completion-deadline-ms 2147483647 "
                                      "progress-deadline-ms 2147483647")),
            std::nullopt);
  EXPECT_EQ(module_arguments(bytes_of("always-register-operands true max-piece-bytes 4096")),
            std::nullopt);
  EXPECT_EQ(module_arguments(bytes_of("crc-threads 257")), std::nullopt);
  EXPECT_EQ(configuration(bytes_of("crc_threads = 256\ncompletion_deadline_ms = 2147483647\n")),
            std::nullopt);
  EXPECT_EQ(configuration(bytes_of("completion_deadline_ms = 2147483648\n")), std::nullopt);
  // A key spelling a non-ASCII character by escape is refused with the bytes escaped.
  EXPECT_EQ(configuration(bytes_of("\"\\u00e9\" = 1\n")), std::nullopt);
}

}  // namespace
}  // namespace dma::fuzz
