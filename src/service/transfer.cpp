// Transfer: a waitable (and co_awaitable) handle on one transfer, built on Operands::on_complete.
#include <condition_variable>
#include <mutex>

#include "dma/service.hpp"

namespace dma {

struct Transfer::State {
  std::mutex mutex;
  std::condition_variable done;
  std::optional<Outcome> outcome;
  std::unique_ptr<Operands> context;
  std::coroutine_handle<> waiter;

  // The outcome is known: wakes the waiters. `inner` (the caller's context) comes with it, or
  // later through complete() for a transfer that expired while the provider held it.
  void complete(Outcome result, std::unique_ptr<Operands> inner) {
    std::coroutine_handle<> resume;
    {
      std::lock_guard lock(mutex);
      if (!outcome) outcome = std::move(result);  // an expiry already told the waiters
      context = std::move(inner);
      resume = std::exchange(waiter, nullptr);
    }
    done.notify_all();
    if (resume) resume.resume();
  }
};

namespace {
// Wraps the caller's context so its completion lands in a Transfer's state instead of the batch
// completer.
class AwaitedOperands final : public Operands {
 public:
  AwaitedOperands(std::unique_ptr<Operands> inner, std::shared_ptr<Transfer::State> state)
      : inner_(std::move(inner)), state_(std::move(state)) {}
  std::span<const std::byte> source() override { return inner_->source(); }
  std::span<std::byte> allocate(std::size_t length) override { return inner_->allocate(length); }
  std::optional<CacheableSpan> cacheable_span() override { return inner_->cacheable_span(); }
  bool on_complete(Outcome& outcome) override {
    state_->complete(std::move(outcome), std::move(inner_));
    return true;
  }
  void on_expired(const Error& error) override {
    inner_->on_expired(error);
    state_->complete(fail(error), nullptr);
  }
  // The caller's context, for a transfer that was never submitted.
  std::unique_ptr<Operands> release() { return std::move(inner_); }

 private:
  std::unique_ptr<Operands> inner_;
  std::shared_ptr<Transfer::State> state_;
};
}  // namespace

Result<Transfer> FabricService::transfer(TransferRequest&& request) {
  if (!request.context) return fail(ErrorCode::kInvalidArgument, "transfer has no context");
  auto state = std::make_shared<Transfer::State>();
  std::unique_ptr<Operands> inner = std::move(request.context);
  request.context = std::make_unique<AwaitedOperands>(std::move(inner), state);
  if (Status submitted = submit(std::move(request)); !submitted) {
    // Refused requests are left untouched: give the caller its own context back.
    request.context = static_cast<AwaitedOperands*>(request.context.get())->release();
    return fail(std::move(submitted).error());
  }
  return Transfer(std::move(state));
}

bool Transfer::ready() const {
  std::lock_guard lock(state_->mutex);
  return state_->outcome.has_value();
}

Outcome Transfer::wait() {
  std::unique_lock lock(state_->mutex);
  state_->done.wait(lock, [&] { return state_->outcome.has_value(); });
  return *state_->outcome;
}

Outcome Transfer::wait_for(std::chrono::milliseconds timeout) {
  std::unique_lock lock(state_->mutex);
  if (!state_->done.wait_for(lock, timeout, [&] { return state_->outcome.has_value(); })) {
    return fail(ErrorCode::kTimedOut, "transfer did not complete within " +
                                          std::to_string(timeout.count()) + " ms");
  }
  return *state_->outcome;
}

std::unique_ptr<Operands> Transfer::take_context() {
  std::lock_guard lock(state_->mutex);
  return std::move(state_->context);
}

bool Transfer::await_suspend(std::coroutine_handle<> waiter) {
  std::lock_guard lock(state_->mutex);
  if (state_->outcome.has_value()) return false;  // completed meanwhile: do not suspend
  state_->waiter = waiter;
  return true;
}

}  // namespace dma
