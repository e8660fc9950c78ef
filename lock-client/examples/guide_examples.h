// The examples of docs/client.md (guide_examples.cc).
#ifndef FENCELOCK_LOCK_CLIENT_EXAMPLES_GUIDE_EXAMPLES_H_
#define FENCELOCK_LOCK_CLIENT_EXAMPLES_GUIDE_EXAMPLES_H_

#include <memory>
#include <string>
#include <vector>

#include <utility>  // before Asio (Boost 1.74 with GCC 12)

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>

#include "fence/fence.h"
#include "lock-client/async.h"
#include "lock-client/client.h"

namespace guide {

std::unique_ptr<fencelock::Client> Connect(const std::string& server);
bool PayUnderAScopedLock(fencelock::Client& client, fencelock::fence::TokenFence& rail);
int PayEach(fencelock::Client& client, fencelock::fence::TokenFence& rail,
            const std::vector<std::string>& keys);
bool ReadUnderASharedLock(fencelock::Client& client, fencelock::fence::TokenFence& ledger);
bool WriteWithALockDelay(fencelock::Client& client, fencelock::fence::TokenFence& ledger);
bool ReactToLoss(fencelock::Client& client);
boost::asio::awaitable<bool> PayFromACoroutine(fencelock::AsyncClient& locks,
                                               fencelock::fence::TokenFence& rail);
bool GiveUpWaiting(boost::asio::io_context& io, fencelock::AsyncClient& locks);

}  // namespace guide

#endif  // FENCELOCK_LOCK_CLIENT_EXAMPLES_GUIDE_EXAMPLES_H_
