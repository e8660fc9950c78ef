#include "task_thread.h"

#include <utility>

namespace fencelock::client_internal {

void TaskThread::Post(std::function<void()> task) {
  {
    StdMutexLock lock(&mu_);
    if (!stopped_ && !stopping_) {
      tasks_.push_back(std::move(task));
      if (!thread_.joinable()) {
        thread_ = std::thread([this] { Run(); });
        id_.store(thread_.get_id(), std::memory_order_release);
      }
      wake_.notify_one();
      return;
    }
  }
  task();
}

void TaskThread::Stop() {
  std::thread thread;
  {
    StdMutexLock lock(&mu_);
    if (stopped_) return;
    stopping_ = true;
    wake_.notify_one();
    thread = std::move(thread_);
  }
  if (thread.joinable()) thread.join();
  id_.store(std::thread::id(), std::memory_order_release);
  StdMutexLock lock(&mu_);
  stopped_ = true;
}

void TaskThread::StopFromItsThread() {
  StdMutexLock lock(&mu_);
  stopping_ = true;
  delete_on_exit_ = true;
  thread_.detach();
}

void TaskThread::Run() {
  StdMutexLock lock(&mu_);
  for (;;) {
    lock.Wait(wake_, [this] {
      mu_.AssertHeld();
      return stopping_ || !tasks_.empty();
    });
    if (tasks_.empty()) {  // stopping, and everything posted has run
      if (delete_on_exit_) {
        stopped_ = true;
        lock.Unlock();
        delete this;
      }
      return;
    }
    std::function<void()> task = std::move(tasks_.front());
    tasks_.pop_front();
    lock.Unlock();
    task();
    lock.Lock();
  }
}

}  // namespace fencelock::client_internal
