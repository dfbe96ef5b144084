// A small pool of sleeping worker threads for splitting one kernel call into tasks.
//
// The caller takes tasks too; workers wait on a condition variable between calls (no
// spinning: a spinning worker takes CPU from MLX's own scheduler thread and from the
// expert readers on a small machine).
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace edge0k {

class Pool {
 public:
  static Pool& get();
  // run fn(0..n-1), spread over up to `threads` threads (the caller and threads - 1 workers);
  // returns when all are done
  void run(int n, const std::function<void(int)>& fn, int threads);
  int threads() const { return threads_; }
  void reserve(int n);  // at least n - 1 workers (never fewer than before: no thread churn)
  ~Pool();

 private:
  Pool() = default;
  void stop_workers();
  void worker(int id);
  void take(const std::function<void(int)>& fn, int n);

  std::mutex call_mu_;  // one call at a time
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  std::vector<std::thread> workers_;
  const std::function<void(int)>* job_ = nullptr;
  int n_ = 0;
  int limit_ = 1;  // workers with an id below it take tasks of the current job
  std::atomic<int> next_{0};
  int busy_ = 0;  // workers still inside the current job
  unsigned long generation_ = 0;
  bool stopping_ = false;
  int threads_ = 1;  // the caller and its workers
};

}  // namespace edge0k
