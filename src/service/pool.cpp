#include "dma/pool.hpp"

#include <pthread.h>

#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

namespace dma {

// A FIFO of jobs in a ring that only grows: a std::deque allocates and frees a chunk every few
// jobs, and the CRC pool takes a job per checksum batch, so a steady stream would allocate on
// every transfer's path. Not thread-safe (the pool's mutex guards it).
class JobQueue {
 public:
  bool empty() const noexcept { return count_ == 0; }
  void push(std::function<void()> job) {
    if (count_ == slots_.size()) grow();
    slots_[(head_ + count_) % slots_.size()] = std::move(job);
    ++count_;
  }
  std::function<void()> pop() {
    std::function<void()> job = std::move(slots_[head_]);
    slots_[head_] = nullptr;
    head_ = (head_ + 1) % slots_.size();
    --count_;
    return job;
  }

 private:
  void grow() {
    std::vector<std::function<void()>> larger(slots_.empty() ? 16 : 2 * slots_.size());
    for (std::size_t index = 0; index < count_; ++index) {
      larger[index] = std::move(slots_[(head_ + index) % slots_.size()]);
    }
    slots_.swap(larger);
    head_ = 0;
  }
  std::vector<std::function<void()>> slots_;
  std::size_t head_ = 0;
  std::size_t count_ = 0;
};

// Owned by its Pool; the threads borrow it, and the Pool joins them before it goes away.
struct Pool::State {
  explicit State(std::size_t count) : thread_count(count) {}

  // One pool thread: runs jobs until told to stop *and* the queue is empty, so that every job
  // posted before the destructor (or by a job during the drain) still runs.
  void run(std::size_t index) {
    char name[16];  // the kernel's limit, NUL included
    std::snprintf(name, sizeof name, "dma-crc-%02zu", index);
    pthread_setname_np(pthread_self(), name);

    std::unique_lock lock(mutex);
    while (true) {
      ready.wait(lock, [this] { return stopping || !jobs.empty(); });
      if (jobs.empty()) return;  // stopping, and nothing left to drain
      std::function<void()> job = jobs.pop();
      lock.unlock();
      // A job that throws ends the process through std::terminate, as on any std::thread: jobs
      // report failure through what they capture, never by unwinding into the pool.
      job();
      // Destroy what the job captured before taking the lock: its destructors may post.
      job = nullptr;
      lock.lock();
    }
  }

  // Wakes every thread to drain and exit, then joins them. Called once.
  void stop_and_join() {
    {
      std::lock_guard lock(mutex);
      stopping = true;
    }
    ready.notify_all();
    for (std::thread& thread : threads) thread.join();
    threads.clear();
  }

  const std::size_t thread_count;
  std::mutex mutex;
  std::condition_variable ready;
  JobQueue jobs;                           // guarded by mutex
  bool stopping = false;                   // guarded by mutex
  std::vector<std::thread> threads;        // touched only by create() and the destructor
};

Result<std::shared_ptr<Pool>> Pool::create(std::size_t threads) {
  if (threads == 0) return fail(ErrorCode::kInvalidArgument, "a pool needs at least one thread");
  auto state = std::make_unique<State>(threads);
  state->threads.reserve(threads);
  try {
    for (std::size_t i = 0; i < threads; ++i) {
      state->threads.emplace_back([raw = state.get(), i] { raw->run(i); });
    }
  } catch (const std::system_error& error) {
    // std::thread reports a failed pthread_create (EAGAIN: the thread limit) by throwing.
    const std::size_t started = state->threads.size();
    state->stop_and_join();
    return fail(ErrorCode::kResourceExhausted, "cannot start pool thread " +
                                                   std::to_string(started + 1) + " of " +
                                                   std::to_string(threads) + ": " + error.what());
  }
  return std::shared_ptr<Pool>(new Pool(std::move(state)));
}

Pool::Pool(std::unique_ptr<State> state) : state_(std::move(state)) {}

Pool::~Pool() { state_->stop_and_join(); }

void Pool::post(std::function<void()> job) {
  // An empty job would throw std::bad_function_call on a pool thread and terminate the process.
  if (!job) return;
  {
    std::lock_guard lock(state_->mutex);
    state_->jobs.push(std::move(job));
  }
  state_->ready.notify_one();
}

std::size_t Pool::threads() const noexcept { return state_->thread_count; }

}  // namespace dma
