// module/core.*, the module's logic without a server: load arguments into a configuration, the
// session state machine behind DMA.HELLO/PROVE, the write options of DMA.SET and DMA.SETPLAIN
// (SET's TTL and NX/XX rules), and what a fork means for the arena's registration.
#include <gtest/gtest.h>

#include <limits>
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

std::vector<std::string_view> words(const std::string& text, std::vector<std::string>& storage) {
  storage.clear();
  std::string word;
  for (char c : text + ' ') {
    if (c != ' ') {
      word += c;
    } else if (!word.empty()) {
      storage.push_back(word);
      word.clear();
    }
  }
  return {storage.begin(), storage.end()};
}

TEST(ModuleCore, the_old_dma_set_syntax_still_parses_and_options_go_between_the_length_and_the_regions) {
  // If this fails, clients written for `DMA.SET <key> <length> [CRC <c>] <regions>` break, or an
  // option (TTL, NX/XX) is read as a region or lost.
  std::vector<std::string> storage;
  auto old_form = module::parse_set_arguments(words("100 CRC 7 5 4096 60 6 8192 40", storage), 1000);
  ASSERT_TRUE(old_form) << old_form.error().describe();
  EXPECT_EQ(100u, old_form->length);
  EXPECT_EQ(7u, old_form->options.crc.value());
  EXPECT_EQ(module::Expiry::Kind::kClear, old_form->options.expiry.kind) << "a SET clears the TTL";
  EXPECT_EQ(module::Condition::kAlways, old_form->options.condition);
  ASSERT_EQ(2u, old_form->regions.regions.size());
  EXPECT_EQ(100u, old_form->regions.capacity);
  auto bare = module::parse_set_arguments(words("10 1 2 10", storage), 1000);
  ASSERT_TRUE(bare) << bare.error().describe();
  EXPECT_FALSE(bare->options.crc);

  auto with_options = module::parse_set_arguments(words("10 nx ex 30 CRC 9 1 2 10", storage), 1000);
  ASSERT_TRUE(with_options) << with_options.error().describe();
  EXPECT_EQ(module::Condition::kIfAbsent, with_options->options.condition);
  EXPECT_EQ((module::Expiry{module::Expiry::Kind::kRelative, 30000}), with_options->options.expiry);
  EXPECT_EQ(9u, with_options->options.crc.value());
  ASSERT_EQ(1u, with_options->regions.regions.size());
  EXPECT_EQ(2u, with_options->regions.regions[0].address);

  struct Case {
    std::string options;
    module::Expiry expiry;
    module::Condition condition;
  };
  const std::vector<Case> cases = {
      {"PX 1500", {module::Expiry::Kind::kRelative, 1500}, module::Condition::kAlways},
      {"EXAT 1700000000 XX", {module::Expiry::Kind::kAbsolute, 1700000000000}, module::Condition::kIfPresent},
      {"XX PXAT 1700000000123", {module::Expiry::Kind::kAbsolute, 1700000000123}, module::Condition::kIfPresent},
      {"KEEPTTL", {module::Expiry::Kind::kKeep, 0}, module::Condition::kAlways},
      {"EX 9223372036854775", {module::Expiry::Kind::kRelative, 9223372036854775000}, module::Condition::kAlways},
  };
  for (const Case& option : cases) {
    SCOPED_TRACE(option.options);
    auto parsed = module::parse_set_arguments(words("10 " + option.options + " 1 2 10", storage), 1000);
    ASSERT_TRUE(parsed) << parsed.error().describe();
    EXPECT_EQ(option.expiry, parsed->options.expiry);
    EXPECT_EQ(option.condition, parsed->options.condition);
  }
}

TEST(ModuleCore, conflicting_repeated_and_out_of_range_write_options_are_refused_naming_them) {
  // If this fails, `EX 10 PX 5` or `NX XX` silently picks one meaning, an expiry of zero or one
  // that overflows milliseconds is stored, or DMA.SET accepts GET, whose old value has nowhere
  // to go.
  std::vector<std::string> storage;
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"10 EX 10 PX 5 1 2 10", "EX and PX cannot be combined"},
      {"10 KEEPTTL EXAT 5 1 2 10", "KEEPTTL and EXAT cannot be combined"},
      {"10 NX XX 1 2 10", "NX and XX cannot be combined"},
      {"10 NX NX 1 2 10", "NX is given twice"},
      {"10 CRC 1 CRC 2 1 2 10", "CRC is given twice"},
      {"10 EX 0 1 2 10", "invalid expire time: EX 0"},
      {"10 EX 9223372036854776 1 2 10", "invalid expire time: EX 9223372036854776"},
      {"10 PX 9223372036854775808 1 2 10", "invalid expire time: PX 9223372036854775808"},
      {"10 PX 18446744073709551616 1 2 10", "does not fit in 64 bits"},
      {"10 GET 1 2 10", "GET does not fit DMA.SET"},
      {"10 EX", "EX needs a value"},
      {"10 CRC", "CRC needs a value"},
      {"10 EX ten 1 2 10", "not a decimal number"},
  };
  for (const auto& [text, expected] : refused) {
    SCOPED_TRACE(text);
    auto parsed = module::parse_set_arguments(words(text, storage), 1000);
    ASSERT_FALSE(parsed);
    EXPECT_TRUE(contains(parsed.error().message(), expected)) << parsed.error().message();
  }
  // An unknown word where the regions start is a bad region, not a silently ignored option.
  auto unknown = module::parse_set_arguments(words("10 EXPIRE 5 1 2 10", storage), 1000);
  ASSERT_FALSE(unknown);
}

TEST(ModuleCore, dma_setplain_takes_every_set_option_with_get_and_nothing_else_after_the_value) {
  // If this fails, DMA.SETPLAIN (what replication and the AOF replay) misreads a TTL or a
  // condition, or ignores a word it does not know instead of refusing it.
  std::vector<std::string> storage;
  auto none = module::parse_setplain_options(words("", storage));
  ASSERT_TRUE(none);
  EXPECT_EQ(module::WriteOptions{}, *none);
  auto replicated = module::parse_setplain_options(words("CRC 12 PXAT 1700000000000", storage));
  ASSERT_TRUE(replicated) << replicated.error().describe();
  EXPECT_EQ(12u, replicated->crc.value());
  EXPECT_EQ((module::Expiry{module::Expiry::Kind::kAbsolute, 1700000000000}), replicated->expiry);
  auto all = module::parse_setplain_options(words("get xx keepttl", storage));
  ASSERT_TRUE(all) << all.error().describe();
  EXPECT_TRUE(all->get);
  EXPECT_EQ(module::Condition::kIfPresent, all->condition);
  EXPECT_EQ(module::Expiry::Kind::kKeep, all->expiry.kind);
  for (const std::string text : {"CRC 1 bogus", "5", "GET GET", "EX 10 EX 10"}) {
    SCOPED_TRACE(text);
    EXPECT_FALSE(module::parse_setplain_options(words(text, storage)));
  }
  auto unknown = module::parse_setplain_options(words("NX bogus\r\n", storage));
  ASSERT_FALSE(unknown);
  EXPECT_TRUE(contains(unknown.error().message(), "unknown option")) << unknown.error().message();
}

TEST(ModuleCore, nx_and_xx_hold_exactly_as_set_decides_them_and_relative_ttls_refuse_overflow) {
  // If this fails, NX writes over an existing key (or XX creates one), or a TTL far in the
  // future wraps into the past and the value expires at once.
  using module::Condition;
  EXPECT_TRUE(module::condition_holds(Condition::kAlways, false));
  EXPECT_TRUE(module::condition_holds(Condition::kAlways, true));
  EXPECT_TRUE(module::condition_holds(Condition::kIfAbsent, false));
  EXPECT_FALSE(module::condition_holds(Condition::kIfAbsent, true));
  EXPECT_FALSE(module::condition_holds(Condition::kIfPresent, false));
  EXPECT_TRUE(module::condition_holds(Condition::kIfPresent, true));

  const std::int64_t now = 1700000000000;
  auto relative = module::expiry_deadline({module::Expiry::Kind::kRelative, 1500}, now);
  ASSERT_TRUE(relative);
  EXPECT_EQ(now + 1500, *relative);
  auto absolute = module::expiry_deadline({module::Expiry::Kind::kAbsolute, 42}, now);
  ASSERT_TRUE(absolute);
  EXPECT_EQ(42, *absolute) << "an absolute time in the past is kept (the key expires at once)";
  EXPECT_FALSE(module::expiry_deadline(
      {module::Expiry::Kind::kRelative, std::numeric_limits<std::int64_t>::max() - 5}, now));
  EXPECT_FALSE(module::expiry_deadline({module::Expiry::Kind::kKeep, 0}, now));
}

TEST(ModuleCore, only_pinning_providers_without_the_kernel_s_copy_on_fork_are_called_fork_unsafe) {
  // If this fails, the load-time log and INFO dma's dma_fork_safety call a verbs or efa server
  // whose BGSAVE children cannot read the arena (or may corrupt it) safe, or alarm tcp users.
  EXPECT_FALSE(module::provider_pins_memory("tcp;ofi_rxm"));
  EXPECT_FALSE(module::provider_pins_memory("shm"));
  EXPECT_FALSE(module::provider_pins_memory("net"));
  EXPECT_TRUE(module::provider_pins_memory("verbs;ofi_rxm"));
  EXPECT_TRUE(module::provider_pins_memory("efa"));
  EXPECT_TRUE(module::provider_pins_memory("efa-direct"));
  using module::ForkSafety;
  EXPECT_EQ(ForkSafety::kNotPinned, module::fork_safety(false, std::nullopt));
  EXPECT_EQ(ForkSafety::kNotPinned, module::fork_safety(false, 0));
  EXPECT_EQ(ForkSafety::kKernelCopies, module::fork_safety(true, 2));
  EXPECT_EQ(ForkSafety::kDontFork, module::fork_safety(true, 1));
  EXPECT_EQ(ForkSafety::kUnsafe, module::fork_safety(true, 0));
  EXPECT_EQ(ForkSafety::kUnsafe, module::fork_safety(true, std::nullopt));
  EXPECT_EQ("kernel-copies", module::fork_safety_name(ForkSafety::kKernelCopies));
  EXPECT_TRUE(contains(module::fork_safety_advice(ForkSafety::kDontFork), "MADV_DONTFORK"));
}

}  // namespace
}  // namespace dma::testing
