// A fixed pool of worker threads for data-parallel loops on the CPU backend.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace dsinfer {

class ThreadPool {
 public:
  // num_threads counts the calling thread too; 0 means hardware concurrency.
  explicit ThreadPool(int num_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Calls fn(begin, end) on disjoint chunks covering [0, n); blocks until all are done.
  // The split is a pure function of n and the thread count, so results that depend only on
  // each chunk are deterministic. Nested calls from inside fn run inline.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn,
                    int64_t min_chunk = 1);

 private:
  void worker_loop(int worker_index);

  int num_threads_;
  std::vector<std::thread> workers_;
  std::mutex call_mu_;  // one parallel_for at a time from outside the pool
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0;
  int64_t job_chunk_ = 0;
  int job_num_chunks_ = 0;
  int next_chunk_ = 0;
  int chunks_done_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

// The process-wide pool used by the CPU backend (sized from DSINFER_THREADS or the cores).
ThreadPool& global_thread_pool();

}  // namespace dsinfer
