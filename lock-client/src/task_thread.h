// One thread that runs posted tasks in order, started by the first Post. The client runs on it
// what must not run on its I/O thread or on a caller's: the user's callbacks of the callback API,
// and the slow paths of asynchronous calls (reconnecting, renewing) that block.
//
// Waits without a timeout, so a wall-clock step changes nothing.
#ifndef FENCELOCK_LOCK_CLIENT_TASK_THREAD_H_
#define FENCELOCK_LOCK_CLIENT_TASK_THREAD_H_

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <thread>

#include "clock/std_mutex.h"

namespace fencelock::client_internal {

class TaskThread {
 public:
  TaskThread() = default;
  TaskThread(const TaskThread&) = delete;
  TaskThread& operator=(const TaskThread&) = delete;
  ~TaskThread() { Stop(); }

  // Runs `task` on the thread after every task posted before it. After Stop(), runs it on the
  // calling thread instead, so that nothing posted is ever dropped.
  void Post(std::function<void()> task);

  // Runs every task posted so far, then ends the thread. Must not be called from a task.
  void Stop();

  // Whether the calling thread is this object's thread (a task is calling).
  bool OnItsThread() const {
    return id_.load(std::memory_order_acquire) == std::this_thread::get_id();
  }
  // Stop() for a task that destroys the owner (a user's callback destroying the client): the
  // thread runs what is posted and then deletes this object itself. The owner must not delete
  // it; nothing may be posted after.
  void StopFromItsThread();

 private:
  void Run();

  StdMutex mu_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  bool delete_on_exit_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_ ABSL_GUARDED_BY(mu_);
  // thread_'s id, for OnItsThread, which any thread may call without the lock (while Post
  // starts the thread, say); cleared once Stop has joined it, for ids are reused.
  std::atomic<std::thread::id> id_;
};

}  // namespace fencelock::client_internal

#endif  // FENCELOCK_LOCK_CLIENT_TASK_THREAD_H_
