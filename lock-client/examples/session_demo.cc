// A short scripted session against a running lockd, printing every grant and token: a first
// look at the client API by hand (the README's main command runs the payout demo).
//
//   fencelock-session-demo --server=127.0.0.1:7420
#include <cstdio>
#include <thread>

#include "absl/flags/flag.h"
#include "process/flags.h"
#include "lock-client/client.h"

ABSL_FLAG(std::string, server, "127.0.0.1:7420", "lockd address: host:port or unix:/path");

namespace {

std::unique_ptr<fencelock::Client> Connect(const std::string& server, const char* name) {
  fencelock::ClientOptions options;
  options.server = server;
  options.client_name = name;
  auto client = fencelock::Client::Create(options);
  if (!client.ok()) {
    std::fprintf(stderr, "%s: cannot connect: %s\n", name, client.status().ToString().c_str());
    std::exit(1);
  }
  std::printf("%-8s opened session %lu\n", name,
              static_cast<unsigned long>((*client)->sessionId()));
  return std::move(*client);
}

void Fail(const char* what, const absl::Status& s) {
  std::fprintf(stderr, "demo: %s: %s\n", what, s.ToString().c_str());
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  fencelock::process::ParseFlags(argc, argv);
  const std::string server = absl::GetFlag(FLAGS_server);
  std::printf("fencelock scripted session against lockd at %s\n\n", server.c_str());

  auto alice = Connect(server, "alice");
  auto bob = Connect(server, "bob");

  auto first = alice->acquire("payout-1", absl::Seconds(5));
  if (!first.ok()) Fail("alice acquire", first.status());
  std::printf("alice    acquired %-9s token %-4lu usable lease left %s (TTL 30s x (1 - 0.30), "
              "bounded by the 15s session)\n",
              first->lock().c_str(), static_cast<unsigned long>(first->token()),
              absl::FormatDuration(absl::Trunc(alice->remaining(*first), absl::Milliseconds(1))).c_str());
  alice->checkStillHeld(*first);
  std::printf("alice    checkStillHeld(payout-1): held\n");

  auto busy = bob->tryAcquire("payout-1");
  if (!busy.ok()) Fail("bob tryAcquire", busy.status());
  std::printf("bob      tryAcquire payout-1: %s\n", busy->has_value() ? "granted?!" : "busy");

  absl::StatusOr<fencelock::LockHandle> waited = absl::UnknownError("not run");
  std::thread waiter([&] { waited = bob->acquire("payout-1", absl::Seconds(10)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::printf("bob      waiting for payout-1 ...\n");
  if (absl::Status s = alice->release(*first); !s.ok()) Fail("alice release", s);
  std::printf("alice    released payout-1 (token %lu)\n",
              static_cast<unsigned long>(first->token()));
  waiter.join();
  if (!waited.ok()) Fail("bob acquire", waited.status());
  std::printf("bob      granted  payout-1  token %-4lu (pushed on release; higher than %lu)\n",
              static_cast<unsigned long>(waited->token()),
              static_cast<unsigned long>(first->token()));

  try {
    alice->checkStillHeld(*first);
    std::printf("alice    checkStillHeld(payout-1): held?!\n");
    return 1;
  } catch (const fencelock::LockLostException& e) {
    std::printf("alice    checkStillHeld(payout-1): LockLostException: %s\n", e.what());
  }
  absl::Status stale = alice->release(*first);
  std::printf("alice    release with stale token %lu: %s\n",
              static_cast<unsigned long>(first->token()), stale.ToString().c_str());

  if (absl::Status s = bob->renewNow(); !s.ok()) Fail("bob renew", s);
  std::printf("bob      heartbeat renewed; lease left %s\n",
              absl::FormatDuration(absl::Trunc(bob->remaining(*waited), absl::Milliseconds(1))).c_str());
  if (absl::Status s = bob->release(*waited); !s.ok()) Fail("bob release", s);
  std::printf("bob      released payout-1\n\nsession demo finished: tokens %lu < %lu\n",
              static_cast<unsigned long>(first->token()),
              static_cast<unsigned long>(waited->token()));
  return stale.code() == absl::StatusCode::kAborted ? 0 : 1;
}
