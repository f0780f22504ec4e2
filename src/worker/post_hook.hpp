// Test-only: a hook the poster runs just before each fi_writemsg/fi_read, inside the span where
// it has lent its gate out (service_shared.hpp, Gate). A hook that blocks makes the worker look
// exactly like one stuck inside a provider call, which is how tests reach the watchdog's path
// without a provider that hangs on demand (tests/test_availability.cpp).
//
// Cost when unset: one relaxed load of an atomic flag per post. Thread-safety: set_post_hook may
// be called from any thread at any time; a hook being run keeps its own copy alive.
#pragma once

#include <atomic>
#include <functional>

namespace dma::internal {

// Installs `hook` for every worker in the process; an empty function removes it.
void set_post_hook(std::function<void()> hook);

namespace detail {
extern std::atomic<bool> post_hook_set;
void run_post_hook_slow();
}  // namespace detail

inline void run_post_hook() {
  if (detail::post_hook_set.load(std::memory_order_relaxed)) detail::run_post_hook_slow();
}

}  // namespace dma::internal
