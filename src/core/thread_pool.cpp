#include "core/thread_pool.h"

#include <algorithm>
#include <cstdlib>

namespace dsinfer {
namespace {
thread_local bool t_inside_pool = false;
}

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads <= 0) num_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  num_threads_ = num_threads;
  for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn,
                              int64_t min_chunk) {
  if (n <= 0) return;
  const int64_t max_chunks = std::max<int64_t>(1, n / std::max<int64_t>(1, min_chunk));
  const int num_chunks = static_cast<int>(std::min<int64_t>(num_threads_, max_chunks));
  if (num_chunks <= 1 || t_inside_pool || workers_.empty()) {
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> call_lock(call_mu_);
  std::unique_lock<std::mutex> lock(mu_);
  job_ = &fn;
  job_n_ = n;
  job_chunk_ = (n + num_chunks - 1) / num_chunks;
  job_num_chunks_ = num_chunks;
  next_chunk_ = 0;
  chunks_done_ = 0;
  ++generation_;
  work_cv_.notify_all();
  // The caller works too.
  t_inside_pool = true;
  while (next_chunk_ < job_num_chunks_) {
    const int c = next_chunk_++;
    lock.unlock();
    const int64_t b = c * job_chunk_;
    fn(b, std::min(n, b + job_chunk_));
    lock.lock();
    ++chunks_done_;
  }
  t_inside_pool = false;
  done_cv_.wait(lock, [&] { return chunks_done_ == job_num_chunks_; });
  job_ = nullptr;
}

void ThreadPool::worker_loop(int) {
  t_inside_pool = true;
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [&] { return stop_ || (generation_ != seen && job_ != nullptr); });
    if (stop_) return;
    seen = generation_;
    while (job_ != nullptr && next_chunk_ < job_num_chunks_) {
      const int c = next_chunk_++;
      const auto* fn = job_;
      const int64_t n = job_n_, chunk = job_chunk_;
      lock.unlock();
      const int64_t b = c * chunk;
      (*fn)(b, std::min(n, b + chunk));
      lock.lock();
      if (++chunks_done_ == job_num_chunks_) done_cv_.notify_all();
    }
  }
}

ThreadPool& global_thread_pool() {
  static ThreadPool pool([] {
    const char* env = std::getenv("DSINFER_THREADS");
    return env ? std::atoi(env) : 0;
  }());
  return pool;
}

}  // namespace dsinfer
