// Endpoint::open: providers are really tried in preference order, including past a provider
// that matches at fi_getinfo and opens its fabric and domain but refuses a later stage, and the
// final error says, provider by provider, which stage failed.
//
// The late failure is real, not injected: shm names an endpoint's region in /dev/shm
// "<source address>:<uid>:<endpoint index>", the index counting the shm endpoints this process
// has opened, and fi_enable refuses with -FI_EBUSY a name whose region records a live owner
// (docs/PROVIDERS.md, "shm"). Copying this process's own region to the next index's name makes
// the next shm endpoint pass fi_getinfo, fi_fabric, fi_domain, fi_av_open, fi_cq_open and
// fi_endpoint, then fail at fi_enable.
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>
#include <system_error>

#include "dma/configuration.hpp"
#include "dma/result.hpp"
#include "fabric/endpoint.hpp"

namespace dma::internal {
namespace {

constexpr std::string_view kShmPrefix = "fi_shm://";

// The /dev/shm file behind an shm endpoint address ("fi_shm://<name>:<uid>:<index>\0"), and the
// one the next shm endpoint of this process will create. Holds a copy of the first under the
// second's name while it lives, so that endpoint's fi_enable finds its name taken by a live
// process. Owned by one test.
class OccupiedNextShmName {
 public:
  // Empty (and a test failure) if `address` is not an shm address of the expected shape.
  static std::unique_ptr<OccupiedNextShmName> after(const Endpoint& shm) {
    const auto& bytes = shm.local_address();
    std::string name(bytes.begin(), bytes.end());
    name = name.c_str();  // drop the terminating NUL shm includes
    const std::size_t colon = name.rfind(':');
    if (name.rfind(kShmPrefix, 0) != 0 || colon == std::string::npos) {
      ADD_FAILURE() << "not an shm address: " << name;
      return nullptr;
    }
    const std::string region = name.substr(kShmPrefix.size());
    const std::size_t index_at = colon - kShmPrefix.size() + 1;
    const int index = std::stoi(region.substr(index_at));
    const std::filesystem::path current = "/dev/shm/" + region;
    const std::filesystem::path next =
        "/dev/shm/" + region.substr(0, index_at) + std::to_string(index + 1);
    std::error_code error;
    std::filesystem::copy_file(current, next, error);
    if (error) {
      ADD_FAILURE() << "copying " << current << " to " << next << ": " << error.message();
      return nullptr;
    }
    return std::unique_ptr<OccupiedNextShmName>(new OccupiedNextShmName(next));
  }
  ~OccupiedNextShmName() {
    std::error_code ignored;  // shm may have unlinked it already
    std::filesystem::remove(path_, ignored);
  }
  OccupiedNextShmName(const OccupiedNextShmName&) = delete;
  OccupiedNextShmName& operator=(const OccupiedNextShmName&) = delete;

 private:
  explicit OccupiedNextShmName(std::filesystem::path path) : path_(std::move(path)) {}
  std::filesystem::path path_;
};

// An shm endpoint of this process, whose region the next one's name is copied from.
std::unique_ptr<Endpoint> open_shm() {
  Configuration configuration;
  configuration.providers = {"shm"};
  auto endpoint = Endpoint::open(configuration, Role::kInitiator);
  if (!endpoint) {
    ADD_FAILURE() << "shm endpoint: " << endpoint.error().describe();
    return nullptr;
  }
  return std::move(*endpoint);
}

TEST(Endpoint, AProviderRefusingAtEnableGivesWayToTheNextInThePreferenceList) {
  // Breaks: "providers are tried in order" holds only for fi_getinfo, fi_fabric and fi_domain;
  // a provider that refuses at its address vector, completion queue, endpoint, bind or enable
  // ends Endpoint::open with an error though a later provider would have opened.
  auto shm = open_shm();
  ASSERT_TRUE(shm);
  auto occupied = OccupiedNextShmName::after(*shm);
  ASSERT_TRUE(occupied);
  Configuration configuration;
  configuration.providers = {"shm", "tcp"};
  configuration.bind = "127.0.0.1";

  auto opened = Endpoint::open(configuration, Role::kInitiator);

  ASSERT_TRUE(opened) << "tcp should have opened after shm refused: "
                      << opened.error().describe();
  EXPECT_EQ((*opened)->describe().provider, "tcp;ofi_rxm");
  EXPECT_FALSE((*opened)->local_address().empty());
}

TEST(Endpoint, WhenEveryProviderFailsTheErrorNamesEachOnesFailingStage) {
  // Breaks: an operator sees "no provider could open" without learning that shm got as far as
  // fi_enable (a stale or taken region name) while the other provider does not exist here.
  auto shm = open_shm();
  ASSERT_TRUE(shm);
  auto occupied = OccupiedNextShmName::after(*shm);
  ASSERT_TRUE(occupied);
  Configuration configuration;
  configuration.providers = {"shm", "no-such-provider"};

  auto opened = Endpoint::open(configuration, Role::kInitiator);

  ASSERT_FALSE(opened) << "shm's name was taken and the other provider does not exist";
  EXPECT_EQ(opened.error().code(), ErrorCode::kNotFound);
  const std::string& message = opened.error().message();
  EXPECT_NE(message.find("shm: fi_enable failed"), std::string::npos) << message;
  EXPECT_NE(message.find("no-such-provider: fi_getinfo(no-such-provider) failed"),
            std::string::npos)
      << message;
  EXPECT_LT(message.find("shm:"), message.find("no-such-provider:"))
      << "reasons in preference order: " << message;
}

TEST(Endpoint, AProviderThatFailedLateOpensAgainOnceTheCauseIsGone) {
  // Breaks: a half-opened provider is not closed again (its domain, address vector, completion
  // queue and endpoint leak, or its region name stays taken), so the same provider cannot open
  // afterwards.
  auto shm = open_shm();
  ASSERT_TRUE(shm);
  Configuration configuration;
  configuration.providers = {"shm"};
  {
    auto occupied = OccupiedNextShmName::after(*shm);
    ASSERT_TRUE(occupied);
    ASSERT_FALSE(Endpoint::open(configuration, Role::kInitiator)) << "the name was taken";
  }

  auto reopened = Endpoint::open(configuration, Role::kInitiator);

  ASSERT_TRUE(reopened) << reopened.error().describe();
  EXPECT_EQ((*reopened)->describe().provider, "shm");
}

}  // namespace
}  // namespace dma::internal
