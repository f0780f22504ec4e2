// Result, the propagation helpers, and the version the library reports.
#include <gtest/gtest.h>

#include <string>

#include "dma/result.hpp"
#include "dma/version.hpp"

namespace {

dma::Result<int> parse_positive(int value) {
  if (value <= 0) return dma::fail(dma::ErrorCode::kInvalidArgument, "not positive");
  return value;
}

dma::Result<int> doubled(int value) {
  DMA_TRY_ASSIGN(const int checked, parse_positive(value));
  return checked * 2;
}

dma::Status check_both(int first, int second) {
  DMA_TRY(parse_positive(first));
  int kept = 0;
  DMA_TRY_ASSIGN(kept, parse_positive(second));
  (void)kept;
  return {};
}

// If this fails, DMA_TRY/DMA_TRY_ASSIGN lose or rewrite the callee's error on its way up (every
// function of the library propagates through them), or carry on past a failure.
TEST(Propagation, hands_the_callees_error_up_unchanged_and_the_value_on) {
  ASSERT_TRUE(doubled(21));
  EXPECT_EQ(*doubled(21), 42);
  auto failed = doubled(-1);
  ASSERT_FALSE(failed);
  EXPECT_EQ(failed.error().code(), dma::ErrorCode::kInvalidArgument);
  EXPECT_EQ(failed.error().message(), "not positive");

  EXPECT_TRUE(check_both(1, 2));
  EXPECT_EQ(check_both(-1, 2).error().message(), "not positive");
  EXPECT_EQ(check_both(1, 0).error().message(), "not positive");
}

// If this fails, the library and its headers disagree about the version, or the version is not
// the CMake project's (what an installed package would advertise).
TEST(Version, the_library_reports_the_projects_version) {
  EXPECT_EQ(std::string(dma::version()), DMA_VERSION_STRING);
  EXPECT_EQ(std::string(dma::version()), DMA_PROJECT_VERSION);
  EXPECT_EQ(std::string(dma::version()),
            std::to_string(DMA_VERSION_MAJOR) + "." + std::to_string(DMA_VERSION_MINOR) + "." +
                std::to_string(DMA_VERSION_PATCH));
}

}  // namespace
