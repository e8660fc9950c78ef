#include "peer_uid.h"

#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace fencelock::server {
namespace {

int OpenSockDiag() { return ::socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG); }

// Through sock_diag: the peer's socket is the one whose own address is our remote end and
// whose remote is our local end, asked on the sock_diag socket `fd` (closed here). nullopt if
// the kernel does not answer.
std::optional<uid_t> SockDiagUid(int fd, const asio::ip::tcp::endpoint& local,
                                 const asio::ip::tcp::endpoint& peer) {
  struct {
    nlmsghdr header;
    inet_diag_req_v2 request;
  } query{};
  query.header.nlmsg_len = sizeof(query);
  query.header.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  query.header.nlmsg_flags = NLM_F_REQUEST;
  inet_diag_req_v2& r = query.request;
  r.sdiag_family = peer.address().is_v4() ? AF_INET : AF_INET6;
  r.sdiag_protocol = IPPROTO_TCP;
  r.idiag_states = ~0U;
  r.id.idiag_sport = htons(peer.port());
  r.id.idiag_dport = htons(local.port());
  if (peer.address().is_v4()) {
    const auto a = peer.address().to_v4().to_bytes();
    const auto b = local.address().to_v4().to_bytes();
    std::memcpy(r.id.idiag_src, a.data(), a.size());
    std::memcpy(r.id.idiag_dst, b.data(), b.size());
  } else {
    const auto a = peer.address().to_v6().to_bytes();
    const auto b = local.address().to_v6().to_bytes();
    std::memcpy(r.id.idiag_src, a.data(), a.size());
    std::memcpy(r.id.idiag_dst, b.data(), b.size());
  }
  r.id.idiag_cookie[0] = INET_DIAG_NOCOOKIE;
  r.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  std::optional<uid_t> uid;
  if (::sendto(fd, &query, sizeof(query), 0, reinterpret_cast<sockaddr*>(&kernel),
               sizeof(kernel)) == static_cast<ssize_t>(sizeof(query))) {
    alignas(nlmsghdr) char buffer[8192];
    // The kernel answers within sendto(): never wait for it on the event loop.
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), MSG_DONTWAIT);
    auto* h = reinterpret_cast<nlmsghdr*>(buffer);
    if (n >= static_cast<ssize_t>(sizeof(nlmsghdr)) && NLMSG_OK(h, static_cast<unsigned>(n)) &&
        h->nlmsg_type == SOCK_DIAG_BY_FAMILY &&
        h->nlmsg_len >= NLMSG_LENGTH(sizeof(inet_diag_msg))) {
      uid = static_cast<const inet_diag_msg*>(NLMSG_DATA(h))->idiag_uid;
    }
  }
  ::close(fd);
  return uid;
}

// An endpoint as /proc/net/tcp{,6} prints it: each 32-bit word of the address as it lies in
// memory, in hex ("%08X"), a colon, and the port in hex.
std::string ProcEndpoint(const asio::ip::tcp::endpoint& e) {
  std::string out;
  auto words = [&out](const unsigned char* bytes, size_t n) {
    for (size_t i = 0; i < n; i += 4) {
      uint32_t word = 0;
      std::memcpy(&word, bytes + i, 4);
      absl::StrAppendFormat(&out, "%08X", word);
    }
  };
  if (e.address().is_v4()) {
    const auto a = e.address().to_v4().to_bytes();
    words(a.data(), a.size());
  } else {
    const auto a = e.address().to_v6().to_bytes();
    words(a.data(), a.size());
  }
  absl::StrAppendFormat(&out, ":%04X", e.port());
  return out;
}

const char* ProcTable(const asio::ip::tcp::endpoint& e) {
  return e.address().is_v4() ? "/proc/net/tcp" : "/proc/net/tcp6";
}

// Through /proc/net/tcp{,6}: the line whose local address is the peer and whose remote one is
// ours; its uid column.
std::optional<uid_t> ProcNetUid(const asio::ip::tcp::endpoint& local,
                                const asio::ip::tcp::endpoint& peer) {
  FILE* table = std::fopen(ProcTable(peer), "re");
  if (table == nullptr) return std::nullopt;
  const std::string want_local = ProcEndpoint(peer);
  const std::string want_remote = ProcEndpoint(local);
  std::optional<uid_t> uid;
  char line[512];
  (void)std::fgets(line, sizeof(line), table);  // the header
  while (std::fgets(line, sizeof(line), table) != nullptr) {
    char slot[16], laddr[64], raddr[64], state[8], queues[40], timer[40], retransmits[16];
    unsigned long owner = 0;
    if (std::sscanf(line, "%15s %63s %63s %7s %39s %39s %15s %lu", slot, laddr, raddr, state,
                    queues, timer, retransmits, &owner) != 8) {
      continue;
    }
    if (want_local == laddr && want_remote == raddr) {
      uid = static_cast<uid_t>(owner);
      break;
    }
  }
  std::fclose(table);
  return uid;
}

}  // namespace

std::optional<uid_t> LoopbackPeerUid(const asio::ip::tcp::endpoint& local,
                                     const asio::ip::tcp::endpoint& peer) {
  // /proc/net/tcp lists every TCP socket of the host: read it only where netlink is refused,
  // never as a second try after sock_diag did not find the peer (gone already), and once
  // netlink was refused, stop asking for it at every connection.
  static std::atomic<bool> netlink_refused{false};
  if (!netlink_refused.load(std::memory_order_relaxed)) {
    const int fd = OpenSockDiag();
    if (fd >= 0) return SockDiagUid(fd, local, peer);
    if (errno != EAFNOSUPPORT && errno != EPERM && errno != EACCES) return std::nullopt;
    netlink_refused.store(true, std::memory_order_relaxed);
  }
  return ProcNetUid(local, peer);
}

absl::StatusOr<std::string> LoopbackPeerUidSource() {
  const int fd = OpenSockDiag();
  if (fd >= 0) {
    ::close(fd);
    return std::string("netlink sock_diag");
  }
  const std::string netlink = std::strerror(errno);
  FILE* table = std::fopen("/proc/net/tcp", "re");
  if (table != nullptr) {
    std::fclose(table);
    return absl::StrCat("/proc/net/tcp (netlink sockets refused: ", netlink, ")");
  }
  return absl::UnavailableError(absl::StrCat("netlink sockets refused (", netlink,
                                             ") and /proc/net/tcp unreadable (",
                                             std::strerror(errno), ")"));
}

}  // namespace fencelock::server
