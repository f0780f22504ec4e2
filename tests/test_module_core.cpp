// module/core.*, the module's logic without a server: load arguments into a configuration, and
// the session state machine behind DMA.HELLO/PROVE.
#include <gtest/gtest.h>

#include <span>
#include <string>
#include <vector>

#include "core.hpp"
#include "module_fixtures.hpp"

namespace dma::testing {
namespace {

TEST(ModuleCore, load_arguments_parse_into_the_configuration) {
  // If this fails, a documented argument name no longer reaches the configuration the services open
  // with.
  const std::vector<std::string> arguments = {
      "providers", "tcp,shm", "interfaces", "lo", "services-per-domain", "2",
      "max-in-flight", "32", "progress-deadline-ms", "250", "completion-deadline-ms", "750",
      "max-value-size", "1024", "crc-threads", "3", "bind", "127.0.0.1"};
  auto options = module::parse_module_arguments(arguments);
  ASSERT_TRUE(options) << options.error().describe();
  EXPECT_EQ((std::vector<std::string>{"tcp", "shm"}), options->configuration.providers);
  EXPECT_EQ((std::vector<std::string>{"lo"}), options->configuration.interfaces);
  EXPECT_EQ(2u, options->services_per_domain);
  EXPECT_EQ(32u, options->configuration.max_in_flight);
  EXPECT_EQ(250, options->configuration.progress_deadline.count());
  EXPECT_EQ(750, options->configuration.completion_deadline.count());
  EXPECT_EQ(1024u, options->max_value_size);
  EXPECT_EQ(3u, options->configuration.crc_threads);
  EXPECT_EQ("127.0.0.1", options->configuration.bind.value());
  EXPECT_EQ(module::kDefaultMaxValueSize, module::parse_module_arguments({})->max_value_size);
}

TEST(ModuleCore, get_arguments_take_inline_with_or_without_regions_and_regions_alone) {
  // If this fails, DMA.GET's INLINE form is refused or misread (a client asking for an inline
  // answer gets a transfer, or regions are lost), or inline-max is not a load argument.
  using Fields = std::vector<std::string_view>;
  auto regions_only = module::parse_get_arguments(Fields{"7", "4096", "100"});
  ASSERT_TRUE(regions_only) << regions_only.error().describe();
  EXPECT_FALSE(regions_only->inline_max);
  EXPECT_EQ(100u, regions_only->regions.capacity);
  auto inline_only = module::parse_get_arguments(Fields{"inline", "16384"});
  ASSERT_TRUE(inline_only) << inline_only.error().describe();
  EXPECT_EQ(16384u, inline_only->inline_max.value_or(0));
  EXPECT_TRUE(inline_only->regions.regions.empty());
  auto both = module::parse_get_arguments(Fields{"INLINE", "0", "7", "4096", "100", "8", "0", "5"});
  ASSERT_TRUE(both) << both.error().describe();
  EXPECT_EQ(0u, both->inline_max.value_or(1));
  EXPECT_EQ(2u, both->regions.regions.size());
  EXPECT_EQ(105u, both->regions.capacity);
  EXPECT_FALSE(module::parse_get_arguments(Fields{}));
  EXPECT_FALSE(module::parse_get_arguments(Fields{"INLINE"}));
  EXPECT_FALSE(module::parse_get_arguments(Fields{"INLINE", "-1"}));
  EXPECT_FALSE(module::parse_get_arguments(Fields{"INLINE", "1", "7", "4096"}));
  const std::vector<std::string> off = {"inline-max", "0"};
  const std::vector<std::string> too_large = {"inline-max", std::to_string(kMaxInlineMax + 1)};
  auto options = module::parse_module_arguments(off);
  ASSERT_TRUE(options) << options.error().describe();
  EXPECT_EQ(0u, options->inline_max);
  EXPECT_EQ(module::kDefaultInlineMax, module::parse_module_arguments({})->inline_max);
  EXPECT_FALSE(module::parse_module_arguments(too_large));
}

TEST(ModuleCore, an_unknown_argument_is_named_without_letting_it_forge_a_log_line) {
  // If this fails, a module argument holding a newline writes a line of its own into the
  // server's log (the error is logged at load time).
  auto refused = module::parse_module_arguments(std::vector<std::string>{"bad\nFAKE LOG", "1"});
  ASSERT_FALSE(refused);
  EXPECT_EQ(std::string::npos, refused.error().message().find('\n')) << refused.error().message();
  EXPECT_NE(std::string::npos, refused.error().message().find("bad\\x0aFAKE LOG"))
      << refused.error().message();
}

TEST(ModuleCore, sessions_only_transfer_after_a_matching_proof_and_a_mismatch_ends_them) {
  // If this fails, the state machine behind DMA.HELLO/PROVE lets a session transfer before its own
  // nonce came back byte for byte, survives other bytes, or allows two proofs of one nonce.
  auto nonce = module::make_nonce();
  ASSERT_TRUE(nonce) << nonce.error().describe();
  auto other = module::make_nonce();
  ASSERT_TRUE(other);
  EXPECT_NE(*nonce, *other) << "two nonces from getrandom collided";
  module::Sessions sessions;
  ASSERT_TRUE(sessions.open(7, *nonce));
  EXPECT_FALSE(sessions.open(7, *other));
  EXPECT_TRUE(contains(sessions.check_proven(7).error().message(), "session not proven"));
  EXPECT_TRUE(contains(sessions.check_proven(8).error().message(), "no session"));
  EXPECT_FALSE(sessions.finish_proof(7, std::as_bytes(std::span(*nonce)))) << "not proving yet";

  ASSERT_TRUE(sessions.begin_proof(7));
  EXPECT_FALSE(sessions.begin_proof(7)) << "one proof at a time";
  auto wrong = *nonce;
  wrong[0] ^= 0x80;
  EXPECT_FALSE(sessions.finish_proof(7, std::as_bytes(std::span(wrong))));
  EXPECT_FALSE(sessions.contains(7)) << "a mismatch must end the session";

  ASSERT_TRUE(sessions.open(7, *other));
  ASSERT_TRUE(sessions.begin_proof(7));
  EXPECT_FALSE(sessions.finish_proof(7, std::as_bytes(std::span(*other)).first(16)))
      << "a prefix of the nonce is not the nonce";
  ASSERT_TRUE(sessions.open(7, *other));
  ASSERT_TRUE(sessions.begin_proof(7));
  ASSERT_TRUE(sessions.finish_proof(7, std::as_bytes(std::span(*other))));
  EXPECT_TRUE(sessions.check_proven(7));
  EXPECT_EQ(1u, sessions.proven());
  EXPECT_FALSE(sessions.begin_proof(7)) << "a proven session cannot be re-proven";
  EXPECT_TRUE(sessions.check_proven(7)) << "...and the refusal must not end it";
  EXPECT_TRUE(sessions.close(7));
  EXPECT_FALSE(sessions.close(7));
  EXPECT_EQ(0u, sessions.proven());
  EXPECT_EQ(0u, sessions.size());
}

}  // namespace
}  // namespace dma::testing
