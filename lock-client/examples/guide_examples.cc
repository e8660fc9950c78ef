// The examples of docs/client.md, compiled and run by client_guide_test against a real lockd.
// doc_snippets_test checks that every C++ block of the guide appears here word for word, so
// the guide cannot show code that does not build.
#include "guide_examples.h"

#include <chrono>
#include <cstdio>
#include <future>
#include <string>
#include <vector>

#include <boost/asio/use_awaitable.hpp>

#include "fence/fence.h"
#include "lock-client/async.h"
#include "lock-client/client.h"

namespace guide {

using fencelock::Client;
using fencelock::ClientOptions;
using fencelock::LockLostException;
using fencelock::LossReason;
using fencelock::StepCost;
using fencelock::StepRefusedException;

std::unique_ptr<Client> Connect(const std::string& server) {
  ClientOptions options;
  options.server = server;  // "host:port", "unix:/path", or "a:7420,b:7420,c:7420"
  options.client_name = "payments-worker";
  // The one irreversible step this worker takes, and its worst case: the rail's read timeout
  // plus 2 s. Create() refuses TTLs and a margin that could never cover it.
  options.steps = {StepCost{"rail_submit", absl::Seconds(3)}};
  auto client = Client::Create(options);
  if (!client.ok()) {
    std::fprintf(stderr, "cannot start: %s\n", client.status().ToString().c_str());
    return nullptr;
  }
  return std::move(*client);
}

bool PayUnderAScopedLock(Client& client, fencelock::fence::TokenFence& rail) {
  auto lock = client.acquireScoped("payout-42", absl::Seconds(10));
  if (!lock.ok()) return false;  // kDeadlineExceeded: someone else held it for 10 s
  try {
    lock->checkStillHeld();  // local and cheap: call it before each step
    lock->beginIrreversibleStep(StepCost{"rail_submit", absl::Seconds(3)});
    // The resource checks the token itself (fence 2): a stale holder is refused there.
    if (!rail.Admit("payout-42", lock->token()).ok()) return false;
    return true;
  } catch (const StepRefusedException& e) {
    return false;  // too little lease left to finish: abandon before acting (D4)
  } catch (const LockLostException& e) {
    return false;  // e.reason(): deadline_passed, fenced_out, session_lost, ...
  }
}  // the ScopedLock releases payout-42 here, whatever happened

int PayEach(Client& client, fencelock::fence::TokenFence& rail,
            const std::vector<std::string>& keys) {
  int paid = 0;
  for (const std::string& key : keys) {
    auto lock = client.acquire(key, absl::Seconds(10));
    if (!lock.ok()) break;
    if (rail.Admit(key, lock->token()).ok()) ++paid;
    (void)client.releaseWithNextRequest(*lock);  // goes out with the next acquire
  }
  return paid;
}

bool ReadUnderASharedLock(Client& client, fencelock::fence::TokenFence& ledger) {
  // Readers hold "ledger-7" together; a writer waits for them, and readers that come after a
  // waiting writer wait behind it.
  auto lock = client.acquireSharedScoped("ledger-7", absl::Seconds(10));
  if (!lock.ok()) return false;
  lock->checkStillHeld();  // the same deadline rule as an exclusive holder's
  // A read is refused only once a newer writer has written; readers never refuse each other.
  return ledger.AdmitRead("ledger-7", lock->token()).ok();
}

bool WriteWithALockDelay(Client& client, fencelock::fence::TokenFence& ledger) {
  // For a resource that cannot check a token: if this holder is lost (its lease runs out, or
  // its session ends on lockd), nobody gets "ledger-7" for 5 s after, so a late write from it
  // has that long to land before a new holder starts. A release starts no delay.
  fencelock::AcquireOptions options;
  options.lock_delay = absl::Seconds(5);
  auto lock = client.acquireScoped("ledger-7", absl::Seconds(10), options);
  if (!lock.ok()) return false;
  return ledger.Admit("ledger-7", lock->token()).ok();
}

bool ReactToLoss(Client& client) {
  auto lock = client.acquire("report-7", absl::Seconds(10));
  if (!lock.ok()) return false;
  // Called once, on the client's callback thread, the moment the lease is gone: at its
  // deadline (a timer) or when lockd says so. Never for a lock released below.
  absl::Status watched = client.onLost(*lock, [](LossReason reason) {
    std::fprintf(stderr, "report-7 lost: %s; stopping its work\n",
                 fencelock::LossReasonName(reason));
  });
  // The same as a future, for code that would rather wait on it.
  std::future<LossReason> lost = client.whenLost(*lock);
  const bool still_held = lost.wait_for(std::chrono::milliseconds(0)) == std::future_status::timeout;
  return watched.ok() && still_held && client.release(*lock).ok();
}

boost::asio::awaitable<bool> PayFromACoroutine(fencelock::AsyncClient& locks,
                                               fencelock::fence::TokenFence& rail) {
  absl::StatusOr<fencelock::LockHandle> lock = co_await locks.async_acquire(
      "payout-43", absl::Seconds(10), boost::asio::use_awaitable);
  if (!lock.ok()) co_return false;  // kDeadlineExceeded, kCancelled after locks.cancel(), ...
  bool paid = false;
  try {
    locks.client().beginIrreversibleStep(*lock, StepCost{"rail_submit", absl::Seconds(3)});
    paid = rail.Admit("payout-43", lock->token()).ok();
  } catch (const LockLostException& e) {
    paid = false;  // as in the blocking code: abandon, and still give the lock back
  }
  const absl::Status released = co_await locks.async_release(*lock, boost::asio::use_awaitable);
  co_return paid && released.ok();
}

bool GiveUpWaiting(boost::asio::io_context& io, fencelock::AsyncClient& locks) {
  bool gave_up = false;
  locks.async_acquire("payout-44", absl::Seconds(30),
                      [&](absl::StatusOr<fencelock::LockHandle> lock) {
                        gave_up = absl::IsCancelled(lock.status());
                      });
  // The work went elsewhere: stop waiting. lockd takes the waiter out of the lock's queue, and
  // the handler runs with kCancelled.
  locks.cancel();
  io.run();
  return gave_up;
}

}  // namespace guide
