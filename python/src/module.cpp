// dma._dma: the Python binding of dma::Client, dma::Target and dma::Exposed (pybind11). The
// Python package dma (python/dma/__init__.py) adds the asyncio methods and re-exports these.
//
// Buffers: every call takes any object with the buffer protocol (bytes, bytearray, memoryview,
// numpy arrays; C-contiguous) and uses its memory in place: no copy in Python. The call holds
// the buffer's export (PyObject_GetBuffer) until the C++ call has returned, so for as long as
// the fabric may touch the memory the object cannot be resized or freed (a bytearray refuses to
// resize with BufferError while exported). An Exposed holds its export until it is closed.
//
// The GIL is released for the whole of every call that talks to the server or the fabric
// (connect, hello, get, set, length, expose) and while a Buffer is mapped and faulted in, so
// other Python threads run meanwhile.
//
// Thread-safety: dma::Client is not thread-safe (one hiredis context), so a ClientState
// serialises its calls with a mutex taken after the GIL is released (never the other way
// round, which could deadlock against a thread holding the mutex and waiting for the GIL).
// dma::Target is thread-safe by itself.
//
// Ownership: a Client's ClientState (connection, Target) is shared with every Exposed made on
// it, so the dma::Client outlives its exposed buffers whatever order Python drops them in
// (dma::Exposed must be destroyed before its Target); close() only stops further calls.
//
// A failed GET's buffer: a DMA.GET that fails without its reply (kUnreachable) leaves the buffer
// it advertised to the server, which may still write into it (dma::Client::server_may_write,
// include/dma/client.hpp). dma::Client holds get(key)'s own buffer until then; for a caller's
// buffer (get(key, out=buffer or Exposed)) the binding keeps an export of the Python object
// (ClientState::held) for as long as server_may_write() says so for its memory, or until the
// dma::Client (its Target) is gone: the object cannot be freed or resized meanwhile, even after
// an Exposed on it is closed. Every call on the Client drops the holds that have settled.
//
// dma.Buffer is dma::Buffer (include/dma/memory.hpp) with the buffer protocol: writable bytes
// (format "B"), freed when the last reference goes, which a memoryview or an export holds.
//
// Errors: a dma::Error becomes an instance of dma.Error's subclass for its ErrorCode, with
// .kind (dma.ErrorKind), .message and str() "<kind>: <message>" (Error::describe()).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "conversions.hpp"
#include "dma/client.hpp"
#include "dma/configuration.hpp"
#include "dma/memory.hpp"
#include "dma/protocol.hpp"
#include "dma/target.hpp"
#include "dma/version.hpp"

namespace py = pybind11;

namespace dma_python {
namespace {

// ---- owners ----------------------------------------------------------------------------------

// An export of a Python buffer a failed GET left to its server, and the memory the GET
// advertised (what server_may_write is asked about).
struct Held {
  std::unique_ptr<BufferView> view;
  std::span<const std::byte> memory;
};

// A dma::Client and the mutex serialising calls into it. Shared by the Python Client and every
// Exposed made on it.
struct ClientState {
  std::mutex mutex;
  std::unique_ptr<dma::Client> client;
  // Under `mutex`; a Held is created and destroyed with the GIL held (it owns an export), and
  // may be moved without it.
  std::vector<Held> held;

  ClientState() = default;
  ClientState(const ClientState&) = delete;
  ClientState& operator=(const ClientState&) = delete;
  // The client first: once its Target is closed nothing lands any more, and only then are the
  // held exports released. The last owner may go with or without the GIL (close() drops it
  // without), so the GIL is taken for the exports.
  ~ClientState() {
    client.reset();
    if (!held.empty()) {
      py::gil_scoped_acquire gil;
      held.clear();
    }
  }

  // Under `mutex`, without the GIL needed: keeps `view` if a server may still write into
  // `memory` after the GET into it failed and no held export covers it already (a GET refused
  // because of an earlier failure's hold must not add a second).
  void hold_if_left(std::unique_ptr<BufferView>& view, std::span<const std::byte> memory) {
    if (memory.empty() || !client->server_may_write(memory)) return;
    for (const Held& kept : held) {
      if (kept.memory.data() <= memory.data() &&
          memory.data() + memory.size() <= kept.memory.data() + kept.memory.size()) {
        return;
      }
    }
    held.push_back(Held{std::move(view), memory});
  }
  // Under `mutex`, without the GIL needed: takes out the holds no server can write into any
  // more, for the caller to destroy once it has the GIL.
  std::vector<Held> settled() {
    std::vector<Held> out;
    for (auto it = held.begin(); it != held.end();) {
      if (client->server_may_write(it->memory)) {
        ++it;
      } else {
        out.push_back(std::move(*it));
        it = held.erase(it);
      }
    }
    return out;
  }
};

// A standalone dma::Target, shared with its Exposed.
struct TargetState {
  std::unique_ptr<dma::Target> target;
};

// A Python buffer exposed on a target: the registration and the buffer's export, held until
// close(). Members in teardown order: the registration is closed before the export is released
// (so the memory is registered only while the object cannot be freed), and both before the
// owner of the Target.
class PyExposed {
 public:
  PyExposed(std::shared_ptr<ClientState> client, std::shared_ptr<TargetState> target,
            const py::handle& object)
      : client_(std::move(client)), target_(std::move(target)), object_(py::reinterpret_borrow<py::object>(object)) {
    view_ = std::make_unique<BufferView>(object, false);
    if (view_->size() == 0) throw py::value_error("cannot expose an empty buffer");
    dma::Target& on = this->target();
    // The server only reads a read-only buffer (a SET source); Target::expose wants a mutable
    // pointer either way.
    void* data = view_->data();
    const std::size_t size = view_->size();
    dma::Result<dma::Exposed> exposed = [&] {
      py::gil_scoped_release release;
      return on.expose(data, size);
    }();
    exposed_ = std::make_unique<dma::Exposed>(check(std::move(exposed)));
  }
  ~PyExposed() { close(); }

  void close() {
    if (exposed_) {
      py::gil_scoped_release release;  // deregistration takes the target's endpoint lock
      exposed_.reset();
    }
    if (view_) view_.reset();
  }
  const dma::Exposed& exposed() const {
    if (!exposed_) throw py::value_error("this Exposed is closed");
    return *exposed_;
  }
  bool writable() const { return view_ && view_->writable(); }
  bool closed() const { return !exposed_; }
  const ClientState* client() const { return client_.get(); }
  py::object object() const { return object_; }

 private:
  dma::Target& target() {
    if (client_) return client_->client->target();
    return *target_->target;
  }
  std::shared_ptr<ClientState> client_;
  std::shared_ptr<TargetState> target_;
  py::object object_;
  std::unique_ptr<BufferView> view_;
  std::unique_ptr<dma::Exposed> exposed_;
};

// ---- Client ----------------------------------------------------------------------------------

class PyClient {
 private:
  void live() const {
    if (!state_) throw py::value_error("this Client is closed");
  }
  void mine(const PyExposed& exposed) const {
    live();
    if (exposed.client() != state_.get()) {
      throw py::value_error("this Exposed belongs to another client or target");
    }
  }
  // Runs `body` on the client (or on the client's state, if it takes a ClientState&) without
  // the GIL and under the client's mutex, then drops the holds that have settled; raises its
  // error.
  template <typename Body>
  auto call(Body&& body) {
    live();
    std::shared_ptr<ClientState> state = state_;  // a concurrent close() waits for us
    std::vector<Held> released;  // destroyed once the GIL is back
    auto result = [&] {
      py::gil_scoped_release release;
      const std::lock_guard lock(state->mutex);
      auto out = [&] {
        if constexpr (std::is_invocable_v<Body&, ClientState&>) {
          return body(*state);
        } else {
          return body(*state->client);
        }
      }();
      if (!state->held.empty()) released = state->settled();
      return out;
    }();
    return check(std::move(result));
  }

 public:
  PyClient(const std::string& host, int port, const std::optional<std::string>& provider,
           const std::optional<std::vector<std::string>>& providers,
           const std::optional<std::vector<std::string>>& interfaces,
           const std::optional<std::string>& bind, double timeout, bool busy_poll,
           double expect_window, std::optional<std::size_t> inline_max,
           const std::optional<std::string>& config, bool hello)
      : state_(std::make_shared<ClientState>()) {
    const dma::Configuration configuration =
        configuration_of(config, provider, providers, interfaces, bind);
    dma::Client::Options options;
    options.timeout = milliseconds_of(timeout);
    options.busy_poll = busy_poll;
    options.expect_window = microseconds_of(expect_window, "expect_window");
    if (inline_max) options.inline_max = *inline_max;
    dma::Status said = [&]() -> dma::Status {
      py::gil_scoped_release release;
      auto connected = dma::Client::connect(host, port, configuration, options);
      if (!connected) return dma::fail(std::move(connected).error());
      state_->client = std::move(*connected);
      if (hello) return state_->client->hello();
      return {};
    }();
    check(std::move(said));
  }

  void hello() {
    call([](dma::Client& client) { return client.hello(); });
  }

  // get(key) -> bytes | None; get(key, out=buffer or Exposed) -> int | None.
  py::object get(const py::handle& key, const py::handle& out) {
    const std::string name = key_of(key);
    if (out.is_none()) {
      auto value = call([&](dma::Client& client) { return client.get(name); });
      if (!value) return py::none();
      return py::bytes(reinterpret_cast<const char*>(value->data()), value->size());
    }
    std::optional<std::size_t> length;
    if (py::isinstance<PyExposed>(out)) {
      const PyExposed& landing = out.cast<const PyExposed&>();
      mine(landing);
      if (!landing.writable()) throw py::value_error("cannot get into a read-only buffer");
      const dma::Exposed& exposed = landing.exposed();
      // Kept if the GET fails leaving the memory to the server: the Exposed may be closed
      // (releasing its own export) while the server can still write.
      auto keep = std::make_unique<BufferView>(landing.object(), false);
      const std::span<const std::byte> memory(exposed.data(), exposed.length());
      length = call([&](ClientState& state) {
        auto got = state.client->get(name, exposed);
        if (!got) state.hold_if_left(keep, memory);
        return got;
      });
    } else {
      auto view = std::make_unique<BufferView>(out, true);
      const std::span<std::byte> buffer(view->data(), view->size());
      length = call([&](ClientState& state) {
        auto got = state.client->get(name, buffer);
        if (!got) state.hold_if_left(view, buffer);
        return got;
      });
    }
    if (!length) return py::none();
    return py::int_(*length);
  }

  // set(key, buffer or Exposed, length=None).
  void set(const py::handle& key, const py::handle& value, std::optional<std::size_t> length) {
    const std::string name = key_of(key);
    if (py::isinstance<PyExposed>(value)) {
      const PyExposed& source = value.cast<const PyExposed&>();
      mine(source);
      const dma::Exposed& exposed = source.exposed();
      const std::size_t bytes = length.value_or(exposed.length());
      call([&](dma::Client& client) { return client.set(name, exposed, bytes); });
      return;
    }
    BufferView view(value, false);
    std::span<const std::byte> bytes(view.data(), view.size());
    if (length) {
      if (*length > bytes.size()) {
        throw py::value_error("length " + std::to_string(*length) + " is more than the buffer's " +
                              std::to_string(bytes.size()) + " bytes");
      }
      bytes = bytes.first(*length);
    }
    call([&](dma::Client& client) { return client.set(name, bytes); });
  }

  py::object length(const py::handle& key) {
    const std::string name = key_of(key);
    auto length = call([&](dma::Client& client) { return client.length(name); });
    if (!length) return py::none();
    return py::int_(*length);
  }

  std::unique_ptr<PyExposed> expose(const py::handle& buffer) {
    live();
    return std::make_unique<PyExposed>(state_, nullptr, buffer);
  }

  // The CRC32C the last get() checked its value against; None before any, and after one that
  // failed or found no key.
  std::optional<std::uint32_t> last_checksum() {
    return call([](dma::Client& client) -> dma::Result<std::optional<std::uint32_t>> {
      return client.last_checksum();
    });
  }

  // Whether a server may still write into the memory of `memory` (a buffer, or an Exposed: its
  // object's) because a GET into it failed without its reply. Asks afresh.
  bool server_may_write(const py::handle& memory) {
    py::object object = py::reinterpret_borrow<py::object>(memory);
    if (py::isinstance<PyExposed>(memory)) object = memory.cast<const PyExposed&>().object();
    const BufferView view(object, false);
    const std::span<const std::byte> span(view.data(), view.size());
    return call([&](dma::Client& client) -> dma::Result<bool> {
      return client.server_may_write(span);
    });
  }

  std::size_t inline_max() {
    live();
    return state_->client->inline_max();
  }
  std::vector<py::bytes> server_addresses() {
    live();
    std::vector<py::bytes> out;
    for (const auto& address : state_->client->server_addresses()) {
      out.emplace_back(reinterpret_cast<const char*>(address.data()), address.size());
    }
    return out;
  }

  // Stops further calls; the connection and target close once no Exposed needs them. Waits for
  // a call in progress on another thread.
  void close() {
    if (!state_) return;
    std::shared_ptr<ClientState> state = std::move(state_);
    py::gil_scoped_release release;
    { const std::lock_guard lock(state->mutex); }  // waits for a call in progress
    // The last reference (no Exposed left) closes the client here, without the GIL, and then
    // releases the buffers failed GETs held (with it). Otherwise the last Exposed does.
    state.reset();
  }
  bool closed() const { return !state_; }

 private:
  std::shared_ptr<ClientState> state_;
};

// ---- Target ----------------------------------------------------------------------------------

class PyTarget {
 public:
  PyTarget(const std::optional<std::string>& provider,
           const std::optional<std::vector<std::string>>& providers,
           const std::optional<std::vector<std::string>>& interfaces,
           const std::optional<std::string>& bind, const std::optional<std::string>& config,
           double poll_interval)
      : state_(std::make_shared<TargetState>()) {
    const dma::Configuration configuration =
        configuration_of(config, provider, providers, interfaces, bind);
    dma::Target::Options options;
    options.poll_interval = microseconds_of(poll_interval, "poll_interval");
    auto opened = [&] {
      py::gil_scoped_release release;
      return dma::Target::open(configuration, {}, options);
    }();
    state_->target = check(std::move(opened));
  }

  py::bytes local_address() const {
    const auto address = state_->target->local_address();
    return py::bytes(reinterpret_cast<const char*>(address.data()), address.size());
  }
  py::dict describe() const {
    const dma::EndpointDescription& d = state_->target->describe();
    py::dict out;
    out["provider"] = d.provider;
    out["fabric"] = d.fabric;
    out["domain"] = d.domain;
    out["address_format"] = d.address_format;
    out["mr_mode_flags"] = d.mr_mode_flags;
    out["caps_flags"] = d.caps_flags;
    out["max_msg_size"] = d.max_msg_size;
    out["virtual_addresses"] = d.virtual_addresses;
    out["provider_keys"] = d.provider_keys;
    return out;
  }
  std::unique_ptr<PyExposed> expose(const py::handle& buffer) {
    return std::make_unique<PyExposed>(nullptr, state_, buffer);
  }
  void add_initiator(const py::bytes& address) {
    const std::string bytes = address;
    const std::span<const std::uint8_t> span(reinterpret_cast<const std::uint8_t*>(bytes.data()),
                                             bytes.size());
    dma::Status added = [&] {
      py::gil_scoped_release release;
      return state_->target->add_initiator(span);
    }();
    check(std::move(added));
  }
  void synchronize() {
    py::gil_scoped_release release;
    state_->target->synchronize();
  }
  std::uint64_t progress_polls() const { return state_->target->progress_polls(); }
  // A Busy token; Python holds it as a Busy context manager.
  dma::Target::Busy busy() { return state_->target->busy(); }

 private:
  std::shared_ptr<TargetState> state_;
};

// Target.busy()'s token: keeps the target polling without pause until released. It must not
// outlive its Target: the Python Target is kept alive as long as the token (keep_alive below).
struct PyBusy {
  std::optional<dma::Target::Busy> token;
  void release() { token.reset(); }
};

}  // namespace
}  // namespace dma_python

PYBIND11_MODULE(_dma, m) {
  using namespace dma_python;
  m.doc() = "dma: one-sided RDMA values from a Redis/Valkey server with the dma module";
  m.attr("__version__") = std::string(dma::version());
  m.attr("DEFAULT_INLINE_MAX") = dma::kDefaultInlineMax;

  py::enum_<dma::ErrorCode>(m, "ErrorKind", "What kind of failure (dma::ErrorCode).")
      .value("INVALID_ARGUMENT", dma::ErrorCode::kInvalidArgument)
      .value("CONFIGURATION", dma::ErrorCode::kConfiguration)
      .value("FABRIC", dma::ErrorCode::kFabric)
      .value("UNREACHABLE", dma::ErrorCode::kUnreachable)
      .value("TIMED_OUT", dma::ErrorCode::kTimedOut)
      .value("WORKER_GONE", dma::ErrorCode::kWorkerGone)
      .value("NOT_FOUND", dma::ErrorCode::kNotFound)
      .value("RESOURCE_EXHAUSTED", dma::ErrorCode::kResourceExhausted)
      .value("CORRUPTED", dma::ErrorCode::kCorrupted);

  register_errors(m);

  py::class_<PyExposed>(m, "Exposed",
                        "A buffer registered once for the server's one-sided access; reuse it "
                        "across calls. Holds the buffer's export until close().")
      .def_property_readonly("advertisement",
                             [](const PyExposed& self) { return dma::to_wire(self.exposed().advertisement()); })
      .def_property_readonly("key", [](const PyExposed& self) { return self.exposed().advertisement().key; })
      .def_property_readonly("remote_address",
                             [](const PyExposed& self) { return self.exposed().advertisement().remote_address; })
      .def_property_readonly("length", [](const PyExposed& self) { return self.exposed().length(); })
      .def_property_readonly("writable", &PyExposed::writable)
      .def_property_readonly("closed", &PyExposed::closed)
      .def_property_readonly("obj", &PyExposed::object)
      .def("close", &PyExposed::close)
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyExposed& self, py::args) { self.close(); });

  py::class_<PyClient>(m, "Client", "dma::Client: DMA.GET and DMA.SET against the Redis module.")
      .def(py::init<const std::string&, int, const std::optional<std::string>&,
                    const std::optional<std::vector<std::string>>&,
                    const std::optional<std::vector<std::string>>&,
                    const std::optional<std::string>&, double, bool, double,
                    std::optional<std::size_t>, const std::optional<std::string>&, bool>(),
           py::arg("host") = "127.0.0.1", py::arg("port") = 6379, py::kw_only(),
           py::arg("provider") = py::none(), py::arg("providers") = py::none(),
           py::arg("interfaces") = py::none(), py::arg("bind") = py::none(),
           py::arg("timeout") = 60.0, py::arg("busy_poll") = false,
           py::arg("expect_window") = 300e-6, py::arg("inline_max") = py::none(), py::arg("config") = py::none(),
           py::arg("hello") = true)
      .def("hello", &PyClient::hello)
      .def("get", &PyClient::get, py::arg("key"), py::arg("out") = py::none())
      .def("set", &PyClient::set, py::arg("key"), py::arg("value"), py::arg("length") = py::none())
      .def("length", &PyClient::length, py::arg("key"))
      .def("expose", &PyClient::expose, py::arg("buffer"))
      .def_property_readonly(
          "last_checksum", &PyClient::last_checksum,
          "The CRC32C (an int) the value of the last successful get() that found its key was "
          "checked against: the one recorded when it was stored, so equal to "
          "dma.crc32c(value). None before any get(), and after a get() that failed or found "
          "no key. Read-only.")
      .def("server_may_write", &PyClient::server_may_write, py::arg("memory"),
           "True while a server may still write into some byte of `memory` (any buffer, or an "
           "Exposed: its object's memory) because a get() into it failed without its reply "
           "(UnreachableError); False otherwise (a fresh buffer, one after a successful get()). "
           "Asks afresh each call. While True, get() refuses to land there and the Client "
           "keeps the buffer the failed get() was given exported (it cannot be freed or "
           "resized) until this says False for it or the Client (and every Exposed on it) is "
           "closed.")
      .def_property_readonly("inline_max", &PyClient::inline_max)
      .def_property_readonly("server_addresses", &PyClient::server_addresses)
      .def_property_readonly("closed", &PyClient::closed)
      .def("close", &PyClient::close);

  py::class_<PyBusy>(m, "Busy", "Keeps a Target polling without pause while held.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyBusy& self, py::args) { self.release(); })
      .def("release", &PyBusy::release);

  py::class_<PyTarget>(m, "Target", "dma::Target: exposes memory for a server's one-sided access.")
      .def(py::init<const std::optional<std::string>&,
                    const std::optional<std::vector<std::string>>&,
                    const std::optional<std::vector<std::string>>&,
                    const std::optional<std::string>&, const std::optional<std::string>&, double>(),
           py::kw_only(), py::arg("provider") = py::none(), py::arg("providers") = py::none(),
           py::arg("interfaces") = py::none(), py::arg("bind") = py::none(),
           py::arg("config") = py::none(), py::arg("poll_interval") = 50e-6)
      .def_property_readonly("local_address", &PyTarget::local_address)
      .def("describe", &PyTarget::describe)
      .def("expose", &PyTarget::expose, py::arg("buffer"))
      .def("add_initiator", &PyTarget::add_initiator, py::arg("address"))
      .def("synchronize", &PyTarget::synchronize)
      .def_property_readonly("progress_polls", &PyTarget::progress_polls)
      .def("busy", [](PyTarget& self) { return PyBusy{self.busy()}; }, py::keep_alive<0, 1>());

  py::enum_<dma::Buffer::HugePages>(m, "HugePages",
                                    "Whether a Buffer is advised onto huge pages.")
      .value("AUTO", dma::Buffer::HugePages::kAuto)
      .value("ALWAYS", dma::Buffer::HugePages::kAlways)
      .value("NEVER", dma::Buffer::HugePages::kNever);

  py::class_<dma::Buffer>(m, "Buffer", py::buffer_protocol(),
                          "Memory for values that cross the fabric: its own zeroed mapping, on "
                          "2 MiB huge pages from 1 MiB (see HugePages). Any call that takes a "
                          "buffer takes it; memoryview(buffer) and numpy.frombuffer(buffer, ...) "
                          "use it in place.")
      .def(py::init([](std::size_t length, dma::Buffer::HugePages huge_pages) {
             // Faulting in a large buffer takes a while: other threads run meanwhile.
             dma::Result<dma::Buffer> allocated = [&] {
               py::gil_scoped_release release;
               return dma::Buffer::allocate(length, huge_pages);
             }();
             return check(std::move(allocated));
           }),
           py::arg("length"), py::arg("huge_pages") = dma::Buffer::HugePages::kAuto)
      .def_buffer([](dma::Buffer& self) {
        return py::buffer_info(self.data(), 1, py::format_descriptor<std::uint8_t>::format(), 1,
                               {self.size()}, {1});
      })
      .def("__len__", &dma::Buffer::size)
      .def_property_readonly("mapped", &dma::Buffer::mapped,
                             "Bytes mapped for it: its length rounded up to 4 KiB or 2 MiB pages.")
      .def_property_readonly("huge_pages", &dma::Buffer::huge_pages,
                             "Whether it was advised onto huge pages.")
      .def_readonly_static("HUGE_PAGE_BYTES", &dma::Buffer::kHugePageBytes)
      .def_readonly_static("HUGE_PAGES_FROM", &dma::Buffer::kHugePagesFrom);

  m.def("crc32c", [](const py::handle& buffer) {
    BufferView view(buffer, false);
    return dma::crc32c(std::span<const std::byte>(view.data(), view.size()));
  }, py::arg("buffer"), "CRC32C (Castagnoli) of any readable buffer.");
  m.def("version", [] { return std::string(dma::version()); });
}
