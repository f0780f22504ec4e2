// The CRC pool: every posted job runs, on the pool's own named threads, even across destruction.
#include <gtest/gtest.h>

#include <pthread.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "dma/pool.hpp"

namespace dma {
namespace {

constexpr auto kDeadline = std::chrono::seconds(30);

// Counts finished jobs; waits for a number of them with a deadline instead of sleeping. Tests
// declare it (and Gate) before the pool, so the pool's threads are joined before it goes away: a
// job may still be inside add() when the waiter wakes up.
class Counter {
 public:
  void add() {
    {
      std::lock_guard lock(mutex_);
      ++count_;
    }
    changed_.notify_all();
  }
  bool wait_for(std::size_t target) {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, kDeadline, [&] { return count_ >= target; });
  }
  std::size_t count() {
    std::lock_guard lock(mutex_);
    return count_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::size_t count_ = 0;
};

// A one-shot signal between threads, with a deadline on the wait.
class Gate {
 public:
  void open() {
    {
      std::lock_guard lock(mutex_);
      open_ = true;
    }
    opened_.notify_all();
  }
  bool wait() {
    std::unique_lock lock(mutex_);
    return opened_.wait_for(lock, kDeadline, [&] { return open_; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable opened_;
  bool open_ = false;
};

std::shared_ptr<Pool> make_pool(std::size_t threads) {
  auto pool = Pool::create(threads);
  if (!pool) {
    ADD_FAILURE() << pool.error().describe();
    return nullptr;
  }
  return std::move(*pool);
}

TEST(Pool, a_pool_of_zero_threads_is_refused) {
  // If this fails, a pool that can never run a job is handed out, and every checksum hangs.
  auto pool = Pool::create(0);
  ASSERT_FALSE(pool);
  EXPECT_EQ(pool.error().code(), ErrorCode::kInvalidArgument);
}

TEST(Pool, reports_the_thread_count_it_was_made_with) {
  // If this fails, callers sizing their batches by the pool see the wrong width.
  auto pool = make_pool(3);
  ASSERT_TRUE(pool);
  EXPECT_EQ(pool->threads(), 3u);
}

TEST(Pool, every_posted_job_runs) {
  // If this fails, a completed transfer's checksum is never computed and its caller never
  // answered.
  Counter done;
  auto pool = make_pool(4);
  ASSERT_TRUE(pool);
  constexpr std::size_t kJobs = 10000;
  for (std::size_t i = 0; i < kJobs; ++i) pool->post([&done] { done.add(); });
  ASSERT_TRUE(done.wait_for(kJobs)) << done.count() << " of " << kJobs;
  pool.reset();
  EXPECT_EQ(done.count(), kJobs);
}

TEST(Pool, the_destructor_runs_the_jobs_still_queued) {
  // If this fails, shutting a service down drops queued checksums, leaving their callers
  // unanswered.
  Gate gate;
  Counter done;
  auto pool = make_pool(1);
  ASSERT_TRUE(pool);
  // The only thread is held here while the rest queue up behind it.
  pool->post([&] {
    EXPECT_TRUE(gate.wait());
    done.add();
  });
  constexpr std::size_t kQueued = 1000;
  for (std::size_t i = 0; i < kQueued; ++i) pool->post([&done] { done.add(); });
  gate.open();
  pool.reset();  // returns only once the queue is drained
  EXPECT_EQ(done.count(), kQueued + 1);
}

TEST(Pool, jobs_posted_from_several_threads_all_run_once) {
  // If this fails, concurrent posts from several workers lose or duplicate jobs.
  Counter done;
  auto pool = make_pool(3);
  ASSERT_TRUE(pool);
  constexpr std::size_t kPosters = 8;
  constexpr std::size_t kJobsEach = 2000;
  std::vector<std::thread> posters;
  for (std::size_t p = 0; p < kPosters; ++p) {
    posters.emplace_back([&] {
      for (std::size_t i = 0; i < kJobsEach; ++i) pool->post([&done] { done.add(); });
    });
  }
  for (std::thread& poster : posters) poster.join();
  ASSERT_TRUE(done.wait_for(kPosters * kJobsEach));
  pool.reset();
  EXPECT_EQ(done.count(), kPosters * kJobsEach);
}

TEST(Pool, jobs_run_concurrently_on_separate_threads) {
  // If this fails, a pool of N threads runs one job at a time, and CRC throughput does not scale.
  Gate first_started;
  Gate second_ran;
  Counter done;
  auto pool = make_pool(2);
  ASSERT_TRUE(pool);
  // The first job can only finish once the second has run, which needs a second thread.
  pool->post([&] {
    first_started.open();
    EXPECT_TRUE(second_ran.wait());
    done.add();
  });
  ASSERT_TRUE(first_started.wait());
  pool->post([&] {
    second_ran.open();
    done.add();
  });
  EXPECT_TRUE(done.wait_for(2));
}

TEST(Pool, its_threads_are_named_for_diagnostics) {
  // If this fails, pool threads cannot be told apart from the fabric worker in top, gdb or perf.
  std::mutex mutex;
  std::set<std::string> names;
  Counter done;
  Counter started;
  auto pool = make_pool(2);
  ASSERT_TRUE(pool);
  // Hold both threads at once so that each records its own name.
  for (int i = 0; i < 2; ++i) {
    pool->post([&] {
      started.add();
      EXPECT_TRUE(started.wait_for(2));
      char name[16] = {};
      pthread_getname_np(pthread_self(), name, sizeof name);
      {
        std::lock_guard lock(mutex);
        names.insert(name);
      }
      done.add();
    });
  }
  ASSERT_TRUE(done.wait_for(2));
  pool.reset();
  EXPECT_EQ(names, (std::set<std::string>{"dma-crc-00", "dma-crc-01"}));
}

TEST(Pool, jobs_never_run_on_the_posting_thread) {
  // If this fails, the fabric worker computes checksums itself and stalls its event loop.
  const std::thread::id poster = std::this_thread::get_id();
  std::thread::id runner;
  Counter done;
  auto pool = make_pool(1);
  ASSERT_TRUE(pool);
  pool->post([&] {
    runner = std::this_thread::get_id();
    done.add();
  });
  ASSERT_TRUE(done.wait_for(1));
  pool.reset();
  EXPECT_NE(runner, poster);
}

TEST(Pool, an_empty_job_is_ignored_rather_than_aborting_a_pool_thread) {
  // If this fails, posting an empty std::function throws bad_function_call on a pool thread
  // and aborts.
  Counter done;
  auto pool = make_pool(1);
  ASSERT_TRUE(pool);
  pool->post(std::function<void()>());
  pool->post([&done] { done.add(); });
  EXPECT_TRUE(done.wait_for(1));
}

}  // namespace
}  // namespace dma
