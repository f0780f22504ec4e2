// dma-cli: one side of a transfer per process, for scripts, tests and dma-demo.
//
//   dma-cli target --provider P [--bind ADDR] --size N [--fill SEED] [--config FILE]
//     Exposes N bytes, prints its advertisement (dma::to_wire) as the first line of stdout, then
//     answers one line per command read from stdin (see kTargetCommands). EOF or `quit` exits 0.
//   dma-cli initiator --provider P [--bind ADDR] --op write|read --length N [--offset O]
//                     [--seed S] [--advertisement "<hex> <key> <addr>"] [--config FILE]
//     Moves one transfer against an advertisement (or the first line of stdin) and prints
//     `bytes=<n> crc32c=<crc> seconds=<t> gbps=<gigabits per second>`.
//
// Exit codes: 0 success; 1 a fabric or runtime failure (its describe() on stderr); 2 a usage
// error or a malformed advertisement (the parser's message on stderr).
#include <CLI/CLI.hpp>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <tuple>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "dma/configuration.hpp"
#include "dma/protocol.hpp"
#include "dma/service.hpp"
#include "dma/client.hpp"
#include "dma/target.hpp"
#include "support/owned_bytes.hpp"
#include "support/pattern.hpp"

namespace {

constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;
constexpr auto kTransferTimeout = std::chrono::seconds(60);

const char* const kTargetCommands =
    "commands (one per line; each answers one line):\n"
    "  crc [OFFSET LENGTH]          CRC32C of the buffer (or of the range), decimal\n"
    "  verify SEED [OFFSET LENGTH]  `ok` or `mismatch at <offset>` against SEED's pattern\n"
    "  fill SEED [OFFSET LENGTH]    refill with SEED's pattern; `ok`\n"
    "  put OFFSET HEX               write HEX's bytes at OFFSET (a session proof's nonce); `ok`\n"
    "  initiator HEX                add an initiator's fabric address; `ok` or `error: ...`\n"
    "  quit                         exit 0 (as does EOF)\n";

// The options both subcommands share.
struct Common {
  std::string provider;
  std::string bind = "127.0.0.1";
  std::string config_path;
};

void add_common(CLI::App& command, Common& common) {
  command.add_option("--provider", common.provider, "libfabric provider (tcp, net, shm, ...)")
      ->required();
  command.add_option("--bind", common.bind, "local address to bind")->capture_default_str();
  command.add_option("--config", common.config_path, "TOML configuration file")
      ->check(CLI::ExistingFile);
}

dma::Result<dma::Configuration> configuration_of(const Common& common) {
  dma::Configuration configuration;
  if (!common.config_path.empty()) {
    DMA_TRY_ASSIGN(configuration, dma::Configuration::load(common.config_path));
  }
  configuration.providers = {common.provider};
  configuration.bind = common.bind;
  return configuration;
}

using dma::support::OwnedBytes;

dma::Result<std::uint32_t> parse_seed(std::string_view text) {
  DMA_TRY_ASSIGN(const auto value, dma::parse_decimal(text, "seed"));
  if (value > UINT32_MAX) {
    return dma::fail(dma::ErrorCode::kInvalidArgument, "seed must fit in 32 bits");
  }
  return static_cast<std::uint32_t>(value);
}

// Bytes [OFFSET, OFFSET + LENGTH) of `whole` named by the optional trailing command words, or
// all of it when they are absent.
dma::Result<std::span<std::byte>> range_of(std::span<std::byte> whole,
                                           const std::vector<std::string>& words,
                                           std::size_t first) {
  if (words.size() == first) return whole;
  if (words.size() != first + 2) {
    return dma::fail(dma::ErrorCode::kInvalidArgument, "expected OFFSET LENGTH or nothing");
  }
  DMA_TRY_ASSIGN(const auto offset, dma::parse_decimal(words[first], "offset"));
  DMA_TRY_ASSIGN(const auto length, dma::parse_decimal(words[first + 1], "length"));
  if (offset > whole.size() || length > whole.size() - offset) {
    return dma::fail(dma::ErrorCode::kInvalidArgument,
                     "range " + std::to_string(offset) + "+" + std::to_string(length) +
                         " exceeds the buffer of " + std::to_string(whole.size()) + " bytes");
  }
  return whole.subspan(offset, length);
}

// One command line's reply (without the newline).
std::string answer(dma::Target& target, std::span<std::byte> buffer, const std::string& line) {
  std::istringstream split(line);
  std::vector<std::string> words;
  for (std::string word; split >> word;) words.push_back(word);
  if (words.empty()) return "error: empty command";
  const std::string& verb = words[0];
  // The server's accesses so far before ours.
  target.synchronize();
  if (verb == "crc") {
    auto range = range_of(buffer, words, 1);
    if (!range) return "error: " + range.error().message();
    return std::to_string(dma::crc32c(*range));
  }
  if (verb == "verify" || verb == "fill") {
    if (words.size() < 2) return "error: " + verb + " needs a SEED";
    auto seed = parse_seed(words[1]);
    if (!seed) return "error: " + seed.error().message();
    auto range = range_of(buffer, words, 2);
    if (!range) return "error: " + range.error().message();
    if (verb == "fill") {
      dma::support::fill_pattern(*range, *seed);
      target.synchronize();  // our writes before the server's next access
      return "ok";
    }
    auto mismatch = dma::support::find_mismatch(*range, *seed);
    return mismatch ? "mismatch at " + std::to_string(*mismatch) : "ok";
  }
  if (verb == "put") {
    if (words.size() != 3) return "error: put needs OFFSET HEX";
    auto bytes = dma::hex_decode(words[2]);
    if (!bytes) return "error: " + bytes.error().message();
    std::vector<std::string> range_words = {words[0], words[1], std::to_string(bytes->size())};
    auto range = range_of(buffer, range_words, 1);
    if (!range) return "error: " + range.error().message();
    std::memcpy(range->data(), bytes->data(), bytes->size());
    target.synchronize();  // our writes before the server's next access
    return "ok";
  }
  if (verb == "initiator") {
    if (words.size() != 2) return "error: initiator needs one HEX address";
    auto address = dma::hex_decode(words[1]);
    if (!address) return "error: " + address.error().message();
    dma::Status added = target.add_initiator(*address);
    return added ? "ok" : "error: " + added.error().describe();
  }
  return "error: unknown command '" + verb + "'";
}

int run_target(const Common& common, std::size_t size, std::optional<std::uint32_t> fill_seed) {
  auto configuration = configuration_of(common);
  if (!configuration) {
    std::cerr << "dma-cli: " << configuration.error().describe() << "\n";
    return kExitUsage;
  }
  auto target = dma::Target::open(*configuration);
  if (!target) {
    std::cerr << "dma-cli: " << target.error().describe() << "\n";
    return kExitFailure;
  }
  // Declared after the target and before the exposure: the registration closes first, then the
  // memory goes, then the endpoint.
  std::vector<std::byte> buffer(size);
  if (fill_seed) dma::support::fill_pattern(buffer, *fill_seed);
  auto exposed = (*target)->expose(buffer.data(), buffer.size());
  if (!exposed) {
    std::cerr << "dma-cli: " << exposed.error().describe() << "\n";
    return kExitFailure;
  }
  (*target)->synchronize();  // the fill before any server read
  std::cout << dma::to_wire(exposed->advertisement()) << std::endl;
  std::cerr << "dma-cli: target " << (*target)->describe().to_string() << "\n";

  for (std::string line; std::getline(std::cin, line);) {
    if (line == "quit") break;
    std::cout << answer(**target, buffer, line) << std::endl;
  }
  return 0;
}

struct InitiatorOptions {
  std::string op;
  std::size_t length = 0;
  std::uint64_t offset = 0;
  std::uint32_t seed = 1;
  std::optional<std::string> advertisement;
};

int run_initiator(const Common& common, const InitiatorOptions& options) {
  std::string wire;
  if (options.advertisement) {
    wire = *options.advertisement;
  } else if (!std::getline(std::cin, wire)) {
    std::cerr << "dma-cli: no advertisement on stdin\n";
    return kExitUsage;
  }
  auto advertisement = dma::parse_advertisement(wire);
  if (!advertisement) {
    std::cerr << "dma-cli: bad advertisement: " << advertisement.error().message() << "\n";
    return kExitUsage;
  }
  auto peer = dma::FabricAddress::from(advertisement->address);
  if (!peer) {
    std::cerr << "dma-cli: bad advertisement: " << peer.error().message() << "\n";
    return kExitUsage;
  }
  auto configuration = configuration_of(common);
  if (!configuration) {
    std::cerr << "dma-cli: " << configuration.error().describe() << "\n";
    return kExitUsage;
  }
  auto service = dma::FabricService::start(*configuration, nullptr, nullptr);
  if (!service) {
    std::cerr << "dma-cli: " << service.error().describe() << "\n";
    return kExitFailure;
  }
  std::cerr << "dma-cli: initiator " << dma::hex_encode((*service)->local_address()) << " "
            << (*service)->describe().to_string() << "\n";

  const bool write = options.op == "write";
  dma::TransferRequest request = dma::TransferRequest::single(
      1, *peer, advertisement->key, advertisement->remote_address + options.offset,
      write ? dma::Direction::kToPeer : dma::Direction::kFromPeer, options.length,
      std::make_unique<OwnedBytes>(write ? dma::support::make_pattern(options.length, options.seed)
                                         : std::vector<std::byte>{}));
  request.want_checksum = true;

  const auto started = std::chrono::steady_clock::now();
  auto handle = (*service)->transfer(std::move(request));
  if (!handle) {
    std::cerr << "dma-cli: " << handle.error().describe() << "\n";
    return kExitFailure;
  }
  dma::Outcome outcome = handle->wait_for(kTransferTimeout);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  if (!outcome) {
    std::cerr << "dma-cli: " << outcome.error().describe() << "\n";
    // ~FabricService waits for what is in flight; a transfer that never completes would hang
    // us there, so leave without it.
    if (outcome.error().code() == dma::ErrorCode::kTimedOut) std::_Exit(kExitFailure);
    return kExitFailure;
  }
  const double gbps = seconds > 0 ? static_cast<double>(outcome->bytes) * 8 / seconds / 1e9 : 0;
  std::printf("bytes=%zu crc32c=%" PRIu32 " seconds=%.6f gbps=%.3f\n", outcome->bytes,
              outcome->checksum.value_or(0), seconds, gbps);
  std::fflush(stdout);
  return 0;
}

struct KeyValueOptions {
  std::string host = "127.0.0.1";
  int port = 6379;
  std::string key;
  std::string file;
  std::size_t max_size = 64 << 20;
};

// dma-cli get|set: one value between a file and a redis-server running the dma module.
int run_key_value(const Common& common, const KeyValueOptions& options, bool is_get) {
  auto configuration = configuration_of(common);
  if (!configuration) {
    std::cerr << "dma-cli: " << configuration.error().describe() << "\n";
    return kExitUsage;
  }
  auto client = dma::Client::connect(options.host, options.port, *configuration);
  if (!client) {
    std::cerr << "dma-cli: " << client.error().describe() << "\n";
    return kExitFailure;
  }
  if (dma::Status said = (*client)->hello(); !said) {
    std::cerr << "dma-cli: DMA.HELLO: " << said.error().describe() << "\n";
    return kExitFailure;
  }
  if (is_get) {
    std::vector<std::byte> buffer(options.max_size);
    auto got = (*client)->get(options.key, buffer);
    if (!got) {
      std::cerr << "dma-cli: DMA.GET: " << got.error().describe() << "\n";
      return kExitFailure;
    }
    if (!got->has_value()) {
      std::cerr << "dma-cli: no such key: " << options.key << "\n";
      return kExitFailure;
    }
    std::ofstream out(options.file, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(buffer.data()), static_cast<std::streamsize>(**got));
    if (!out) {
      std::cerr << "dma-cli: cannot write " << options.file << "\n";
      return kExitFailure;
    }
    std::printf("%zu bytes -> %s\n", **got, options.file.c_str());
    return 0;
  }
  std::ifstream in(options.file, std::ios::binary);
  if (!in) {
    std::cerr << "dma-cli: cannot read " << options.file << "\n";
    return kExitUsage;
  }
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  dma::Status stored = (*client)->set(options.key, std::as_bytes(std::span<const char>(bytes)));
  if (!stored) {
    std::cerr << "dma-cli: DMA.SET: " << stored.error().describe() << "\n";
    return kExitFailure;
  }
  std::printf("%zu bytes <- %s\n", bytes.size(), options.file.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dma-cli: expose a buffer (target) or move one transfer (initiator)"};
  app.require_subcommand(1);

  Common target_common;
  std::size_t size = 0;
  std::optional<std::uint32_t> fill_seed;
  CLI::App* target = app.add_subcommand("target", "expose a buffer and serve stdin commands");
  target->footer(kTargetCommands);
  add_common(*target, target_common);
  target->add_option("--size", size, "bytes to expose")->required()->check(CLI::PositiveNumber);
  target->add_option("--fill", fill_seed, "fill with the pattern of this seed");

  Common initiator_common;
  InitiatorOptions options;
  CLI::App* initiator = app.add_subcommand("initiator", "move one transfer against a target");
  add_common(*initiator, initiator_common);
  initiator->add_option("--op", options.op, "write or read")
      ->required()
      ->check(CLI::IsMember({"write", "read"}));
  initiator->add_option("--length", options.length, "bytes to move")->required();
  initiator->add_option("--offset", options.offset, "offset into the advertised buffer");
  initiator->add_option("--seed", options.seed, "pattern seed of a write")->capture_default_str();
  initiator->add_option("--advertisement", options.advertisement,
                        "\"<hex> <key> <addr>\"; default: the first line of stdin");

  Common get_common;
  Common set_common;
  KeyValueOptions get_options;
  KeyValueOptions set_options;
  CLI::App* get = app.add_subcommand("get", "DMA.GET KEY from a redis-server with the module into FILE");
  CLI::App* set = app.add_subcommand("set", "DMA.SET KEY on a redis-server with the module from FILE");
  for (auto [command, common, kv] : {std::tuple{get, &get_common, &get_options},
                                     std::tuple{set, &set_common, &set_options}}) {
    add_common(*command, *common);
    command->add_option("--host", kv->host, "redis-server host")->capture_default_str();
    command->add_option("--port", kv->port, "redis-server port")->capture_default_str();
    command->add_option("KEY", kv->key, "the key")->required();
    command->add_option("FILE", kv->file, "the file to read or write")->required();
  }
  get->add_option("--max-size", get_options.max_size, "largest value accepted")
      ->capture_default_str();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    const int code = app.exit(error);
    return code == 0 ? 0 : kExitUsage;
  }
  if (*target) return run_target(target_common, size, fill_seed);
  if (*get) return run_key_value(get_common, get_options, true);
  if (*set) return run_key_value(set_common, set_options, false);
  return run_initiator(initiator_common, options);
}
