// A connection to lockd for tests that must send what the real client never would: malformed
// frames, oversize frames, requests before Hello, wrong versions, or a holder that goes silent.
// Well-formed requests and every reply go through net's BlockingConnection
// (net/blocking_connection.h); only the raw bytes are written here.
#ifndef FENCELOCK_TESTS_SUPPORT_RAW_CONNECTION_H_
#define FENCELOCK_TESTS_SUPPORT_RAW_CONNECTION_H_

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "fencelock/wire.pb.h"
#include "net/blocking_connection.h"
#include "protocol/requests.h"

namespace fencelock::testing {

// Floods 127.0.0.1:`port` with connects for `duration`, as one user holding as many
// connections as it can would: bursts of `burst` non-blocking connects that never read or
// write, each burst held open for `hold`, then closed. Returns how many connects it made.
uint64_t FloodConnects(int port, absl::Duration duration, size_t burst, absl::Duration hold);

// Acquires and releases `lock` with `session` on `worker`, one cycle after the other, for 3.5 s
// while FloodConnects floods `port` (bursts of 500 held 1.2 s, for 3 s), so that lockd commits,
// and writes its COMMITTED mark, throughout. Fails the test at the first cycle that is not
// granted or not released. Returns the cycles done and the connects made.
class RawConnection;
struct FloodOutcome {
  int cycles = 0;
  uint64_t connects = 0;
};
FloodOutcome CyclesDuringAFlood(RawConnection& worker, uint64_t session, const std::string& lock,
                                int port);

// While it lives, processes this one starts may open at most `files` descriptors (the soft
// RLIMIT_NOFILE, inherited at fork), so that a test can run a server out of them.
class FewerOpenFiles {
 public:
  explicit FewerOpenFiles(uint64_t files);
  ~FewerOpenFiles();
  FewerOpenFiles(const FewerOpenFiles&) = delete;
  FewerOpenFiles& operator=(const FewerOpenFiles&) = delete;

 private:
  uint64_t saved_;
};

// A TCP port on 127.0.0.1 that was free a moment ago (for servers that cannot report theirs).
int FreeLoopbackPort();

// A plain blocking TCP socket connected to 127.0.0.1:`port`, or -1.
int ConnectLoopback(int port);

// Requests as tests write them (request ids are set when sent): protocol/requests.h, and a
// Hello that names the tests.
namespace request {
using namespace ::fencelock::protocol::request;  // NOLINT: the protocol's builders
wire::Request Hello();
}  // namespace request

class RawConnection;

// Opens sessions (30 min TTL) on a new connection to `port` after Hello and holds `locks` locks
// named `prefix` + 0, 1, ..., `per_session` to a session (at most lockd's locks per session),
// acquiring them pipelined. Returns the connection; `held` gets each (name, token).
RawConnection HoldLocks(int port, size_t locks, size_t per_session, const std::string& prefix,
                        std::vector<std::pair<std::string, uint64_t>>* held = nullptr);

class RawConnection {
 public:
  static RawConnection Tcp(int port);
  static RawConnection Unix(const std::string& path);
  // Over TLS (a client context), checking that lockd's certificate names 127.0.0.1.
  static RawConnection Tls(int port, std::shared_ptr<net::TlsContext> tls);
  RawConnection(RawConnection&& other) noexcept = default;

  bool SendBytes(const std::string& bytes);
  bool SendRequest(const wire::Request& request);
  // The next response, or nullopt on EOF, error or `timeout`.
  std::optional<wire::Response> ReadResponse(absl::Duration timeout = absl::Seconds(5));
  // True if the server closes the connection (EOF or reset) within `timeout`, discarding
  // anything it sends first.
  bool ClosedByPeer(absl::Duration timeout = absl::Seconds(5));

  // Sends `request` with the next request id and returns the reply to it (skipping pushes for
  // other ids). Aborts the test on EOF or timeout.
  wire::Response Call(wire::Request request);
  // Hello with the current version range; returns the reply.
  wire::Response Hello();
  // Hello, then OpenSession with `ttl`; returns the session id.
  uint64_t HelloAndOpenSession(absl::Duration ttl);
  // Sends every request at once (request ids 1, 2, ...), then reads a reply for each; returns
  // the replies in request order. A reply missing for 15 s is a test failure (and an empty
  // Response); so is a send that lockd does not take within the connection's timeout (5 s;
  // then no replies are read and the result is empty).
  std::vector<wire::Response> Pipeline(std::vector<wire::Request> requests);

 private:
  static RawConnection Connect(const std::string& server,
                               std::shared_ptr<net::TlsContext> tls = nullptr);
  explicit RawConnection(std::unique_ptr<net::BlockingConnection> conn)
      : conn_(std::move(conn)) {}
  std::unique_ptr<net::BlockingConnection> conn_;
};

}  // namespace fencelock::testing

#endif  // FENCELOCK_TESTS_SUPPORT_RAW_CONNECTION_H_
