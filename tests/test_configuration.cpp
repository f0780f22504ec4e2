// Configuration: defaults, the TOML file format, its errors, and provider names.
#include <gtest/gtest.h>

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

#include "dma/configuration.hpp"
#include "dma/result.hpp"

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
                          "crc_threads = 4\n");
  auto loaded = Configuration::load(path);
  ASSERT_TRUE(loaded) << loaded.error().describe();
  EXPECT_EQ(loaded->providers, (std::vector<std::string>{"efa-direct", "verbs", "tcp"}));
  EXPECT_EQ(loaded->interfaces, (std::vector<std::string>{"rdmap0s6-rdm", "lo"}));
  EXPECT_EQ(loaded->bind, "127.0.0.1");
  EXPECT_EQ(loaded->max_in_flight, 0u);
  EXPECT_EQ(loaded->progress_deadline, milliseconds(250));
  EXPECT_EQ(loaded->completion_deadline, milliseconds(0));
  EXPECT_EQ(loaded->crc_threads, 4u);
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

}  // namespace
}  // namespace dma
