// dma._dma's conversions between Python and the C++ API: dma::Error into the dma.Error classes
// (registered on the module at import), Python buffers as byte spans, keys, configurations and
// timeouts. Every function here is called with the GIL held.
#pragma once

#include <pybind11/pybind11.h>

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dma/configuration.hpp"
#include "dma/result.hpp"

namespace dma_python {

namespace py = pybind11;

// Creates dma.Error and its subclass per dma::ErrorCode on `module` (once, at import).
void register_errors(py::module_& module);

// Raises `error` as the dma.Error subclass for its code, with .kind and .message.
[[noreturn]] void raise(const dma::Error& error);

template <typename T>
T check(dma::Result<T> result) {
  if (!result) raise(result.error());
  return std::move(result).value();
}
inline void check(dma::Status status) {
  if (!status) raise(status.error());
}

// One export of a Python buffer (PyObject_GetBuffer), released when this goes. Create and
// destroy it with the GIL held.
class BufferView {
 public:
  BufferView(const py::handle& object, bool writable) {
    const int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(object.ptr(), &view_, flags) != 0) throw py::error_already_set();
    held_ = true;
  }
  ~BufferView() { release(); }
  BufferView(const BufferView&) = delete;
  BufferView& operator=(const BufferView&) = delete;

  void release() {
    if (held_) PyBuffer_Release(&view_);
    held_ = false;
  }
  std::byte* data() const { return static_cast<std::byte*>(view_.buf); }
  std::size_t size() const { return static_cast<std::size_t>(view_.len); }
  bool writable() const { return !view_.readonly; }

 private:
  Py_buffer view_{};
  bool held_ = false;
};

std::string key_of(const py::handle& key);

dma::Configuration configuration_of(const std::optional<std::string>& config_path,
                                    const std::optional<std::string>& provider,
                                    const std::optional<std::vector<std::string>>& providers,
                                    const std::optional<std::vector<std::string>>& interfaces,
                                    const std::optional<std::string>& bind);

// A positive timeout in seconds, rounded to milliseconds; ValueError otherwise.
std::chrono::milliseconds milliseconds_of(double seconds);
// A duration of zero or more seconds (up to a day), rounded to microseconds; ValueError naming
// `name` otherwise.
std::chrono::microseconds microseconds_of(double seconds, const char* name);

}  // namespace dma_python
