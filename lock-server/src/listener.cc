#include "listener.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "fencelock/wire.pb.h"
#include "protocol/codes.h"
#include "protocol/frame.h"

namespace fencelock::server {

absl::Status Listener::Bind() {
  boost::system::error_code ec;
  const auto address = asio::ip::make_address(options_.tcp_host, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot parse listen address \"", options_.tcp_host, "\": ", ec.message()));
  }
  if (!address.is_loopback() && !options_.allow_remote) {
    return absl::InvalidArgumentError(absl::StrCat(
        "listen address ", options_.tcp_host,
        " is not loopback: lockd would be reachable from other machines; pass --allow-remote "
        "to do that on purpose"));
  }
  asio::ip::tcp::endpoint endpoint(address, options_.tcp_port);
  tcp_acceptor_.open(endpoint.protocol(), ec);
  if (!ec) tcp_acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) tcp_acceptor_.bind(endpoint, ec);
  if (!ec) tcp_acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat("cannot listen on tcp ", options_.tcp_host, ":",
                                               options_.tcp_port, ": ", ec.message()));
  }
  tcp_port_ = tcp_acceptor_.local_endpoint().port();
  if (options_.unix_socket_path.empty()) return absl::OkStatus();
  return BindUnixSocket();
}

absl::Status Listener::BindUnixSocket() {
  boost::system::error_code ec;
  const std::string& path = options_.unix_socket_path;
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
    const mode_t old_umask = ::umask(0777 & ~static_cast<mode_t>(options_.unix_socket_mode));
    unix_acceptor_.bind(unix_endpoint, ec);
    ::umask(old_umask);
  }
  if (!ec && ::chmod(path.c_str(), static_cast<mode_t>(options_.unix_socket_mode)) != 0) {
    ec.assign(errno, boost::system::system_category());
  }
  if (!ec && options_.unix_socket_gid >= 0 &&
      ::chown(path.c_str(), static_cast<uid_t>(-1),
              static_cast<gid_t>(options_.unix_socket_gid)) != 0) {
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
  asio::co_spawn(io_, AcceptLoop(tcp_acceptor_), asio::detached);
  if (unix_acceptor_.is_open()) asio::co_spawn(io_, AcceptLoop(unix_acceptor_), asio::detached);
}

template <typename Acceptor>
asio::awaitable<void> Listener::AcceptLoop(Acceptor& acceptor) {
  boost::system::error_code ec;
  while (!stopping_) {
    typename Acceptor::protocol_type::socket socket(io_);
    co_await acceptor.async_accept(socket, asio::redirect_error(asio::use_awaitable, ec));
    if (stopping_) break;
    if (ec) {
      if (ec == asio::error::operation_aborted) break;
      std::fprintf(stderr, "lockd: accept failed: %s\n", ec.message().c_str());
      continue;
    }
    if constexpr (std::is_same_v<typename Acceptor::protocol_type, asio::ip::tcp>) {
      socket.set_option(asio::ip::tcp::no_delay(true), ec);
    }
    const uint64_t id = ++last_id_;
    socket.non_blocking(true, ec);  // the reads and first writes must never block
    // Admission: a refused peer gets one error frame and is closed; nobody else notices.
    absl::Status refused;
    if constexpr (std::is_same_v<typename Acceptor::protocol_type, asio::local::stream_protocol>) {
      refused = CheckPeer(socket.native_handle());
    }
    if (refused.ok() && admitted_ >= options_.max_connections) {
      refused = absl::ResourceExhaustedError(absl::StrCat(
          "lockd already serves ", admitted_,
          " connections, the most it may (lockd --max-connections=", options_.max_connections,
          ")"));
    }
    const bool admitted = refused.ok();
    if (admitted) ++admitted_;
    auto connection = std::make_shared<AsioConnection>(
        core_, Socket(std::move(socket)), options_.max_frame_bytes,
        [this, id, admitted](AsioConnection*) {
          if (admitted) --admitted_;
          open_.erase(id);
        });
    open_[id] = connection;
    if (admitted) {
      connection->Serve();
      continue;
    }
    std::fprintf(stderr, "lockd: refused connection %lu: %s\n", static_cast<unsigned long>(id),
                 std::string(refused.message()).c_str());
    wire::Response r;
    r.set_code(protocol::CodeFromStatus(refused));
    r.set_message(std::string(refused.message()));
    std::string frame;
    (void)protocol::AppendFrame(r.SerializeAsString(), &frame);
    connection->Refuse(frame);
  }
}

absl::Status Listener::CheckPeer(int fd) const {
  if (options_.allowed_uids.empty()) return absl::OkStatus();
  ucred peer{};
  socklen_t len = sizeof(peer);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot read the peer's credentials: ", std::strerror(errno)));
  }
  for (uint32_t uid : options_.allowed_uids) {
    if (peer.uid == uid) return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "user id ", peer.uid, " (pid ", peer.pid, ") may not use lockd on this socket; allowed: ",
      absl::StrJoin(options_.allowed_uids, ","), " (lockd --allowed-uids)"));
}

void Listener::Stop() {
  if (stopping_) return;
  stopping_ = true;
  boost::system::error_code ec;
  tcp_acceptor_.close(ec);
  unix_acceptor_.close(ec);
  std::vector<std::shared_ptr<AsioConnection>> open;
  for (auto& [id, weak] : open_) {
    if (auto c = weak.lock()) open.push_back(std::move(c));
  }
  for (auto& c : open) c->Close();
}

}  // namespace fencelock::server
