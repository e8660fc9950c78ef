// Asio's SSL layer, for the src/ files that run TLS connections (net/tls.h makes the contexts).
#ifndef FENCELOCK_NET_ASIO_SSL_H_
#define FENCELOCK_NET_ASIO_SSL_H_

#include "net/asio.h"

#include <boost/asio/ssl.hpp>

#endif  // FENCELOCK_NET_ASIO_SSL_H_
