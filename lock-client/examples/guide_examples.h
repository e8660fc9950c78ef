// The examples of docs/client.md (guide_examples.cc).
#ifndef FENCELOCK_LOCK_CLIENT_EXAMPLES_GUIDE_EXAMPLES_H_
#define FENCELOCK_LOCK_CLIENT_EXAMPLES_GUIDE_EXAMPLES_H_

#include <memory>
#include <string>

#include "fence/fence.h"
#include "lock-client/client.h"

namespace guide {

std::unique_ptr<fencelock::Client> Connect(const std::string& server);
bool PayUnderAScopedLock(fencelock::Client& client, fencelock::fence::TokenFence& rail);
bool ReactToLoss(fencelock::Client& client);

}  // namespace guide

#endif  // FENCELOCK_LOCK_CLIENT_EXAMPLES_GUIDE_EXAMPLES_H_
