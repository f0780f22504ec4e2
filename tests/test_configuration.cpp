// Configuration: defaults, the TOML file format, its errors, and provider names; the one schema
// (src/protocol/settings.hpp) behind both the TOML file and the module's load arguments, the
// README table rendered from it, and the shipped examples/*.toml.
#include <gtest/gtest.h>

#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <system_error>
#include <vector>

#include "dma/configuration.hpp"
#include "dma/result.hpp"
#include "protocol/settings.hpp"

namespace dma {
namespace {

using std::chrono::milliseconds;

// The message of a configuration error, or a test failure if there was none.
std::string error_of(const Result<Configuration>& result) {
  if (result) {
    ADD_FAILURE() << "expected an error";
    return {};
  }
  EXPECT_EQ(result.error().code(), ErrorCode::kConfiguration);
  return result.error().message();
}

bool contains(const std::string& text, std::string_view part) {
  return text.find(part) != std::string::npos;
}

// A fresh directory for configuration files, removed with everything in it afterwards.
class ConfigurationFile : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (std::filesystem::temp_directory_path() / "dma-config-XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    directory_ = pattern;
  }
  void TearDown() override {
    std::error_code ignored;
    std::filesystem::remove_all(directory_, ignored);
  }

  std::filesystem::path write(const std::string& name, const std::string& contents) {
    const std::filesystem::path path = directory_ / name;
    std::ofstream(path) << contents;
    return path;
  }

  std::filesystem::path directory_;
};

TEST(Configuration, TheDefaultsAreValid) {
  // Breaks: a service started without a configuration file refuses to open.
  const Configuration configuration;
  EXPECT_TRUE(configuration.validate());
  EXPECT_EQ(configuration.providers, std::vector<std::string>{"tcp"});
  EXPECT_TRUE(configuration.interfaces.empty());
  EXPECT_FALSE(configuration.bind.has_value());
  EXPECT_EQ(configuration.max_in_flight, 64u);
  EXPECT_EQ(configuration.progress_deadline, milliseconds(1000));
  EXPECT_EQ(configuration.completion_deadline, milliseconds(30000));
  EXPECT_EQ(configuration.crc_threads, 1u);
  EXPECT_EQ(configuration.worker_idle_poll, std::chrono::microseconds(300));
}

TEST(Configuration, AnEmptyDocumentGivesTheDefaults) {
  // Breaks: keys left out of a file take values other than the documented defaults.
  auto parsed = Configuration::parse_toml("# nothing set\n");
  ASSERT_TRUE(parsed) << parsed.error().describe();
  const Configuration defaults;
  EXPECT_EQ(parsed->providers, defaults.providers);
  EXPECT_EQ(parsed->interfaces, defaults.interfaces);
  EXPECT_EQ(parsed->bind, defaults.bind);
  EXPECT_EQ(parsed->max_in_flight, defaults.max_in_flight);
  EXPECT_EQ(parsed->progress_deadline, defaults.progress_deadline);
  EXPECT_EQ(parsed->completion_deadline, defaults.completion_deadline);
  EXPECT_EQ(parsed->crc_threads, defaults.crc_threads);
  EXPECT_EQ(parsed->worker_idle_poll, defaults.worker_idle_poll);
}

TEST_F(ConfigurationFile, EveryKeyInAFileIsRead) {
  // Breaks: some documented key is ignored or lands in the wrong field.
  const auto path = write("full.toml",
                          "providers = [\"efa-direct\", \"verbs\", \"tcp\"]\n"
                          "interfaces = [\"rdmap0s6-rdm\", \"lo\"]\n"
                          "bind = \"127.0.0.1\"\n"
                          "max_in_flight = 0\n"
                          "progress_deadline_ms = 250\n"
                          "completion_deadline_ms = 0\n"
                          "crc_threads = 4\n"
                          "worker_idle_poll_us = 0\n");
  auto loaded = Configuration::load(path);
  ASSERT_TRUE(loaded) << loaded.error().describe();
  EXPECT_EQ(loaded->providers, (std::vector<std::string>{"efa-direct", "verbs", "tcp"}));
  EXPECT_EQ(loaded->interfaces, (std::vector<std::string>{"rdmap0s6-rdm", "lo"}));
  EXPECT_EQ(loaded->bind, "127.0.0.1");
  EXPECT_EQ(loaded->max_in_flight, 0u);
  EXPECT_EQ(loaded->progress_deadline, milliseconds(250));
  EXPECT_EQ(loaded->completion_deadline, milliseconds(0));
  EXPECT_EQ(loaded->crc_threads, 4u);
  EXPECT_EQ(loaded->worker_idle_poll, std::chrono::microseconds(0));
}

TEST_F(ConfigurationFile, AnUnknownKeyIsNamedWithTheFileAndLine) {
  // Breaks: a misspelt key silently leaves the default in force.
  const auto path = write("typo.toml", "providers = [\"tcp\"]\nmax_inflight = 8\n");
  const std::string message = error_of(Configuration::load(path));
  EXPECT_TRUE(contains(message, "\"max_inflight\"")) << message;
  EXPECT_TRUE(contains(message, path.string() + ":2:1:")) << message;
}

TEST(Configuration, AnUnknownKeyInTextIsNamedWithItsLine) {
  // Breaks: text configurations (from module arguments) accept misspelt keys.
  const std::string message = error_of(Configuration::parse_toml("\n\ncrc_thread = 2\n"));
  EXPECT_TRUE(contains(message, "\"crc_thread\"")) << message;
  EXPECT_TRUE(contains(message, "line 3")) << message;
}

TEST(Configuration, AnUnknownKeyWithALineBreakIsEscapedInTheError) {
  // Breaks: a quoted key containing CR/LF splits the RESP error reply carrying the message.
  const std::string message = error_of(Configuration::parse_toml("\"a\\r\\nb\" = 1\n"));
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  EXPECT_EQ(message.find('\r'), std::string::npos) << message;
  EXPECT_TRUE(contains(message, "\"a\\x0d\\x0ab\"")) << message;
}

TEST(Configuration, ATableIsAnUnknownKey) {
  // Breaks: settings under a [section] are silently ignored.
  const std::string message = error_of(Configuration::parse_toml("[fabric]\nproviders = []\n"));
  EXPECT_TRUE(contains(message, "\"fabric\"")) << message;
}

TEST(Configuration, AWrongTypeNamesTheKeyAndTheExpectedType) {
  // Breaks: a quoted number or a bare string is accepted or reported without saying where.
  std::string message = error_of(Configuration::parse_toml("max_in_flight = \"64\"\n"));
  EXPECT_TRUE(contains(message, "\"max_in_flight\"")) << message;
  EXPECT_TRUE(contains(message, "integer")) << message;

  message = error_of(Configuration::parse_toml("providers = \"tcp\"\n"));
  EXPECT_TRUE(contains(message, "\"providers\"")) << message;
  EXPECT_TRUE(contains(message, "array of strings")) << message;

  message = error_of(Configuration::parse_toml("interfaces = [\"lo\", 3]\n"));
  EXPECT_TRUE(contains(message, "\"interfaces\"[1]")) << message;
  EXPECT_TRUE(contains(message, "string")) << message;

  message = error_of(Configuration::parse_toml("bind = 127\n"));
  EXPECT_TRUE(contains(message, "\"bind\"")) << message;

  message = error_of(Configuration::parse_toml("progress_deadline_ms = 1.5\n"));
  EXPECT_TRUE(contains(message, "\"progress_deadline_ms\"")) << message;
}

TEST(Configuration, ANegativeMaxInFlightIsAnError) {
  // Breaks: -1 wraps to a huge size_t and the in-flight cap disappears.
  const std::string message = error_of(Configuration::parse_toml("max_in_flight = -1\n"));
  EXPECT_TRUE(contains(message, "\"max_in_flight\"")) << message;
  EXPECT_TRUE(contains(message, "-1")) << message;
}

TEST(Configuration, NegativeOrZeroDeadlinesAreErrors) {
  // Breaks: every operation fails as unreachable at once, or a negative deadline wraps.
  EXPECT_TRUE(contains(error_of(Configuration::parse_toml("progress_deadline_ms = 0\n")),
                       "progress_deadline_ms"));
  EXPECT_TRUE(contains(error_of(Configuration::parse_toml("completion_deadline_ms = -5\n")),
                       "completion_deadline_ms"));
  Configuration configuration;
  configuration.progress_deadline = milliseconds(0);
  EXPECT_FALSE(configuration.validate());
}

TEST(Configuration, ZeroCrcThreadsIsAnError) {
  // Breaks: checksums are queued to a pool with no threads and never complete.
  EXPECT_TRUE(
      contains(error_of(Configuration::parse_toml("crc_threads = 0\n")), "crc_threads"));
  Configuration configuration;
  configuration.crc_threads = 0;
  ASSERT_FALSE(configuration.validate());
  EXPECT_EQ(configuration.validate().error().code(), ErrorCode::kConfiguration);
}

TEST(Configuration, NoProvidersOrAnEmptyProviderIsAnError) {
  // Breaks: the service opens nothing, or asks libfabric for a provider named "".
  EXPECT_TRUE(contains(error_of(Configuration::parse_toml("providers = []\n")), "providers"));
  EXPECT_TRUE(
      contains(error_of(Configuration::parse_toml("providers = [\"tcp\", \"\"]\n")), "[1]"));
}

TEST_F(ConfigurationFile, AMissingFileIsAnErrorNamingThePath) {
  // Breaks: a typo in the configuration path starts the service on defaults, or crashes it.
  const auto path = directory_ / "absent.toml";
  const std::string message = error_of(Configuration::load(path));
  EXPECT_TRUE(contains(message, path.string())) << message;
  EXPECT_TRUE(contains(message, "No such file")) << message;
}

TEST_F(ConfigurationFile, ADirectoryIsAnErrorNotAnEmptyConfiguration) {
  // Breaks: pointing at a directory silently yields the defaults.
  const std::string message = error_of(Configuration::load(directory_));
  EXPECT_TRUE(contains(message, directory_.string())) << message;
}

TEST_F(ConfigurationFile, ASyntaxErrorIsAResultWithItsLocation) {
  // Breaks: toml++'s parse_error escapes the library as an exception.
  const auto path = write("broken.toml", "crc_threads = 2\nproviders = [\"tcp\"\n");
  const std::string message = error_of(Configuration::load(path));
  EXPECT_TRUE(contains(message, path.string() + ":")) << message;
  EXPECT_FALSE(Configuration::parse_toml("= 3"));
  EXPECT_FALSE(Configuration::parse_toml("crc_threads = 1\ncrc_threads = 2\n"));
}

TEST(Configuration, ShortProviderNamesMapToTheirLibfabricNames) {
  // Breaks: "tcp" or "verbs" is asked of fi_getinfo without the rxm layer and finds no RDM.
  EXPECT_EQ(canonical_provider("tcp"), "tcp;ofi_rxm");
  EXPECT_EQ(canonical_provider("verbs"), "verbs;ofi_rxm");
  EXPECT_EQ(canonical_provider("tcp;ofi_rxm"), "tcp;ofi_rxm");
  EXPECT_EQ(canonical_provider("efa-direct"), "efa-direct");
  EXPECT_EQ(canonical_provider("efa"), "efa");
  EXPECT_EQ(canonical_provider("shm"), "shm");
  EXPECT_EQ(canonical_provider(""), "");
}

// --- the schema: both parsers, the README, the examples --------------------------------------

std::string read_text(const std::filesystem::path& path) {
  std::ifstream file(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>()};
}

std::filesystem::path source_dir() { return DMA_SOURCE_DIR; }

bool is_numeric(settings::Kind kind) {
  return kind == settings::Kind::kInteger || kind == settings::Kind::kMilliseconds;
}

// One value of a setting's kind, spelled for TOML and as a module argument, and how the
// setting's `show` prints it once stored.
struct Sample {
  std::string toml;
  std::string argument;
  std::string shown;
};
Sample sample_for(const settings::Setting<Configuration>& setting) {
  switch (setting.kind) {
    case settings::Kind::kStringList:
      return {"[\"shm\", \"tcp\"]", "shm,tcp", "[\"shm\", \"tcp\"]"};
    case settings::Kind::kString:
      return {"\"10.0.0.7\"", "10.0.0.7", "\"10.0.0.7\""};
    case settings::Kind::kBoolean:
      return {"true", "true", "true"};
    case settings::Kind::kInteger:
    case settings::Kind::kMilliseconds:
      break;
  }
  const std::string number = std::to_string(setting.minimum + 2);
  return {number, number, number};
}

Result<ModuleOptions> from_arguments(std::vector<std::string> arguments) {
  return parse_module_arguments(arguments);
}

TEST(ConfigurationSchema, EveryFileKeyIsAlsoAModuleArgumentThatSetsTheSameField) {
  // Breaks: the module and TOML files configure the same field differently, or one of them
  // cannot set it at all (as the module could not set always_register_operands).
  for (const auto& setting : settings::configuration_settings()) {
    SCOPED_TRACE(std::string(setting.toml_name));
    ASSERT_FALSE(setting.toml_name.empty());
    ASSERT_FALSE(setting.argument_name.empty());
    const Sample sample = sample_for(setting);
    auto from_file = Configuration::parse_toml(std::string(setting.toml_name) + " = " +
                                               sample.toml + "\n");
    ASSERT_TRUE(from_file) << from_file.error().describe();
    auto from_module = from_arguments({std::string(setting.argument_name), sample.argument});
    ASSERT_TRUE(from_module) << from_module.error().describe();
    EXPECT_EQ(setting.show(*from_file), sample.shown);
    EXPECT_EQ(setting.show(from_module->configuration), sample.shown);
    EXPECT_NE(setting.show(Configuration{}), sample.shown) << "the sample is the default";
  }
}

TEST(ConfigurationSchema, BothParsersAcceptAndRefuseTheSameNumbersAtEachEndOfTheRange) {
  // Breaks: one parser caps a number the other lets through (the module capped crc-threads and
  // the deadlines, TOML did not), so the same setting loads from one and fails from the other.
  for (const auto& setting : settings::configuration_settings()) {
    if (!is_numeric(setting.kind)) continue;
    SCOPED_TRACE(std::string(setting.toml_name));
    const std::string key(setting.toml_name);
    const std::string name(setting.argument_name);
    std::vector<std::uint64_t> accepted = {setting.minimum, setting.maximum};
    std::vector<std::uint64_t> refused = {setting.maximum + 1};
    if (setting.minimum > 0) refused.push_back(setting.minimum - 1);
    for (const std::uint64_t value : accepted) {
      const std::string text = std::to_string(value);
      auto from_file = Configuration::parse_toml(key + " = " + text + "\n");
      ASSERT_TRUE(from_file) << text << ": " << from_file.error().describe();
      EXPECT_EQ(setting.show(*from_file), text);
      auto from_module = from_arguments({name, text});
      ASSERT_TRUE(from_module) << text << ": " << from_module.error().describe();
      EXPECT_EQ(setting.show(from_module->configuration), text);
    }
    for (const std::uint64_t value : refused) {
      const std::string text = std::to_string(value);
      // Past INT64_MAX a TOML integer is a syntax error, which is a refusal too.
      EXPECT_FALSE(Configuration::parse_toml(key + " = " + text + "\n")) << text;
      auto from_module = from_arguments({name, text});
      ASSERT_FALSE(from_module) << text;
      EXPECT_TRUE(contains(from_module.error().message(), name)) << from_module.error().message();
    }
  }
}

TEST(ConfigurationSchema, TheModuleOnlyArgumentsKeepTheirRanges) {
  // Breaks: services-per-domain 0 opens no endpoint, 65 more than the module was meant to
  // open; max-value-size 0 refuses every DMA.SET.
  for (const auto& setting : settings::module_settings()) {
    SCOPED_TRACE(std::string(setting.argument_name));
    EXPECT_TRUE(setting.toml_name.empty());
    // enable-debug, arena-huge-pages: the test below
    if (setting.kind == settings::Kind::kBoolean) continue;
    const std::string name(setting.argument_name);
    EXPECT_FALSE(from_arguments({name, std::to_string(setting.minimum - 1)}));
    auto lowest = from_arguments({name, std::to_string(setting.minimum)});
    ASSERT_TRUE(lowest) << lowest.error().describe();
    EXPECT_EQ(setting.show(*lowest), std::to_string(setting.minimum));
    if (setting.maximum != settings::kUnbounded) {
      EXPECT_FALSE(from_arguments({name, std::to_string(setting.maximum + 1)}));
    }
  }
  auto services = from_arguments({"services-per-domain", "64"});
  ASSERT_TRUE(services);
  EXPECT_EQ(services->services_per_domain, 64u);
}

TEST(ConfigurationSchema, AModuleBooleanIsTrueOrFalseAndNothingElse) {
  // Breaks: "yes" or "1" is silently read as false (or true), so the operator's intent is lost.
  auto on = from_arguments({"always-register-operands", "true"});
  ASSERT_TRUE(on) << on.error().describe();
  EXPECT_TRUE(on->configuration.always_register_operands);
  for (const char* wrong : {"yes", "1", "TRUE", ""}) {
    auto refused = from_arguments({"always-register-operands", wrong});
    ASSERT_FALSE(refused) << wrong;
    EXPECT_TRUE(contains(refused.error().message(), "always-register-operands"));
    EXPECT_TRUE(contains(refused.error().message(), "true or false"));
  }
  // The module's own boolean (enable-debug) is held to the same words.
  auto debug = from_arguments({"enable-debug", "true"});
  ASSERT_TRUE(debug) << debug.error().describe();
  EXPECT_TRUE(debug->enable_debug);
  EXPECT_FALSE(from_arguments({"enable-debug", "yes"}));
  auto plain = from_arguments({});
  ASSERT_TRUE(plain);
  EXPECT_FALSE(plain->enable_debug);
  // arena-huge-pages is on unless turned off, in the same words.
  EXPECT_TRUE(plain->arena_huge_pages);
  auto flat = from_arguments({"arena-huge-pages", "false"});
  ASSERT_TRUE(flat) << flat.error().describe();
  EXPECT_FALSE(flat->arena_huge_pages);
  EXPECT_FALSE(from_arguments({"arena-huge-pages", "no"}));
}

TEST(ConfigurationSchema, EachUnknownKeyMessageListsEveryNameOfItsTables) {
  // Breaks: the hint after a typo leaves out a real key (the lists were written by hand, and
  // the module's lacked the newer ones), so the operator cannot find the right spelling.
  const std::string file_message = error_of(Configuration::parse_toml("bogus = 1\n"));
  auto module_refusal = from_arguments({"bogus", "1"});
  ASSERT_FALSE(module_refusal);
  const std::string module_message = module_refusal.error().message();
  for (const auto& setting : settings::configuration_settings()) {
    EXPECT_TRUE(contains(file_message, setting.toml_name)) << file_message;
    EXPECT_TRUE(contains(module_message, setting.argument_name)) << module_message;
  }
  for (const auto& setting : settings::module_settings()) {
    EXPECT_TRUE(contains(module_message, setting.argument_name)) << module_message;
  }
}

TEST(ConfigurationSchema, AHugeOrHostileModuleArgumentIsClippedAndEscapedInTheError) {
  // Breaks: a megabyte-long or CR/LF-laden argument is written whole into the server's log at
  // load time (fuzz/ found the long one once the error was checked like client errors).
  for (const std::vector<std::string>& arguments :
       {std::vector<std::string>{std::string(100000, 'x'), "1"},
        std::vector<std::string>{"always-register-operands", std::string(100000, 'y')},
        std::vector<std::string>{"providers", "tcp", std::string(100000, 'z')}}) {
    auto refused = from_arguments(arguments);
    ASSERT_FALSE(refused);
    const std::string& message = refused.error().message();
    // The clipped argument and the list of known names (which grows with each setting).
    EXPECT_LT(message.size(), 600u) << message.substr(0, 600);
    EXPECT_TRUE(contains(message, "(100000 bytes)")) << message.substr(0, 400);
  }
  auto forged = from_arguments({"bad\r\nFAKE LOG", "1"});
  ASSERT_FALSE(forged);
  EXPECT_TRUE(contains(forged.error().message(), "bad\\x0d\\x0aFAKE LOG"));
}

TEST(ConfigurationSchema, ValidateHoldsAProgrammaticConfigurationToTheSameRanges) {
  // Breaks: a Configuration built in code runs with a deadline whose nanosecond comparison
  // overflows (every transfer times out at once) or a CRC pool of thousands of threads.
  Configuration configuration;
  configuration.crc_threads = settings::kMaxCrcThreads + 1;
  EXPECT_FALSE(configuration.validate());
  configuration = Configuration{};
  configuration.completion_deadline = milliseconds(settings::kMaxDeadlineMs + 1);
  EXPECT_FALSE(configuration.validate());
  configuration = Configuration{};
  configuration.progress_deadline = milliseconds(settings::kMaxDeadlineMs + 1);
  EXPECT_FALSE(configuration.validate());
  configuration.progress_deadline = milliseconds(settings::kMaxDeadlineMs);
  EXPECT_TRUE(configuration.validate());
}

TEST(ConfigurationSchema, TheReadmeNamesEveryKeyAndEveryArgumentOfTheSchema) {
  // Breaks: a setting is added to the table but an operator reading README.md never learns it
  // exists, or under which name.
  const std::string readme = read_text(source_dir() / "README.md");
  ASSERT_FALSE(readme.empty()) << "cannot read README.md";
  for (const auto& setting : settings::configuration_settings()) {
    EXPECT_TRUE(contains(readme, "`" + std::string(setting.toml_name) + "`")) << setting.toml_name;
    EXPECT_TRUE(contains(readme, "`" + std::string(setting.argument_name) + "`"))
        << setting.argument_name;
  }
  for (const auto& setting : settings::module_settings()) {
    EXPECT_TRUE(contains(readme, "`" + std::string(setting.argument_name) + "`"))
        << setting.argument_name;
  }
}

TEST(ConfigurationSchema, TheReadmeTableIsTheSchemaRendered) {
  // Breaks: README.md's ranges, defaults or help drift from what the parsers enforce. On a
  // failure, paste the expected table between the settings markers of README.md.
  const std::string readme = read_text(source_dir() / "README.md");
  const std::string begin = "<!-- settings:begin";
  const std::string end = "<!-- settings:end -->";
  const std::size_t start = readme.find(begin);
  ASSERT_NE(start, std::string::npos) << "README.md has no " << begin;
  const std::size_t body = readme.find('\n', start) + 1;
  const std::size_t stop = readme.find(end, body);
  ASSERT_NE(stop, std::string::npos) << "README.md has no " << end;
  EXPECT_EQ(readme.substr(body, stop - body), settings::render_markdown());
}

TEST(ConfigurationSchema, EveryShippedExampleConfigurationLoads) {
  // Breaks: examples/*.toml, which operators copy, hold a key or value the loader refuses.
  std::size_t loaded = 0;
  for (const auto& entry : std::filesystem::directory_iterator(source_dir() / "examples")) {
    if (entry.path().extension() != ".toml") continue;
    SCOPED_TRACE(entry.path().string());
    auto configuration = Configuration::load(entry.path());
    EXPECT_TRUE(configuration) << configuration.error().describe();
    ++loaded;
  }
  EXPECT_GE(loaded, 2u) << "examples/ lost its configuration files";
}

TEST(Configuration, AnOutOfRangeFileValueIsNamedWithTheBound) {
  // Breaks: crc_threads = 10000 starts ten thousand threads, or a deadline past 2^31-1 ms
  // overflows the worker's nanosecond comparisons, because only the module checked the bounds.
  std::string message = error_of(Configuration::parse_toml("crc_threads = 257\n"));
  EXPECT_TRUE(contains(message, "\"crc_threads\" must be an integer <= 256, not 257")) << message;
  message = error_of(Configuration::parse_toml("completion_deadline_ms = 2147483648\n"));
  EXPECT_TRUE(contains(message, "\"completion_deadline_ms\"")) << message;
  EXPECT_TRUE(contains(message, "2147483647")) << message;
  // Breaks: a worker told to poll for an hour after every burst spins a core for good.
  message = error_of(Configuration::parse_toml("worker_idle_poll_us = 1000001\n"));
  EXPECT_TRUE(contains(message, "\"worker_idle_poll_us\" must be an integer <= 1000000, not 1000001"))
      << message;
  Configuration configuration;
  configuration.worker_idle_poll = std::chrono::seconds(2);
  const Status invalid = configuration.validate();
  ASSERT_FALSE(invalid);
  message = invalid.error().message();
  EXPECT_TRUE(contains(message, "worker_idle_poll_us must be within 0..1000000, not 2000000"))
      << message;
}

}  // namespace
}  // namespace dma
