#include "listener.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <openssl/ssl.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>
#include <vector>

#include "logging/logging.h"
#include "peer_uid.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "fencelock/wire.pb.h"
#include "protocol/codes.h"
#include "protocol/frame.h"

namespace fencelock::server {
namespace {

// Repeated listener lines of one kind (refusals, accept failures) at most once per this long.
constexpr absl::Duration kLogInterval = absl::Seconds(10);
// After accept() fails for want of a resource, wait this long before the next try (doubling up
// to the maximum while it keeps failing): the backlog stays readable, so retrying at once
// would only spin.
constexpr auto kAcceptBackoffMin = std::chrono::milliseconds(50);
constexpr auto kAcceptBackoffMax = std::chrono::seconds(1);
// How long a peer refused at admission has to complete its TLS handshake and hear why.
constexpr absl::Duration kRefusedHandshakeTimeout = absl::Seconds(1);

bool OutOfResources(const boost::system::error_code& ec) {
  return ec == asio::error::no_descriptors || ec.value() == ENFILE ||
         ec == asio::error::no_buffer_space || ec == asio::error::no_memory;
}

std::string ErrorFrame(const absl::Status& status) {
  wire::Response r;
  // A refusal before any request is never about versions: kFailedPrecondition (a plaintext
  // client on the TLS port) is FAILED_PRECONDITION, as docs/contracts.md says.
  r.set_code(absl::IsFailedPrecondition(status) ? wire::FAILED_PRECONDITION
                                                : protocol::CodeFromStatus(status));
  r.set_message(std::string(status.message()));
  std::string frame;
  (void)protocol::AppendFrame(r.SerializeAsString(), &frame);
  return frame;
}

}  // namespace

Listener::Listener(asio::io_context& io, ServerCore* core, TimeSource* time,
                   const ServerOptions& options, std::shared_ptr<net::TlsContext> tls)
    : io_(io),
      core_(core),
      options_(options),
      budget_(ConnectionBudget::For(options.connections)),
      log_(time, kLogInterval,
           [](const std::string& line) { logging::Lockd().Warning(line); }),
      tls_(std::move(tls)),
      tcp_acceptor_(io),
      unix_acceptor_(io),
      spare_fd_(::open("/dev/null", O_RDONLY | O_CLOEXEC)) {
  if (tls_) {
    // Asio's context takes a reference of its own to the one net::TlsContext loaded.
    SSL_CTX_up_ref(tls_->native());
    tls_context_.emplace(tls_->native());
  }
  if (auto set = ReadinessSet::Create(io); set.ok()) {
    readiness_ = std::move(*set);
  } else {
    logging::Lockd().Warning(absl::StrCat(set.status().message(),
                                          "; each connection waits on its own socket instead"));
  }
}

void Listener::SetTls(std::shared_ptr<net::TlsContext> tls) {
  if (tls_ == nullptr || tls == nullptr) return;
  tls_ = std::move(tls);
  // As in the constructor: Asio's context holds a reference of its own. The context it
  // replaces is freed once the connections made with it (their SSL objects hold it) are gone.
  SSL_CTX_up_ref(tls_->native());
  tls_context_.emplace(tls_->native());
}

Listener::~Listener() {
  log_.Flush();
  if (spare_fd_ >= 0) ::close(spare_fd_);
}

absl::Status EnsureDescriptorBudget(uint64_t max_connections, std::string* raised) {
  const uint64_t needed = max_connections + kMaxRefusingConnections + kReservedDescriptors;
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) {
    return absl::InternalError(absl::StrCat("getrlimit(RLIMIT_NOFILE): ", std::strerror(errno)));
  }
  if (limit.rlim_cur == RLIM_INFINITY || limit.rlim_cur >= needed) return absl::OkStatus();
  if (limit.rlim_max != RLIM_INFINITY && limit.rlim_max < needed) {
    const uint64_t own = kMaxRefusingConnections + kReservedDescriptors;
    const uint64_t most = limit.rlim_max > own ? limit.rlim_max - own : 0;
    return absl::InvalidArgumentError(absl::StrCat(
        "--max-connections=", max_connections, " needs ", needed, " open files (",
        kReservedDescriptors, " for lockd itself, ", kMaxRefusingConnections,
        " for connections being refused), but the hard limit is ",
        limit.rlim_max, ": lower --max-connections to at most ", most,
        " or raise the limit (ulimit -Hn, or LimitNOFILE= under systemd)"));
  }
  const rlim_t before = limit.rlim_cur;
  limit.rlim_cur = needed;
  if (::setrlimit(RLIMIT_NOFILE, &limit) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max-connections=", max_connections, " needs ", needed,
        " open files and the limit is ", before, "; raising it failed: ", std::strerror(errno)));
  }
  *raised = absl::StrCat("raised the limit on open files from ", before, " to ", needed,
                         " for --max-connections=", max_connections);
  return absl::OkStatus();
}

absl::Status Listener::Bind() {
  boost::system::error_code ec;
  // ServerOptions::Validate() made sure that there is something to listen on.
  if (!options_.listen.tcp) return BindUnixSocket();
  const auto address = asio::ip::make_address(options_.listen.tcp_host, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot parse listen address \"", options_.listen.tcp_host, "\": ", ec.message()));
  }
  if (!address.is_loopback() && !tls_) {
    // Anyone on the network could read and forge a plaintext stream; other machines must reach
    // lockd over TLS with client certificates.
    return absl::InvalidArgumentError(absl::StrCat(
        "listen address ", options_.listen.tcp_host,
        " is not loopback: lockd serves plaintext TCP on loopback (127.0.0.0/8, ::1) only; to "
        "serve other machines give TLS certificates (--tls-ca, --tls-cert, --tls-key)"));
  }
  asio::ip::tcp::endpoint endpoint(address, options_.listen.tcp_port);
  tcp_acceptor_.open(endpoint.protocol(), ec);
  if (!ec) tcp_acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) tcp_acceptor_.bind(endpoint, ec);
  if (!ec) tcp_acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat("cannot listen on tcp ", options_.listen.tcp_host, ":",
                                               options_.listen.tcp_port, ": ", ec.message()));
  }
  tcp_port_ = tcp_acceptor_.local_endpoint().port();
  if (address.is_loopback()) {
    // Loopback peers are told apart by user; say so when the kernel cannot tell them.
    auto source = LoopbackPeerUidSource();
    if (!source.ok()) {
      logging::Lockd().Warning(absl::StrCat(
          "lockd cannot tell local users apart on loopback TCP: ", source.status().message(),
          "; every loopback peer counts as one (its address) against "
          "--max-connections-per-peer=", options_.connections.max_connections_per_peer,
          ". Allow AF_NETLINK (systemd: RestrictAddressFamilies=) or serve local users on the "
          "Unix socket"));
    } else if (*source != "netlink sock_diag") {
      logging::Lockd().Info(absl::StrCat("loopback TCP peers are told apart by user through ",
                                         *source));
    }
  }
  if (options_.listen.unix_socket_path.empty()) return absl::OkStatus();
  return BindUnixSocket();
}

absl::Status Listener::BindUnixSocket() {
  boost::system::error_code ec;
  const std::string& path = options_.listen.unix_socket_path;
  // Asio throws for a path that does not fit a socket address: refuse it first, by name.
  if (path.size() >= sizeof(sockaddr_un::sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unix socket path ", path, " is ", path.size(), " bytes; a socket path may have at most ",
        sizeof(sockaddr_un::sun_path) - 1));
  }
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return absl::InvalidArgumentError(
          absl::StrCat("unix socket path ", path, " exists and is not a socket"));
    }
    // A socket file that nobody answers on is left over from a server that died.
    asio::local::stream_protocol::socket probe(io_);
    probe.connect(asio::local::stream_protocol::endpoint(path), ec);
    if (!ec) {
      return absl::UnavailableError(
          absl::StrCat("unix socket ", path, " is in use by another server"));
    }
    ::unlink(path.c_str());
  }
  asio::local::stream_protocol::endpoint unix_endpoint(path);
  unix_acceptor_.open(unix_endpoint.protocol(), ec);
  if (!ec) {
    // bind() creates the file with 0777 & ~umask: narrow the umask for that call so the socket
    // never exists with more permissions than asked for. lockd starts no thread that creates
    // files before it listens.
    const mode_t old_umask = ::umask(0777 & ~static_cast<mode_t>(options_.listen.unix_socket_mode));
    unix_acceptor_.bind(unix_endpoint, ec);
    ::umask(old_umask);
  }
  if (!ec && ::chmod(path.c_str(), static_cast<mode_t>(options_.listen.unix_socket_mode)) != 0) {
    ec.assign(errno, boost::system::system_category());
  }
  if (!ec && options_.listen.unix_socket_gid >= 0 &&
      ::chown(path.c_str(), static_cast<uid_t>(-1),
              static_cast<gid_t>(options_.listen.unix_socket_gid)) != 0) {
    ec.assign(errno, boost::system::system_category());
  }
  if (!ec) unix_acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on unix socket ", path, ": ", ec.message()));
  }
  return absl::OkStatus();
}

void Listener::Start() {
  if (tcp_acceptor_.is_open()) asio::co_spawn(io_, AcceptLoop(tcp_acceptor_), asio::detached);
  if (unix_acceptor_.is_open()) asio::co_spawn(io_, AcceptLoop(unix_acceptor_), asio::detached);
}

template <typename Acceptor>
asio::awaitable<void> Listener::AcceptLoop(Acceptor& acceptor) {
  constexpr bool kUnix =
      std::is_same_v<typename Acceptor::protocol_type, asio::local::stream_protocol>;
  boost::system::error_code ec;
  asio::steady_timer backoff_timer(io_);
  std::chrono::milliseconds backoff = kAcceptBackoffMin;
  while (!stopping_) {
    typename Acceptor::protocol_type::socket socket(io_);
    co_await acceptor.async_accept(socket, asio::redirect_error(asio::use_awaitable, ec));
    if (stopping_) break;
    if (ec) {
      if (ec == asio::error::operation_aborted) break;
      if (OutOfResources(ec)) {
        RefuseBacklog(acceptor.native_handle());
        Log("accept", absl::StrCat("cannot accept connections: ", ec.message(),
                                   " (lockd --max-connections=", options_.connections.max_connections,
                                   "; raise the limit on open files or lower it); waiting "
                                   "peers are refused, retrying in ", backoff.count(), " ms"));
      } else {
        Log("accept", absl::StrCat("accept failed: ", ec.message()));
      }
      // Never retry at once: what failed will most likely fail again.
      backoff_timer.expires_after(backoff);
      co_await backoff_timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
      backoff = std::min<std::chrono::milliseconds>(backoff * 2, kAcceptBackoffMax);
      continue;
    }
    backoff = kAcceptBackoffMin;
    if constexpr (!kUnix) socket.set_option(asio::ip::tcp::no_delay(true), ec);
    const uint64_t id = ++last_id_;
    socket.non_blocking(true, ec);  // the reads and first writes must never block
    // Admission: a refused peer gets one error frame and is closed; nobody else notices.
    std::string peer;
    std::string identity;  // authenticated: the kernel's word for the Unix socket's peer
    absl::Status refused;
    if constexpr (kUnix) {
      std::optional<ucred> cred = PeerCredentials(socket.native_handle());
      peer = cred ? absl::StrCat("user id ", cred->uid) : "a Unix-socket peer";
      if (cred) identity = absl::StrCat("uid:", cred->uid);
      refused = CheckAllowed(cred);
    } else {
      peer = TcpPeerIdentity(socket.local_endpoint(ec), socket.remote_endpoint(ec));
    }
    if (refused.ok()) refused = CheckConnectionLimits(peer);
    const bool admitted = refused.ok();
    if (admitted) {
      ++admitted_;
      ++per_peer_[peer];
    } else {
      peer.clear();
      if (refusing_ >= kMaxRefusingConnections) {
        // Refusals in progress already hold their share of descriptors: this one is told in
        // one non-blocking send, if at all (never over TLS, which needs a handshake first),
        // and closed at once. A flood of connects then costs lockd no descriptor beyond the
        // share, so its log's files can always be opened and admitted clients are served.
        if (!tls_context_ || kUnix) {
          const std::string frame = ErrorFrame(refused);
          (void)::send(socket.native_handle(), frame.data(), frame.size(),
                       MSG_NOSIGNAL | MSG_DONTWAIT);
        }
        socket.close(ec);
        core_->CountTransportEvent(TransportEvent::kRefused);
        Log("refused at once",
            absl::StrCat("refused connection ", id, " at once: ", refused.message(), " (",
                         kMaxRefusingConnections, " refusals are already under way)"));
        continue;
      }
      ++refusing_;
    }
    auto connection = std::make_shared<AsioConnection>(
        core_, Socket(std::move(socket)), budget_,
        [this, id, peer, admitted](AsioConnection*, CloseReason reason) {
          if (!admitted) --refusing_;
          if (!peer.empty()) {
            --admitted_;
            if (--per_peer_[peer] == 0) per_peer_.erase(peer);
          }
          open_.erase(id);
          if (reason == CloseReason::kSlowReader) {
            core_->CountTransportEvent(TransportEvent::kClosedSlowReader);
            Log("slow reader", absl::StrCat("closed connection ", id,
                                            ": its replies went unread past the bound "
                                            "(lockd --slow-reader-timeout=",
                                            absl::FormatDuration(options_.connections.slow_reader_timeout),
                                            ")"));
          }
        },
        readiness_);
    open_[id] = connection;
    if constexpr (!kUnix) {
      if (tls_context_) {
        // Over TLS even a refusal is said inside the TLS session, or the peer would only see a
        // broken handshake; a refused peer gets less time for it.
        connection->Handshake(
            *tls_context_, admitted ? options_.connections.hello_timeout : kRefusedHandshakeTimeout,
            [this, id, refused](AsioConnection& c, absl::StatusOr<std::string> identity) {
              if (absl::IsFailedPrecondition(identity.status())) {
                Refuse(c, id, identity.status());  // plaintext on the TLS port: said plainly
              } else if (!identity.ok()) {
                core_->CountTransportEvent(TransportEvent::kRefused);
                // Limited per reason (OpenSSL's are few), so that a flood of one kind does not
                // hide another.
                const std::string why(identity.status().message());
                Log(absl::StrCat("tls ", why), absl::StrCat("refused connection ", id, ": ", why));
                c.Close();
              } else if (refused.ok()) {
                c.Serve(std::move(*identity));
              } else {
                Refuse(c, id, refused);
              }
            });
        continue;
      }
    }
    if (admitted) {
      connection->Serve(std::move(identity));
      continue;
    }
    Refuse(*connection, id, refused);
  }
}

void Listener::Refuse(AsioConnection& connection, uint64_t id, const absl::Status& why) {
  core_->CountTransportEvent(TransportEvent::kRefused);
  Log("refused", absl::StrCat("refused connection ", id, ": ", why.message()));
  connection.Refuse(ErrorFrame(why));
}

void Listener::RefuseBacklog(int listen_fd) {
  if (spare_fd_ < 0) return;
  ::close(spare_fd_);
  spare_fd_ = -1;
  const std::string frame = ErrorFrame(absl::ResourceExhaustedError(
      "lockd is out of file descriptors and cannot serve this connection; retry later"));
  // A bounded round: the peers waiting now, not every one that arrives meanwhile.
  for (int i = 0; i < 256; ++i) {
    const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) break;
    (void)::send(fd, frame.data(), frame.size(), MSG_NOSIGNAL);
    ::close(fd);
    core_->CountTransportEvent(TransportEvent::kRefused);
  }
  spare_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
}

std::optional<ucred> Listener::PeerCredentials(int fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return std::nullopt;
  return cred;
}

std::string Listener::TcpPeerIdentity(const asio::ip::tcp::endpoint& local,
                                      const asio::ip::tcp::endpoint& peer) {
  if (peer.address().is_loopback()) {
    if (auto uid = LoopbackPeerUid(local, peer)) return absl::StrCat("user id ", *uid);
  }
  return absl::StrCat("address ", peer.address().to_string());
}

absl::Status Listener::CheckAllowed(const std::optional<ucred>& peer) const {
  if (options_.listen.allowed_uids.empty()) return absl::OkStatus();
  if (!peer) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot read the peer's credentials: ", std::strerror(errno)));
  }
  for (uint32_t uid : options_.listen.allowed_uids) {
    if (peer->uid == uid) return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "user id ", peer->uid, " (pid ", peer->pid, ") may not use lockd on this socket; allowed: ",
      absl::StrJoin(options_.listen.allowed_uids, ","), " (lockd --allowed-uids)"));
}

absl::Status Listener::CheckConnectionLimits(const std::string& peer) const {
  if (admitted_ >= options_.connections.max_connections) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "lockd already serves ", admitted_,
        " connections, the most it may (lockd --max-connections=", options_.connections.max_connections,
        ")"));
  }
  const size_t limit = std::min(options_.connections.max_connections_per_peer, options_.connections.max_connections);
  const auto it = per_peer_.find(peer);
  if (it != per_peer_.end() && it->second >= limit) {
    return absl::ResourceExhaustedError(absl::StrCat(
        peer, " already has ", it->second,
        " connections, the most one peer may (lockd --max-connections-per-peer=", limit, ")"));
  }
  return absl::OkStatus();
}

void Listener::StopAccepting() {
  boost::system::error_code ec;
  tcp_acceptor_.close(ec);
  unix_acceptor_.close(ec);
}

void Listener::Stop() {
  if (stopping_) return;
  stopping_ = true;
  StopAccepting();
  std::vector<std::shared_ptr<AsioConnection>> open;
  for (auto& [id, weak] : open_) {
    if (auto c = weak.lock()) open.push_back(std::move(c));
  }
  for (auto& c : open) c->Close();
}

}  // namespace fencelock::server
