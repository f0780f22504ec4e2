#include "dma/client.hpp"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <thread>

#include "dma/protocol.hpp"

namespace dma {
namespace {

using redis::Reply;

// One command; a transport failure or an error reply is an Error.
Result<Reply> run(redisContext* connection, const std::vector<std::string>& arguments) {
  const std::vector<std::string_view> views(arguments.begin(), arguments.end());
  return redis::command(connection, views);
}

// [length, crc32c] from DMA.GET or DMA.SET.
Result<std::pair<std::uint64_t, std::uint32_t>> length_and_crc(const redisReply& reply,
                                                               std::string_view command) {
  if (reply.type != REDIS_REPLY_ARRAY || reply.elements != 2 ||
      reply.element[0]->type != REDIS_REPLY_INTEGER ||
      reply.element[1]->type != REDIS_REPLY_INTEGER || reply.element[0]->integer < 0 ||
      reply.element[1]->integer < 0) {
    return fail(ErrorCode::kInvalidArgument,
                std::string(command) + " returned something other than [length, crc32c]");
  }
  return std::pair{static_cast<std::uint64_t>(reply.element[0]->integer),
                   static_cast<std::uint32_t>(reply.element[1]->integer)};
}

// `arguments` followed by the whole of `exposed` as <rkey> <addr> <len>.
std::vector<std::string> with_region(std::vector<std::string> arguments, const Exposed& exposed) {
  const RemoteRegion region = exposed.whole();
  arguments.push_back(std::to_string(region.key));
  arguments.push_back(std::to_string(region.address));
  arguments.push_back(std::to_string(region.length));
  return arguments;
}

}  // namespace

struct Client::Node {
  Node(redisContext* opened, std::string named) : connection(opened), name(std::move(named)) {}
  ~Node() { redisFree(connection); }
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;
  redisContext* connection;
  std::string name;  // "host:port", as connect() was given it or a redirection named it
  bool proven = false;
  // The server's first endpoint address (hello): Target::initiator_exited tells, on shm, when
  // its process is gone and with it its writes into what a failed DMA.GET left it.
  std::vector<std::uint8_t> address;
};

struct Client::Left {
  const std::byte* begin = nullptr;
  std::size_t length = 0;
  // The server's address. Closing the target ends its writes on every provider; on shm its
  // process's exit ends them before that (Target::initiator_exited).
  std::vector<std::uint8_t> server;
  std::vector<std::byte> owned;  // get(key)'s own buffer, held until settled

  bool overlaps(std::span<const std::byte> memory) const noexcept {
    const auto* end = begin + length;
    return !memory.empty() && memory.data() < end && begin < memory.data() + memory.size();
  }
};

namespace {

Result<redisContext*> open_connection(const std::string& host, int port,
                                      std::chrono::milliseconds limit) {
  const timeval timeout{static_cast<time_t>(limit.count() / 1000),
                        static_cast<suseconds_t>((limit.count() % 1000) * 1000)};
  redisContext* connection = redisConnectWithTimeout(host.c_str(), port, timeout);
  if (connection == nullptr) {
    return fail(ErrorCode::kResourceExhausted, "cannot allocate a redis connection");
  }
  if (connection->err != 0) {
    std::string message = "cannot connect to " + host + ":" + std::to_string(port) + ": " +
                          connection->errstr;
    redisFree(connection);
    return fail(ErrorCode::kUnreachable, std::move(message));
  }
  redisSetTimeout(connection, timeout);
  return connection;
}

}  // namespace

Client::Client(redisContext* connection, std::string name, std::unique_ptr<Target> target,
               Options options)
    : timeout_(options.timeout),
      busy_poll_(options.busy_poll),
      expect_window_(options.expect_window),
      inline_wanted_(options.inline_max),
      target_(std::move(target)) {
  nodes_.push_back(std::make_unique<Node>(connection, std::move(name)));
}

Target::Busy Client::busy() { return busy_poll_ ? target_->busy() : Target::Busy(); }

void Client::expect_transfer(Target::Expected what) {
  // Awake when it comes, where our target's progress serves it (Options::expect_window).
  if (!busy_poll_ && expect_window_.count() > 0) (void)target_->expect(what, expect_window_);
}

// The connections close first (servers drop the sessions), then the target, then what failed
// GETs left to their servers: once the target's endpoint is closed nothing lands in it.
Client::~Client() {
  nodes_.clear();
  target_.reset();
}

void Client::settle() {
  std::erase_if(left_,
                [this](const Left& left) { return target_->initiator_exited(left.server); });
}

bool Client::server_may_write(std::span<const std::byte> memory) {
  settle();
  return std::any_of(left_.begin(), left_.end(),
                     [&](const Left& left) { return left.overlaps(memory); });
}

std::size_t Client::unsettled() {
  settle();
  return left_.size();
}

Status Client::refuse_if_left(std::span<const std::byte> memory) {
  if (left_.empty() || !server_may_write(memory)) return {};
  return fail(ErrorCode::kInvalidArgument,
              "DMA.GET: a server may still write into this buffer (an earlier DMA.GET into it "
              "failed without its reply); see Client::server_may_write");
}

Result<Reply> Client::route_landing(std::string_view key,
                                    const std::vector<std::string>& arguments,
                                    const Exposed& landing) {
  routed_ = nullptr;
  routed_sent_ = false;
  auto reply = route(key, arguments, /*transfers=*/true);
  if (reply || reply.error().code() != ErrorCode::kUnreachable || !routed_sent_ ||
      routed_ == nullptr) {
    return reply;
  }
  // Sent, never answered: the server may have the command and may still do its write.
  Left left;
  left.begin = landing.data();
  left.length = landing.length();
  left.server = routed_->address;
  left_.push_back(std::move(left));
  return fail(ErrorCode::kUnreachable,
              reply.error().message() +
                  "; the server may still write into the buffer (Client::server_may_write)");
}

std::size_t Client::sessions() const noexcept {
  return static_cast<std::size_t>(
      std::count_if(nodes_.begin(), nodes_.end(), [](const auto& node) { return node->proven; }));
}

Result<std::unique_ptr<Client>> Client::connect(const std::string& host, int port,
                                                const Configuration& configuration) {
  return connect(host, port, configuration, Options{});
}

Result<std::unique_ptr<Client>> Client::connect(const std::string& host, int port,
                                                const Configuration& configuration,
                                                Options options) {
  DMA_TRY_ASSIGN(redisContext* connection, open_connection(host, port, options.timeout));
  auto target = Target::open(configuration);
  if (!target) {
    redisFree(connection);
    return fail(std::move(target).error());
  }
  return std::unique_ptr<Client>(new Client(connection, host + ":" + std::to_string(port),
                                            std::move(*target), options));
}

Result<Client::Node*> Client::node_named(const std::string& host, int port) {
  const std::string name = host + ":" + std::to_string(port);
  for (const auto& node : nodes_) {
    if (node->name == name) return node.get();
  }
  DMA_TRY_ASSIGN(redisContext* connection, open_connection(host, port, timeout_));
  nodes_.push_back(std::make_unique<Node>(connection, name));
  return nodes_.back().get();
}

Result<Reply> Client::route(std::string_view key, const std::vector<std::string>& arguments,
                            bool transfers) {
  const std::vector<std::string_view> views(arguments.begin(), arguments.end());
  return route(key, std::span<const std::string_view>(views), transfers);
}

Result<Reply> Client::route(std::string_view key, std::span<const std::string_view> arguments,
                            bool transfers) {
  // The node -MOVED last named for the key's slot, else the one connect() reached.
  auto serving = [&]() -> Node* {
    if (slots_.empty()) return nodes_.front().get();
    Node* known = slots_[static_cast<std::size_t>(redis::key_slot(key))];
    return known != nullptr ? known : nodes_.front().get();
  };
  Node* node = serving();
  bool asking = false;
  bool rehelloed = false;
  for (int redirection = 0; redirection <= kMaxRedirections; ++redirection) {
    if (!node->proven) DMA_TRY(hello_on(*node));
    routed_ = node;
    routed_sent_ = false;
    auto reply = [&]() -> Result<Reply> {
      const Target::Busy busy = transfers ? this->busy() : Target::Busy();
      if (asking) {
        // ASKING applies to the next command on this connection only: pipelined with it.
        const std::string_view ask[] = {"ASKING"};
        DMA_TRY(redis::send(node->connection, ask));
        DMA_TRY(redis::send(node->connection, arguments));
        routed_sent_ = true;
        DMA_TRY_ASSIGN(const Reply asked, redis::receive(node->connection));
        (void)asked;  // +OK; an error here shows in the command's own reply
        return redis::receive(node->connection);
      }
      DMA_TRY(redis::send(node->connection, arguments));
      routed_sent_ = true;
      return redis::receive(node->connection);
    }();
    if (!reply) return fail(std::move(reply).error());
    if ((*reply)->type != REDIS_REPLY_ERROR) return reply;
    const std::string_view error((*reply)->str, (*reply)->len);
    if (auto redirect = redis::parse_redirection(error)) {
      DMA_TRY_ASSIGN(node, node_named(redirect->host, redirect->port));
      asking = redirect->ask;
      if (!redirect->ask) {
        if (slots_.empty()) slots_.assign(16384, nullptr);
        slots_[static_cast<std::size_t>(redirect->slot)] = node;
      }
      continue;
    }
    if (error.starts_with("REHELLO") && !rehelloed) {
      // The server's endpoint was replaced: the session is reset there and a new hello (to the
      // new address) is needed. The reply is an error, so the command did not take effect (a
      // DMA.SET that fails leaves its key untouched): say hello again and send it once more.
      // Only on this reply, never after a lost connection (a SET may have happened then).
      rehelloed = true;
      node->proven = false;
      asking = false;
      continue;
    }
    if (error.starts_with("TRYAGAIN")) {
      // The slot is moving (a DMA.SET's read outlived its node's ownership, or a multi-key
      // command met a migration): send it again, to whoever serves the slot by now.
      std::this_thread::sleep_for(std::chrono::milliseconds(2 * (redirection + 1)));
      asking = false;
      node = serving();
      continue;
    }
    return fail(ErrorCode::kInvalidArgument,
                std::string(arguments.empty() ? "" : arguments[0]) + " failed: " +
                    std::string(error));
  }
  return fail(ErrorCode::kUnreachable,
              std::string(arguments.empty() ? "" : arguments[0]) + " on a key of slot " +
                  std::to_string(redis::key_slot(key)) + ": more than " +
                  std::to_string(kMaxRedirections) + " redirections");
}

Status Client::hello() { return hello_on(*nodes_.front()); }

Status Client::hello_on(Node& node) {
  DMA_TRY_ASSIGN(const auto reply,
                 run(node.connection, {"DMA.HELLO", hex_encode(target_->local_address())}));
  // [<nonce-hex>, [<server-address-hex>, ...], <inline-max>]; a server without inline values
  // answers the first two only.
  const redisReply& answer = *reply;
  if (answer.type != REDIS_REPLY_ARRAY || (answer.elements != 2 && answer.elements != 3) ||
      answer.element[0]->type != REDIS_REPLY_STRING ||
      answer.element[1]->type != REDIS_REPLY_ARRAY || answer.element[1]->elements == 0 ||
      (answer.elements == 3 &&
       (answer.element[2]->type != REDIS_REPLY_INTEGER || answer.element[2]->integer < 0))) {
    return fail(ErrorCode::kInvalidArgument,
                "DMA.HELLO returned something other than [nonce, [server addresses], inline-max]");
  }
  const std::size_t server_inline =
      answer.elements == 3 ? static_cast<std::size_t>(answer.element[2]->integer) : 0;
  DMA_TRY_ASSIGN(const auto nonce,
                 hex_decode(std::string_view(answer.element[0]->str, answer.element[0]->len)));
  if (nonce.empty()) return fail(ErrorCode::kInvalidArgument, "DMA.HELLO returned an empty nonce");
  const redisReply& listed = *answer.element[1];
  std::vector<std::vector<std::uint8_t>> addresses;
  for (std::size_t index = 0; index < listed.elements; ++index) {
    const redisReply* element = listed.element[index];
    if (element->type != REDIS_REPLY_STRING) {
      return fail(ErrorCode::kInvalidArgument, "DMA.HELLO returned a non-string address");
    }
    DMA_TRY_ASSIGN(auto address, hex_decode(std::string_view(element->str, element->len)));
    // Before the proof: the server's read of the nonce needs it on efa-direct.
    DMA_TRY(target_->add_initiator(address));
    addresses.push_back(std::move(address));
  }
  // Every endpoint of a server is in its one process: the first address names it.
  node.address = addresses.front();

  // The proof: the nonce in memory exposed on our own endpoint, read back by the server. The
  // buffer and its registration only have to live until DMA.PROVE's reply.
  std::vector<std::byte> proof(nonce.size());
  std::memcpy(proof.data(), nonce.data(), nonce.size());
  DMA_TRY_ASSIGN(const Exposed exposed, target_->expose(proof.data(), proof.size()));
  target_->synchronize();  // our writes to `proof` before the server's read
  auto proven = [&] {
    const Target::Busy busy = this->busy();  // the server reads the proof before replying
    return run(node.connection, with_region({"DMA.PROVE"}, exposed));
  }();
  target_->synchronize();  // the provider's sends from `proof` before it is freed
  if (!proven) return fail(std::move(proven).error());
  if ((*proven)->type != REDIS_REPLY_STATUS) {
    return fail(ErrorCode::kInvalidArgument, "DMA.PROVE returned something other than OK");
  }
  const bool home = &node == nodes_.front().get();
  const std::size_t node_inline = std::min(inline_wanted_, server_inline);
  // In a cluster, the smallest inline-max of the nodes: a value inline for one must not be
  // refused by another (redirections are followed below the inline decision).
  inline_max_ = home || sessions() == 0 ? node_inline : std::min(inline_max_, node_inline);
  node.proven = true;
  if (home) server_addresses_ = std::move(addresses);
  return {};
}

Result<std::optional<Client::Answer>> Client::get_inline(std::string_view key, std::size_t most,
                                                         const Exposed* landing) {
  char most_digits[24];
  const std::string_view most_text(
      most_digits, static_cast<std::size_t>(
                       std::to_chars(most_digits, most_digits + sizeof most_digits, most).ptr -
                       most_digits));
  auto reply = [&]() -> Result<Reply> {
    if (landing == nullptr) {
      // The inline path, every small GET: nothing allocated for the command.
      const std::string_view arguments[] = {"DMA.GET", key, "INLINE", most_text};
      return route(key, arguments, /*transfers=*/false);
    }
    // Only a transfer into `landing` needs the target's progress before the reply, and only a
    // value larger than `most` (so only a landing larger than it) travels that way.
    if (landing->length() > most) expect_transfer(Target::Expected::kWrite);
    return route_landing(
        key,
        with_region({"DMA.GET", std::string(key), "INLINE", std::string(most_text)}, *landing),
        *landing);
  }();
  if (!reply) return fail(std::move(reply).error());
  const redisReply& got = **reply;
  if (got.type == REDIS_REPLY_NIL) return std::optional<Answer>();
  // [length, crc32c] or, inline, [length, crc32c, bytes].
  if (got.type != REDIS_REPLY_ARRAY || (got.elements != 2 && got.elements != 3) ||
      got.element[0]->type != REDIS_REPLY_INTEGER || got.element[0]->integer < 0 ||
      got.element[1]->type != REDIS_REPLY_INTEGER || got.element[1]->integer < 0 ||
      got.element[1]->integer > 0xffffffffLL ||
      (got.elements == 3 && (got.element[2]->type != REDIS_REPLY_STRING ||
                             got.element[2]->len != static_cast<std::size_t>(
                                                        got.element[0]->integer)))) {
    return fail(ErrorCode::kInvalidArgument,
                "DMA.GET returned something other than [length, crc32c] or [length, crc32c, "
                "bytes]");
  }
  Answer answer;
  answer.length = static_cast<std::uint64_t>(got.element[0]->integer);
  answer.crc = static_cast<std::uint32_t>(got.element[1]->integer);
  if (got.elements == 3) {
    answer.bytes = std::as_bytes(std::span<const char>(got.element[2]->str, got.element[2]->len));
    const std::uint32_t carried = crc32c(*answer.bytes);
    if (carried != answer.crc) {
      return fail(ErrorCode::kCorrupted, "DMA.GET: the bytes in the reply have CRC32C " +
                                             std::to_string(carried) + ", the server sent " +
                                             std::to_string(answer.crc));
    }
  }
  answer.reply = std::move(*reply);
  return std::optional<Answer>(std::move(answer));
}

Status Client::set_inline(std::string_view key, std::span<const std::byte> value) {
  const std::uint32_t crc = crc32c(value);
  const std::string crc_text = std::to_string(crc);
  const std::string_view bytes(reinterpret_cast<const char*>(value.data()), value.size());
  const std::string_view arguments[] = {"DMA.SETPLAIN", key, bytes, "CRC", crc_text};
  DMA_TRY_ASSIGN(const auto reply, route(key, arguments, /*transfers=*/false));
  DMA_TRY_ASSIGN(const auto answer, length_and_crc(*reply, "DMA.SETPLAIN"));
  if (answer.first != value.size() || answer.second != crc) {
    return fail(ErrorCode::kCorrupted,
                "DMA.SETPLAIN: the server stored a different length or CRC32C");
  }
  return {};
}

Result<std::optional<std::size_t>> Client::length(std::string_view key) {
  DMA_TRY_ASSIGN(auto answer, get_inline(key, 0, nullptr));
  if (!answer) return std::optional<std::size_t>();
  return std::optional<std::size_t>(answer->length);
}

Result<std::optional<std::vector<std::byte>>> Client::get(std::string_view key) {
  last_checksum_.reset();
  DMA_TRY_ASSIGN(auto answer, get_inline(key, inline_max_, nullptr));
  for (int attempt = 0;; ++attempt) {
    if (!answer) return std::optional<std::vector<std::byte>>();
    if (answer->bytes) {
      last_checksum_ = answer->crc;  // get_inline checked the bytes against it
      return std::optional<std::vector<std::byte>>(
          std::vector<std::byte>(answer->bytes->begin(), answer->bytes->end()));
    }
    std::vector<std::byte> value(answer->length);
    auto got = get(key, std::span<std::byte>(value));
    if (got) {
      if (!*got) return std::optional<std::vector<std::byte>>();
      value.resize(**got);
      return std::optional<std::vector<std::byte>>(std::move(value));
    }
    if (got.error().code() == ErrorCode::kUnreachable) {
      // If the server may still write into `value`, the Client holds it (moving a vector keeps
      // its storage where the server was told to write).
      for (Left& left : left_) {
        if (left.begin == value.data() && left.owned.empty()) {
          left.owned = std::move(value);
          break;
        }
      }
      return fail(std::move(got).error());
    }
    // The value may have grown since its length was read: look again, and give up if it did
    // not change or after three tries.
    const std::uint64_t was = answer->length;
    DMA_TRY_ASSIGN(answer, get_inline(key, inline_max_, nullptr));
    if (attempt == 2 || (answer && !answer->bytes && answer->length == was)) {
      return fail(std::move(got).error());
    }
  }
}

Result<std::optional<std::size_t>> Client::get(std::string_view key,
                                               std::span<std::byte> buffer) {
  last_checksum_.reset();
  if (buffer.size() <= inline_max_) {
    DMA_TRY_ASSIGN(const auto answer, get_inline(key, buffer.size(), nullptr));
    if (!answer) return std::optional<std::size_t>();
    if (!answer->bytes) {
      return fail(ErrorCode::kInvalidArgument,
                  "DMA.GET: the value is " + std::to_string(answer->length) +
                      " bytes, the buffer holds " + std::to_string(buffer.size()));
    }
    if (!answer->bytes->empty()) {
      std::memcpy(buffer.data(), answer->bytes->data(), answer->bytes->size());
    }
    last_checksum_ = answer->crc;
    return std::optional<std::size_t>(answer->bytes->size());
  }
  // Here the buffer is not empty (an empty one always goes inline).
  DMA_TRY_ASSIGN(const Exposed exposed, target_->expose(buffer.data(), buffer.size()));
  auto got = get(key, exposed);
  if (got && *got && **got > buffer.size()) {
    last_checksum_.reset();
    return fail(ErrorCode::kInvalidArgument, "DMA.GET reported more bytes than the buffer holds");
  }
  return got;
}

Result<std::optional<std::size_t>> Client::get(std::string_view key, const Exposed& landing) {
  last_checksum_.reset();
  DMA_TRY(refuse_if_left(std::span<const std::byte>(landing.data(), landing.length())));
  if (inline_max_ != 0) {
    // Inline if the value fits both; otherwise the server writes it into `landing`.
    DMA_TRY_ASSIGN(const auto answer,
                   get_inline(key, std::min(inline_max_, landing.length()), &landing));
    if (!answer) return std::optional<std::size_t>();
    if (answer->length > landing.length()) {
      return fail(ErrorCode::kInvalidArgument, "DMA.GET reported more bytes than the buffer holds");
    }
    if (answer->bytes) {
      if (!answer->bytes->empty()) {
        std::memcpy(landing.data(), answer->bytes->data(), answer->bytes->size());
      }
      last_checksum_ = answer->crc;
      return std::optional<std::size_t>(answer->length);
    }
    return check_landed(landing, answer->length, answer->crc);
  }
  // The server writes into `landing` before replying.
  expect_transfer(Target::Expected::kWrite);
  DMA_TRY_ASSIGN(const auto reply,
                 route_landing(key, with_region({"DMA.GET", std::string(key)}, landing), landing));
  if (reply->type == REDIS_REPLY_NIL) return std::optional<std::size_t>();
  DMA_TRY_ASSIGN(const auto answer, length_and_crc(*reply, "DMA.GET"));
  const auto [length, crc] = answer;
  if (length > landing.length()) {
    return fail(ErrorCode::kInvalidArgument, "DMA.GET reported more bytes than the buffer holds");
  }
  return check_landed(landing, length, crc);
}

Result<std::optional<std::size_t>> Client::check_landed(const Exposed& landing,
                                                        std::uint64_t length, std::uint32_t crc) {
  target_->synchronize();  // the server's write before our reads
  const std::uint32_t landed = crc32c(std::span<const std::byte>(landing.data(), length));
  if (landed != crc) {
    return fail(ErrorCode::kCorrupted, "DMA.GET: the bytes that landed have CRC32C " +
                                           std::to_string(landed) + ", the server sent " +
                                           std::to_string(crc));
  }
  last_checksum_ = crc;
  return std::optional<std::size_t>(length);
}

Status Client::set(std::string_view key, std::span<const std::byte> value) {
  if (value.size() <= inline_max_) return set_inline(key, value);
  // Here the value is not empty (an empty one always goes inline). The server only reads this
  // memory; Target::expose wants a mutable pointer.
  DMA_TRY_ASSIGN(const Exposed exposed,
                 target_->expose(const_cast<std::byte*>(value.data()), value.size()));
  return set(key, exposed, value.size());
}

Status Client::set(std::string_view key, const Exposed& value, std::size_t length) {
  if (length > value.length()) {
    return fail(ErrorCode::kInvalidArgument,
                "DMA.SET of " + std::to_string(length) + " bytes from an exposed buffer of " +
                    std::to_string(value.length()));
  }
  if (length <= inline_max_) {
    return set_inline(key, std::span<const std::byte>(value.data(), length));
  }
  target_->synchronize();  // the caller's writes to the buffer before the server's read
  const std::uint32_t crc = crc32c(std::span<const std::byte>(value.data(), length));
  // The server reads `value` before replying.
  expect_transfer(Target::Expected::kRead);
  auto reply = route(key,
                     with_region({"DMA.SET", std::string(key), std::to_string(length), "CRC",
                                  std::to_string(crc)},
                                 value),
                     /*transfers=*/true);
  target_->synchronize();  // the provider's sends from the buffer before the caller reuses it
  if (!reply) return fail(std::move(reply).error());
  DMA_TRY_ASSIGN(const auto answer, length_and_crc(**reply, "DMA.SET"));
  if (answer.first != length || answer.second != crc) {
    return fail(ErrorCode::kCorrupted, "DMA.SET: the server stored a different length or CRC32C");
  }
  return {};
}

}  // namespace dma
