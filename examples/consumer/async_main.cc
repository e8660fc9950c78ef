// The installed asynchronous API from an Asio coroutine: acquire, renew and release a lock with
// co_await, and give up a wait with cancel(). Needs Boost.Asio's headers besides the package.
//
//   consumer-async HOST:PORT
#include <cstdio>
#include <utility>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "lock-client/async.h"
#include "lock-client/client.h"

namespace asio = boost::asio;

asio::awaitable<int> Cycle(fencelock::AsyncClient& locks) {
  absl::StatusOr<fencelock::LockHandle> lock =
      co_await locks.async_acquire("consumer-async", absl::Seconds(5), asio::use_awaitable);
  if (!lock.ok()) {
    std::fprintf(stderr, "consumer-async: acquire: %s\n", lock.status().ToString().c_str());
    co_return 1;
  }
  locks.client().checkStillHeld(*lock);
  const absl::Status renewed = co_await locks.async_renew(*lock, asio::use_awaitable);
  const absl::Status released = co_await locks.async_release(*lock, asio::use_awaitable);
  if (!renewed.ok() || !released.ok()) {
    std::fprintf(stderr, "consumer-async: renew: %s; release: %s\n", renewed.ToString().c_str(),
                 released.ToString().c_str());
    co_return 1;
  }
  std::printf("consumer-async: token %llu acquired, renewed and released with co_await\n",
              static_cast<unsigned long long>(lock->token()));
  co_return 0;
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: consumer-async HOST:PORT (lockd's address)\n");
    return 2;
  }
  auto client = fencelock::Client::Create({.server = argv[1], .client_name = "consumer-async"});
  if (!client.ok()) {
    std::fprintf(stderr, "consumer-async: %s\n", client.status().ToString().c_str());
    return 1;
  }
  asio::io_context io;
  fencelock::AsyncClient locks(io.get_executor(), **client);
  int result = 1;
  asio::co_spawn(io, Cycle(locks), [&](std::exception_ptr e, int r) { result = e ? 1 : r; });
  io.run();
  return result;
}
