// Includes Boost.Asio the way this project needs it: Boost 1.74's asio/awaitable.hpp uses
// std::exchange without including <utility>, which GCC 12 in C++20 mode rejects, so <utility>
// comes first. Include this instead of any boost/asio header, and only from src/ files: Asio
// is too heavy for public headers.
#ifndef FENCELOCK_NET_ASIO_H_
#define FENCELOCK_NET_ASIO_H_

#include <utility>

#include <boost/asio.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>

namespace fencelock {
namespace asio = boost::asio;
}  // namespace fencelock

#endif  // FENCELOCK_NET_ASIO_H_
