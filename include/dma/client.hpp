// dma::Client: the client side of the Redis/Valkey module. One hiredis connection and one
// dma::Target; values move over the fabric (the server writes GETs into and reads SETs out of
// this process's exposed buffers) while the connection carries only the small commands.
//
// Redis Cluster: a key's command goes to the node serving its slot. A -MOVED reply records that
// node for the slot and the command is sent again there; -ASK sends it there once, after
// ASKING (a slot being migrated); -TRYAGAIN (the slot moved while a DMA.SET's read was in flight,
// the key untouched) sends it again; at most kMaxRedirections times per call. Each node gets
// its own connection and its own proven session (one DMA.HELLO per node, said the first time a
// command is sent there and kept for the client's life), all for the one Target: a session is
// bound to its connection, and every node must prove that this target is ours. Against a
// single server nothing of this costs anything.
//
// A replaced server endpoint: a command whose session said hello to an endpoint the server has
// since replaced (or whose transfer the replacement failed) is answered -REHELLO, and the
// session is reset there. The client then says DMA.HELLO again on that connection by itself
// (to the new address), once per command, and sends the command again: a -REHELLO is an error
// reply, and a DMA.GET or DMA.SET answered with an error has not taken effect (a failed SET
// leaves its key untouched). A lost connection or a timeout is never retried (a SET may have
// happened): the call fails with kUnreachable. docs/RELIABILITY.md, "Endpoint replacement".
//
// A command that fails without its reply (kUnreachable: the server was SIGKILLed, SIGSTOPped
// past Options::timeout, or the network went): every round trip ends by Options::timeout, but
// the server may still be alive and may still move a DMA.GET's value into the buffer that GET
// advertised (a stopped server resumes where it stopped, or reads the command still queued on
// the socket and starts the transfer). So that buffer is not handed back for reuse until no
// write can land in it any more, which is decided so:
//   - Every provider lands a remote write through this process's own endpoint (tcp and net in
//     their progress, shm in its progress, which copies from the server with
//     process_vm_readv; verbs and efa through the NIC). A write that starts after the
//     exposure closed is refused (measured on tcp, net and shm: test_module_client_deadlines),
//     but one already admitted may still be landing (tcp streams its payload). Once this
//     Client's Target is closed (~Client), nothing lands: that ends it everywhere.
//   - On shm the server is a process on this host, named by its address: once it has exited,
//     nothing of it can be copied in either, and the buffer is free while the Client lives.
// server_may_write() answers for any memory; while it is true for a buffer, get() refuses to
// land there. get(key)'s own buffer is held by the Client until then. A failed DMA.SET leaves
// nothing behind: the server only reads its buffer, and a late read of changed bytes fails
// the server's CRC32C check (the key stays untouched). docs/RELIABILITY.md, "Client deadlines
// and buffer reuse".
//
// Ownership: the Client owns its connections and its Target. Thread-safety: none. A hiredis
// context must not be shared between threads, and each session is bound to its connection,
// so use one Client per thread (each opens its own Target and says its own hello).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dma/export.hpp"
#include "dma/configuration.hpp"
#include "dma/result.hpp"
#include "dma/target.hpp"

struct redisContext;
struct redisReply;

namespace dma {

// One hiredis command as an argv (binary-safe: values may hold any byte). dma::Client speaks
// through these, and so do the tests', tools' and benchmark's plain connections
// (support/redis_connection.hpp), so the argv handling exists once. The caller owns the
// context; these only use it (blocking, with the context's timeout).
namespace redis {
struct DMA_EXPORT ReplyDeleter {
  void operator()(redisReply* reply) const noexcept;
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

// Queues `arguments` as one command and writes it out without waiting for the reply
// (pipelining). kUnreachable if the connection failed.
DMA_EXPORT Status send(redisContext* connection, std::span<const std::string_view> arguments);
// The next reply, error replies included. kUnreachable if the connection failed or timed out.
DMA_EXPORT Result<Reply> receive(redisContext* connection);
// send() then receive(); an error reply is a kInvalidArgument "<command> failed: <reply>".
DMA_EXPORT Result<Reply> command(redisContext* connection, std::span<const std::string_view> arguments);
DMA_EXPORT Result<Reply> command(redisContext* connection, std::initializer_list<std::string_view> arguments);

// Redis Cluster's hash slot of a key (CRC16/XMODEM of the key, or of the part between the first
// '{' and the next '}' when that is not empty, modulo 16384): what CLUSTER KEYSLOT answers.
DMA_EXPORT int key_slot(std::string_view key) noexcept;

// A cluster's redirection: "MOVED <slot> <host>:<port>" or "ASK <slot> <host>:<port>" (the host
// is everything before the last ':', so IPv6 addresses pass). nullopt for any other error.
struct Redirection {
  bool ask = false;  // ASK: this command only, after ASKING; MOVED: the slot's owner from now
  int slot = 0;
  std::string host;
  int port = 0;
};
DMA_EXPORT std::optional<Redirection> parse_redirection(std::string_view error);
}  // namespace redis

class DMA_EXPORT Client {
 public:
  // Redirections (-MOVED, -ASK, -TRYAGAIN) followed for one command before it fails.
  static constexpr int kMaxRedirections = 16;

  struct Options {
    // Bounds every round trip, the transfer included (the hiredis connect and socket timeout):
    // a server SIGKILLed or SIGSTOPped mid-command fails the call with kUnreachable by then.
    // The connection is unusable afterwards (make a new Client), and the buffer a failed GET
    // advertised stays the server's while server_may_write() says so (top of this file).
    std::chrono::milliseconds timeout{60000};
    // Hold a Target::Busy from each DMA command to its reply, so the target polls without
    // sleeping while the server transfers: the lowest latency for a client with a core to
    // spare. Off by default: with more waiting clients than cores, their polling takes the CPU
    // from the server they wait for (4 clients on 2 cores: DMA.GET 4 KiB over shm fell from
    // 0.40x to 0.03x of GET; docs/PERFORMANCE.md).
    bool busy_poll = false;
    // Without busy_poll: how long the target polls on after a DMA command is sent where its
    // own progress serves the transfer (Target::expect): a DMA.GET's write on shm, so the write
    // finds it awake rather than waiting for it to be woken (1 MiB DMA.GETs over shm ran 1.4x
    // as many per second at one client, 1.2x at four; docs/PERFORMANCE.md, "Speed, eighth
    // pass"), and a DMA.SET's read on tcp and net (1 MiB at one client: 1.50-1.57 of SET against
    // 1.11-1.46; four clients on two cores lost ~7 %: "Speed, tenth pass"). Costs up to this
    // much polling per command on a spare core; 0: the target sleeps until it is needed.
    std::chrono::microseconds expect_window{300};
    // Values of at most this many bytes travel in the command or its reply instead of over the
    // fabric (DMA.GET ... INLINE, DMA.SETPLAIN): below it a round trip on the socket is cheaper
    // than exposing a buffer and a one-sided transfer (docs/PERFORMANCE.md, "Inline values").
    // The smaller of this and the server's inline-max (from DMA.HELLO) applies; 0: never.
    std::size_t inline_max = kDefaultInlineMax;
  };
  // Connects to host:port and opens a Target with `configuration` (the providers must match the
  // server's). Does not say hello: call hello() before get() or set().
  static Result<std::unique_ptr<Client>> connect(const std::string& host, int port,
                                                 const Configuration& configuration);
  static Result<std::unique_ptr<Client>> connect(const std::string& host, int port,
                                                 const Configuration& configuration,
                                                 Options options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // DMA.HELLO then DMA.PROVE: registers this target's address with the server, inserts every
  // server endpoint's address into the target (efa-direct requires it), then proves the address
  // is ours by exposing the server's nonce on the target for the server to read back. Once per
  // connection; after a failure the connection may try again. In a cluster this is the node
  // connect() reached; others get theirs when a command is first redirected to them.
  Status hello();

  // DMA.GET into `buffer`: the value's length, or nullopt if the key does not exist. Fails
  // (kInvalidArgument, naming both sizes, nothing written) if the buffer is too small, and with
  // kCorrupted if the bytes that landed do not match the server's CRC32C. A buffer of at most
  // inline_max bytes is never exposed: the value comes in the reply.
  Result<std::optional<std::size_t>> get(std::string_view key, std::span<std::byte> buffer);
  // The whole value in memory this call allocates, or nullopt if the key does not exist: one
  // round trip for a value of at most inline_max bytes, else one to learn the length and one
  // to transfer (retried if the value changed size in between, up to three times).
  Result<std::optional<std::vector<std::byte>>> get(std::string_view key);
  // The value's length, or nullopt if the key does not exist; nothing is transferred.
  Result<std::optional<std::size_t>> length(std::string_view key);
  // DMA.SET of `value`, with its CRC32C so the server refuses bytes that arrive damaged (a value
  // of at most inline_max bytes goes in the command, DMA.SETPLAIN, with the same check).
  Status set(std::string_view key, std::span<const std::byte> value);

  // The same with buffers the caller exposed on target() and keeps exposed across calls: the
  // calls above register their buffer every time, which costs more than a small transfer
  // (docs/PERFORMANCE.md). get() lands in all of `landing`; set() sends its first `length`
  // bytes. The caller must not touch the buffer while a call is in progress, and may once it
  // returns (both calls synchronize with the target's progress, Target::synchronize()). Values
  // of at most inline_max bytes still travel inline, copied into or out of the buffer.
  Result<std::optional<std::size_t>> get(std::string_view key, const Exposed& landing);
  Status set(std::string_view key, const Exposed& value, std::size_t length);
  // The CRC32C the value of the last successful get() that found its key was checked against
  // (the one recorded when it was stored, so equal to the CRC32C of the bytes it returned);
  // nullopt after a get() that failed or found no key. A caller that knows what CRC32C the value
  // should have compares this instead of reading the bytes a second time.
  std::optional<std::uint32_t> last_checksum() const noexcept { return last_checksum_; }

  // True while a server may still write into some byte of `memory` because a DMA.GET that
  // advertised it failed without its reply (top of this file). Asks afresh each time: on shm,
  // one poll of each such server's pidfd.
  bool server_may_write(std::span<const std::byte> memory);
  // How many buffers of failed DMA.GETs a server may still write into (get(key)'s own among
  // them, held by the Client).
  std::size_t unsettled();

  // The largest value that travels inline: Options::inline_max capped by the server's
  // inline-max (the smallest of the nodes' said hello to, in a cluster), known after hello()
  // (0 before).
  std::size_t inline_max() const noexcept { return inline_max_; }
  // The cluster nodes this client has a proven session with (1 against a single server).
  std::size_t sessions() const noexcept;
  // The server's endpoint addresses from hello(), and this client's target.
  const std::vector<std::vector<std::uint8_t>>& server_addresses() const noexcept {
    return server_addresses_;
  }
  Target& target() noexcept { return *target_; }

 private:
  // One server (cluster node) this client talks to: its connection and whether its session is
  // proven. Defined in client.cpp.
  struct Node;
  Client(redisContext* connection, std::string name, std::unique_ptr<Target> target,
         Options options);
  // Says DMA.HELLO and DMA.PROVE on `node`'s connection.
  Status hello_on(Node& node);
  // The node `host`:`port`, connected (not yet proven) if it is new.
  Result<Node*> node_named(const std::string& host, int port);
  // Sends `arguments`, a command on `key`, to the node serving the key, following the
  // cluster's redirections (see the top of this file); `transfers`: hold a Busy token (the
  // server moves bytes before replying). The final reply; an error reply is a
  // kInvalidArgument "<command> failed: <reply>" as redis::command makes it.
  Result<redis::Reply> route(std::string_view key, std::span<const std::string_view> arguments,
                             bool transfers);
  Result<redis::Reply> route(std::string_view key, const std::vector<std::string>& arguments,
                             bool transfers);
  // DMA.GET <key> INLINE <most> [the whole of `landing`]: the reply, checked.
  struct Answer {
    std::uint64_t length = 0;
    std::uint32_t crc = 0;
    std::optional<std::span<const std::byte>> bytes;  // inline: in `reply`
    redis::Reply reply;
  };
  Result<std::optional<Answer>> get_inline(std::string_view key, std::size_t most,
                                           const Exposed* landing);
  Status set_inline(std::string_view key, std::span<const std::byte> value);
  // After a DMA.GET's write into `landing`: waits for it and checks its CRC32C.
  Result<std::optional<std::size_t>> check_landed(const Exposed& landing, std::uint64_t length,
                                                  std::uint32_t crc);
  // Before a command that makes the server write into (read from) our memory:
  // Options::expect_window.
  void expect_transfer(Target::Expected what);
  // A Busy token when busy_poll is on, else an empty one.
  Target::Busy busy();
  // route() for a DMA.GET that advertises `landing`: a failure after the command was sent
  // without its reply leaves `landing` to the server (left_), and the error says so.
  Result<redis::Reply> route_landing(std::string_view key,
                                     const std::vector<std::string>& arguments,
                                     const Exposed& landing);
  // kInvalidArgument if a server may still write into `memory`.
  Status refuse_if_left(std::span<const std::byte> memory);
  // Drops what no server can write into any more.
  void settle();
  // A buffer a failed DMA.GET left to its server, and how to tell it is back. Defined in
  // client.cpp.
  struct Left;
  std::chrono::milliseconds timeout_;
  bool busy_poll_;
  std::chrono::microseconds expect_window_;
  std::size_t inline_wanted_;  // Options::inline_max
  std::size_t inline_max_ = 0;
  std::optional<std::uint32_t> last_checksum_;
  // Declared before the target, so destroyed after it: held buffers are freed only once the
  // target's endpoint is closed.
  std::vector<Left> left_;
  std::unique_ptr<Target> target_;
  // nodes_[0] is the server connect() reached; the others were named by redirections. Declared
  // after the target, so destroyed before it: the connections close (and the servers drop the
  // sessions) while the target still exists.
  std::vector<std::unique_ptr<Node>> nodes_;
  // The node serving each slot, as -MOVED said (null: not known, nodes_[0]); empty until the
  // first -MOVED, so a single server never hashes a key.
  std::vector<Node*> slots_;
  std::vector<std::vector<std::uint8_t>> server_addresses_;
  // The node route() last sent a command to, and whether that command was written out (a
  // failure before that leaves nothing to the server).
  Node* routed_ = nullptr;
  bool routed_sent_ = false;
};

}  // namespace dma
