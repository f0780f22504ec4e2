#include "conversions.hpp"

#include <string>
#include <utility>
#include <vector>

namespace dma_python {
namespace {

struct ErrorClass {
  dma::ErrorCode code;
  const char* name;
  PyObject* extra_base;  // a builtin it also derives from, or nullptr
  const char* doc;
};

// The Python classes, created once at import (module lifetime: never freed).
PyObject* g_error_base = nullptr;
std::vector<std::pair<dma::ErrorCode, PyObject*>> g_error_classes;

}  // namespace

void register_errors(py::module_& m) {
  g_error_base = PyErr_NewExceptionWithDoc(
      "dma.Error", "A dma call failed: .kind is its ErrorKind, .message says what happened.",
      PyExc_Exception, nullptr);
  m.attr("Error") = py::handle(g_error_base);
  const ErrorClass classes[] = {
      {dma::ErrorCode::kInvalidArgument, "InvalidArgumentError", PyExc_ValueError,
       "The input is malformed or out of range (a buffer too small, a server error reply)."},
      {dma::ErrorCode::kConfiguration, "ConfigurationError", nullptr,
       "A configuration file or option is wrong."},
      {dma::ErrorCode::kFabric, "FabricError", nullptr, "libfabric refused or failed an operation."},
      {dma::ErrorCode::kUnreachable, "UnreachableError", PyExc_ConnectionError,
       "The server or peer cannot be reached (connection failed, closed or timed out)."},
      {dma::ErrorCode::kTimedOut, "TimedOutError", PyExc_TimeoutError,
       "A wait or a posted operation passed its deadline."},
      {dma::ErrorCode::kWorkerGone, "WorkerGoneError", nullptr, "A worker thread has exited."},
      {dma::ErrorCode::kNotFound, "NotFoundError", nullptr,
       "No such provider, domain, peer or file."},
      {dma::ErrorCode::kResourceExhausted, "ResourceExhaustedError", nullptr,
       "A queue, address vector or memory limit is full."},
      {dma::ErrorCode::kCorrupted, "CorruptedError", nullptr, "A checksum did not match."},
  };
  for (const ErrorClass& entry : classes) {
    PyObject* bases = entry.extra_base != nullptr
                          ? PyTuple_Pack(2, g_error_base, entry.extra_base)
                          : PyTuple_Pack(1, g_error_base);
    const std::string qualified = std::string("dma.") + entry.name;
    PyObject* cls = PyErr_NewExceptionWithDoc(qualified.c_str(), entry.doc, bases, nullptr);
    Py_DECREF(bases);
    if (cls == nullptr) throw py::error_already_set();
    g_error_classes.emplace_back(entry.code, cls);
    m.attr(entry.name) = py::handle(cls);
  }
}

[[noreturn]] void raise(const dma::Error& error) {
  PyObject* type = g_error_base;
  for (const auto& [code, cls] : g_error_classes) {
    if (code == error.code()) type = cls;
  }
  py::object instance = py::reinterpret_borrow<py::object>(type)(error.describe());
  instance.attr("kind") = py::cast(error.code());
  instance.attr("message") = py::str(error.message());
  PyErr_SetObject(type, instance.ptr());
  throw py::error_already_set();
}

// A key as bytes: str is UTF-8, anything else must be a readable buffer.
std::string key_of(const py::handle& key) {
  if (py::isinstance<py::str>(key)) return key.cast<std::string>();
  BufferView view(key, false);
  return std::string(reinterpret_cast<const char*>(view.data()), view.size());
}

dma::Configuration configuration_of(const std::optional<std::string>& config_path,
                                    const std::optional<std::string>& provider,
                                    const std::optional<std::vector<std::string>>& providers,
                                    const std::optional<std::vector<std::string>>& interfaces,
                                    const std::optional<std::string>& bind) {
  dma::Configuration configuration;
  if (config_path) configuration = check(dma::Configuration::load(*config_path));
  if (provider) configuration.providers = {*provider};
  if (providers) configuration.providers = *providers;
  if (interfaces) configuration.interfaces = *interfaces;
  if (bind) configuration.bind = *bind;
  check(configuration.validate());
  return configuration;
}

std::chrono::milliseconds milliseconds_of(double seconds) {
  if (!(seconds > 0)) throw py::value_error("timeout must be a positive number of seconds");
  return std::chrono::milliseconds(static_cast<long long>(seconds * 1000.0 + 0.5));
}

std::chrono::microseconds microseconds_of(double seconds, const char* name) {
  constexpr double kDay = 86400.0;
  if (!(seconds >= 0 && seconds <= kDay)) {
    throw py::value_error(std::string(name) + " must be between 0 and 86400 seconds");
  }
  return std::chrono::microseconds(static_cast<long long>(seconds * 1e6 + 0.5));
}

}  // namespace dma_python
