// The worker pool behind the kernels' thread count (pool.h).
#include "pool.h"

namespace edge0k {

Pool& Pool::get() {
  static Pool pool;
  return pool;
}

Pool::~Pool() { stop_workers(); }

void Pool::stop_workers() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  start_cv_.notify_all();
  for (auto& t : workers_) t.join();
  workers_.clear();
  stopping_ = false;
}

void Pool::reserve(int n) {
  std::lock_guard<std::mutex> call(call_mu_);
  for (; threads_ < n; ++threads_) workers_.emplace_back(&Pool::worker, this, threads_);
}

void Pool::take(const std::function<void(int)>& fn, int n) {
  for (int i = next_.fetch_add(1); i < n; i = next_.fetch_add(1)) fn(i);
}

void Pool::worker(int id) {
  unsigned long seen = 0;
  for (;;) {
    const std::function<void(int)>* job;
    int n;
    bool mine;
    {
      std::unique_lock<std::mutex> lock(mu_);
      start_cv_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
      job = job_;
      n = n_;
      mine = id < limit_;
    }
    if (mine) take(*job, n);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--busy_ == 0) done_cv_.notify_one();
    }
  }
}

void Pool::run(int n, const std::function<void(int)>& fn, int threads) {
  if (n <= 0) return;
  std::lock_guard<std::mutex> call(call_mu_);
  if (threads_ <= 1 || threads <= 1 || n == 1) {
    for (int i = 0; i < n; ++i) fn(i);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &fn;
    n_ = n;
    limit_ = threads;
    next_.store(0);
    busy_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  start_cv_.notify_all();
  take(fn, n);
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return busy_ == 0; });
  job_ = nullptr;
}

}  // namespace edge0k
