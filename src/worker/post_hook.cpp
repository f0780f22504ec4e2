#include "worker/post_hook.hpp"

#include <memory>
#include <mutex>

namespace dma::internal {

namespace detail {
std::atomic<bool> post_hook_set{false};
}  // namespace detail

namespace {
std::mutex hook_mutex;
std::shared_ptr<const std::function<void()>> installed;  // guarded by hook_mutex
}  // namespace

void set_post_hook(std::function<void()> hook) {
  std::lock_guard lock(hook_mutex);
  if (hook) {
    installed = std::make_shared<const std::function<void()>>(std::move(hook));
  } else {
    installed.reset();
  }
  detail::post_hook_set.store(installed != nullptr, std::memory_order_relaxed);
}

void detail::run_post_hook_slow() {
  std::shared_ptr<const std::function<void()>> hook;
  {
    std::lock_guard lock(hook_mutex);
    hook = installed;
  }
  // Outside the lock: the hook may block for as long as the test likes, and the test must be
  // able to remove it meanwhile.
  if (hook) (*hook)();
}

}  // namespace dma::internal
