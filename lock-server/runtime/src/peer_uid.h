// Which local user owns the other end of a loopback TCP connection: lockd counts loopback
// peers by user against --max-connections-per-peer, as it does on the Unix socket. The kernel
// answers through netlink's sock_diag; where netlink sockets are refused (a systemd unit's
// RestrictAddressFamilies= without AF_NETLINK, a container's seccomp profile), /proc/net/tcp
// and /proc/net/tcp6 tell the same, at the cost of reading the table of every TCP socket.
#ifndef FENCELOCK_LOCK_SERVER_PEER_UID_H_
#define FENCELOCK_LOCK_SERVER_PEER_UID_H_

#include <sys/types.h>

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "net/asio.h"

namespace fencelock::server {

// The uid owning the socket at `peer` that is connected to `local`, both loopback addresses;
// nullopt if neither sock_diag nor /proc/net can tell. Does not block: the kernel answers
// netlink within the send, and /proc is read from memory.
std::optional<uid_t> LoopbackPeerUid(const asio::ip::tcp::endpoint& local,
                                     const asio::ip::tcp::endpoint& peer);

// How this process can tell loopback peers apart, for the line lockd logs at start: "netlink
// sock_diag", or "/proc/net/tcp (netlink refused: ...)"; kUnavailable, saying why, when it
// cannot (then every loopback peer is its address, one peer for every local user).
absl::StatusOr<std::string> LoopbackPeerUidSource();

}  // namespace fencelock::server

#endif  // FENCELOCK_LOCK_SERVER_PEER_UID_H_
