// Issue 15: lockd on TCP with TLS 1.3 and client certificates, against a real lockd with
// certificates the test makes with scripts/make-certs.sh (openssl). A client is served only
// with a certificate from lockd's CA, that has not expired, and with its own key; it is known
// by its certificate's name, which the permissions file limits; and one identity cannot drive
// another's session even with its exact id, token and secret.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "clock/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lock-client/client.h"
#include "lock-client/pool_client.h"
#include "lockd_process.h"
#include "net/tls.h"
#include "process/process.h"
#include "protocol/frame.h"
#include "raw_connection.h"

namespace fencelock {
namespace {

using ::testing::HasSubstr;
using testing::LockdProcess;
using testing::RawConnection;
namespace request = testing::request;

// Runs `command` in a shell; the test fails if it does not exit 0.
void Shell(const std::string& command) {
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
}

// Made once for every test: certificates take a moment.
class Certificates {
 public:
  Certificates() {
    const std::string make = MAKE_CERTS_SCRIPT;
    Shell(absl::StrCat(make, " ", a(), " lockd worker-1 worker-2 admin-1 > /dev/null"));
    // Another CA, with a client of the same name, and a server lockd's clients do not trust.
    Shell(absl::StrCat(make, " ", b(), " impostor worker-1 > /dev/null"));
    // Valid for a day, three days ago.
    Shell(absl::StrCat("DAYS=1 ", FAKETIME_BINARY, " -f -3d ", make, " ", a(),
                     " lockd-old expired-worker > /dev/null"));
  }
  std::string a() const { return dir_.path() + "/a"; }
  std::string b() const { return dir_.path() + "/b"; }
  net::TlsFiles Client(const std::string& name, const std::string& ca_dir = "") const {
    return {.ca_file = (ca_dir.empty() ? a() : ca_dir) + "/ca.crt",
            .cert_file = a() + "/" + name + ".crt",
            .key_file = a() + "/" + name + ".key"};
  }

 private:
  testing::TempDir dir_;
};

const Certificates& Certs() {
  static const Certificates* certs = new Certificates();
  return *certs;
}

std::shared_ptr<net::TlsContext> ClientContext(const net::TlsFiles& files) {
  auto context = net::TlsContext::Create(files, net::TlsRole::kClient, "--tls-");
  EXPECT_TRUE(context.ok()) << context.status();
  return context.ok() ? *context : nullptr;
}

// A client that skips every check of its own: TLS 1.3 to 127.0.0.1:`port` with whatever
// certificate and key it is given (none if empty), then Hello. Returns "" if lockd answered
// the Hello, otherwise where and why it failed. This is how a careless or hostile peer looks.
std::string TryHandshake(int port, const std::string& ca, const std::string& cert,
                         const std::string& key) {
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
  SSL_CTX_load_verify_file(ctx, ca.c_str());
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  if (!cert.empty()) SSL_CTX_use_certificate_file(ctx, cert.c_str(), SSL_FILETYPE_PEM);
  if (!key.empty()) SSL_CTX_use_PrivateKey_file(ctx, key.c_str(), SSL_FILETYPE_PEM);
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  timeval five{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &five, sizeof(five));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  std::string outcome;
  SSL* ssl = SSL_new(ctx);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    outcome = "connect failed";
  } else {
    SSL_set_fd(ssl, fd);
    std::string frame;
    wire::Request hello = request::Hello();
    hello.set_request_id(1);
    (void)protocol::AppendFrame(hello.SerializeAsString(), &frame);
    char reply[4096];
    size_t n = 0;
    if (SSL_connect(ssl) != 1) {
      outcome = "handshake: " + net::TakeTlsErrors("failed");
    } else if (SSL_write_ex(ssl, frame.data(), frame.size(), &n) != 1) {
      outcome = "write: " + net::TakeTlsErrors("failed");
    } else if (SSL_read_ex(ssl, reply, sizeof(reply), &n) != 1) {
      // In TLS 1.3 the server judges the client's certificate after the client's handshake
      // is done: its refusal arrives as an alert on the first read.
      outcome = "read: " + net::TakeTlsErrors("connection closed");
    }
  }
  SSL_free(ssl);
  SSL_CTX_free(ctx);
  close(fd);
  return outcome;
}

class TlsTest : public ::testing::Test {
 protected:
  TlsTest() {
    std::ofstream(permissions_) << "cn:worker-1 acquire payout/\n"
                                   "cn:worker-2 acquire payout/\n"
                                   "cn:admin-1  acquire admin/ payout/\n"
                                   "cn:admin-1  inspect\n";
    lockd_ = std::make_unique<LockdProcess>(LockdProcess::Options{
        .extra_args = ServeArgs(Certs().a(), "lockd"), .stderr_file = log_});
  }
  std::vector<std::string> ServeArgs(const std::string& dir, const std::string& server) {
    return {"--tls-ca=" + dir + "/ca.crt", "--tls-cert=" + dir + "/" + server + ".crt",
            "--tls-key=" + dir + "/" + server + ".key", "--permissions=" + permissions_};
  }
  RawConnection Connect(const std::string& name) {
    return RawConnection::Tls(lockd_->port(), ClientContext(Certs().Client(name)));
  }
  wire::StatsReply Stats() {
    RawConnection admin = Connect("admin-1");
    admin.Hello();
    return admin.Call(request::GetStats()).stats();
  }
  std::string Log() { return testing::ReadTextFile(log_); }

  testing::TempDir tmp_;
  const std::string permissions_ = tmp_.path() + "/permissions";
  const std::string log_ = tmp_.path() + "/lockd.stderr";
  std::unique_ptr<LockdProcess> lockd_;
};

TEST_F(TlsTest, AClientWithACertificateFromTheCaIsServedUnderItsName) {
  const net::TlsFiles files = Certs().Client("worker-1");
  auto client = Client::Create({.server = absl::StrCat("127.0.0.1:", lockd_->port()),
                                .tls_ca_file = files.ca_file,
                                .tls_cert_file = files.cert_file,
                                .tls_key_file = files.key_file});
  ASSERT_TRUE(client.ok()) << client.status();
  auto held = (*client)->acquire("payout/1", absl::Seconds(1), absl::ZeroDuration());
  ASSERT_TRUE(held.ok()) << held.status();
  // The permissions file knows it by its certificate: limited to payout/.
  auto refused = (*client)->acquire("admin/x", absl::Seconds(1), absl::ZeroDuration());
  EXPECT_TRUE(absl::IsPermissionDenied(refused.status())) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr("cn:worker-1"));
  EXPECT_TRUE((*client)->release(*held).ok());

  // lockctl over TLS, as an identity that may inspect.
  const net::TlsFiles admin = Certs().Client("admin-1");
  const std::string out = tmp_.path() + "/lockctl.out";
  Shell(absl::StrCat(LOCKCTL_BINARY, " --server=127.0.0.1:", lockd_->port(),
                   " --tls-ca=", admin.ca_file, " --tls-cert=", admin.cert_file,
                   " --tls-key=", admin.key_file, " status > ", out));
  EXPECT_THAT(testing::ReadTextFile(out), HasSubstr("health"));

  // The pool client over TLS: lockd knows it by its certificate (and admin-1 may not list
  // pools).
  auto pools = PoolClient::Create({.server = absl::StrCat("127.0.0.1:", lockd_->port()),
                                   .tls_ca_file = admin.ca_file,
                                   .tls_cert_file = admin.cert_file,
                                   .tls_key_file = admin.key_file});
  ASSERT_TRUE(pools.ok()) << pools.status();
  auto view = (*pools)->status("nosuchpool");
  EXPECT_TRUE(absl::IsPermissionDenied(view.status())) << view.status();
  EXPECT_THAT(view.status().message(), HasSubstr("cn:admin-1 may not see pool nosuchpool"));
}

TEST_F(TlsTest, NoCertificateAnUnknownCaAndAnExpiredCertificateAreRefusedAtTheHandshake) {
  const std::string ca = Certs().a() + "/ca.crt";
  const std::string no_certificate = TryHandshake(lockd_->port(), ca, "", "");
  const std::string unknown_ca = TryHandshake(lockd_->port(), ca, Certs().b() + "/worker-1.crt",
                                              Certs().b() + "/worker-1.key");
  const std::string expired =
      TryHandshake(lockd_->port(), ca, Certs().a() + "/expired-worker.crt",
                   Certs().a() + "/expired-worker.key");
  // A server's certificate, from the right CA, is not a client's.
  const std::string server_certificate =
      TryHandshake(lockd_->port(), ca, Certs().a() + "/lockd.crt", Certs().a() + "/lockd.key");
  const std::string good = TryHandshake(lockd_->port(), ca, Certs().a() + "/worker-1.crt",
                                        Certs().a() + "/worker-1.key");
  EXPECT_EQ(good, "");
  EXPECT_THAT(no_certificate, HasSubstr("certificate required"));
  EXPECT_THAT(unknown_ca, HasSubstr("unknown ca"));
  EXPECT_THAT(expired, HasSubstr("certificate expired"));
  EXPECT_THAT(server_certificate, HasSubstr("unsupported certificate"));
  // lockd says which, counts them as refused connections, and serves nobody from them.
  const wire::StatsReply stats = Stats();
  EXPECT_EQ(stats.connections_refused_total(), 4u);
  EXPECT_EQ(stats.sessions(), 0u);
  const std::string log = Log();
  EXPECT_THAT(log, HasSubstr("peer did not return a certificate"));
  EXPECT_THAT(log, HasSubstr("unable to get local issuer certificate"));
  EXPECT_THAT(log, HasSubstr("certificate has expired"));
  EXPECT_THAT(log, HasSubstr("unsuitable certificate purpose"));
}

TEST_F(TlsTest, AWrongKeyIsRefusedBeforeAnyByteIsSent) {
  // OpenSSL will not pair a certificate with a key that is not its own, so a client holding
  // worker-1's certificate without its key cannot even offer it: the client refuses to start.
  const net::TlsFiles stolen = {.ca_file = Certs().a() + "/ca.crt",
                                .cert_file = Certs().a() + "/worker-1.crt",
                                .key_file = Certs().a() + "/worker-2.key"};
  auto client = Client::Create({.server = absl::StrCat("127.0.0.1:", lockd_->port()),
                                .tls_ca_file = stolen.ca_file,
                                .tls_cert_file = stolen.cert_file,
                                .tls_key_file = stolen.key_file});
  EXPECT_TRUE(absl::IsInvalidArgument(client.status())) << client.status();
  EXPECT_THAT(client.status().message(), HasSubstr("worker-2.key"));
  // The raw client cannot offer it either: lockd sees no certificate.
  EXPECT_THAT(TryHandshake(lockd_->port(), stolen.ca_file, stolen.cert_file, stolen.key_file),
              HasSubstr("certificate required"));
  // lockd itself with a key that is not its certificate's refuses to start, naming both.
  testing::TempDir state;
  Shell(absl::StrCat(LOCKD_BINARY, " init --data-dir=", state.path(), "/s > /dev/null"));
  auto lockd = process::Child::Spawn(
      LOCKD_BINARY,
      {"serve", "--data-dir=" + state.path() + "/s", "--port=0", "--metrics-port=-1",
       "--tls-ca=" + Certs().a() + "/ca.crt", "--tls-cert=" + Certs().a() + "/lockd.crt",
       "--tls-key=" + Certs().a() + "/worker-1.key"},
      {.stderr_file = state.path() + "/err"});
  ASSERT_TRUE(lockd.ok());
  const std::optional<int> status = lockd->Wait(absl::Seconds(20));
  ASSERT_TRUE(status.has_value()) << "lockd did not exit";
  EXPECT_NE(*status, 0);
  EXPECT_THAT(testing::ReadTextFile(state.path() + "/err"),
              HasSubstr("key values mismatch"));
}

TEST_F(TlsTest, ClientsRefuseAServerTheirCaDidNotSignOrThatHasAnotherName) {
  // An impostor: a lockd with a certificate from another CA.
  LockdProcess impostor({.extra_args = ServeArgs(Certs().b(), "impostor")});
  auto to_impostor = net::BlockingConnection::Connect(
      {.server = absl::StrCat("127.0.0.1:", impostor.port()),
       .tls = ClientContext(Certs().Client("worker-1"))});
  EXPECT_TRUE(absl::IsUnavailable(to_impostor.status())) << to_impostor.status();
  EXPECT_THAT(std::string(to_impostor.status().message()),
              HasSubstr("certificate verify failed (lockd's certificate: "));
  // The real lockd, but expected under another name.
  auto misnamed = net::BlockingConnection::Connect(
      {.server = absl::StrCat("127.0.0.1:", lockd_->port()),
       .tls = ClientContext(Certs().Client("worker-1")),
       .tls_server_name = "lockd.example"});
  EXPECT_THAT(std::string(misnamed.status().message()), HasSubstr("hostname mismatch"));
  // Its own name (make-certs.sh puts DNS:lockd, DNS:localhost and IP:127.0.0.1 in it) is fine.
  auto named = net::BlockingConnection::Connect(
      {.server = absl::StrCat("127.0.0.1:", lockd_->port()),
       .tls = ClientContext(Certs().Client("worker-1")),
       .tls_server_name = "lockd"});
  EXPECT_TRUE(named.ok()) << named.status();
}

// Issue 33: over TLS, connects with no certificate at all (each refused one held for its
// handshake and a linger, outside every limit) ran lockd out of descriptors and into its
// disk-fault state. Refusals now hold at most their own share: an admitted worker is served
// throughout the flood.
TEST_F(TlsTest, AFloodOfConnectsWithoutCertificatesNeverEndsService) {
  std::unique_ptr<LockdProcess> small;
  {
    testing::FewerOpenFiles limit(256);
    std::vector<std::string> args = ServeArgs(Certs().a(), "lockd");
    args.push_back("--max-connections=8");
    small = std::make_unique<LockdProcess>(LockdProcess::Options{
        .extra_args = args, .stderr_file = tmp_.path() + "/small.stderr"});
  }
  RawConnection worker =
      RawConnection::Tls(small->port(), ClientContext(Certs().Client("worker-1")));
  const uint64_t session = worker.HelloAndOpenSession(absl::Seconds(60));
  const testing::FloodOutcome flood =
      testing::CyclesDuringAFlood(worker, session, "payout/flooded", small->port());
  std::printf("%d acquire + release cycles over TLS during a flood of %lu connects\n",
              flood.cycles, static_cast<unsigned long>(flood.connects));
  EXPECT_GT(flood.connects, 1000u) << "the flood was too small to show anything";
  EXPECT_EQ(worker.Call(request::GetStats()).stats().disk_fault(), "");
}

TEST_F(TlsTest, APlaintextClientOnTheTlsPortIsToldSoInPlaintext) {
  auto plain = net::BlockingConnection::Connect(
      {.server = absl::StrCat("127.0.0.1:", lockd_->port())});
  EXPECT_THAT(plain.status().message(), HasSubstr("lockd serves TLS on this port"));
  auto client = Client::Create({.server = absl::StrCat("127.0.0.1:", lockd_->port())});
  EXPECT_THAT(client.status().message(), HasSubstr("lockd serves TLS on this port"));
  // The code is the one docs/contracts.md names (issue 33: it was UNSUPPORTED_VERSION).
  testing::RawConnection raw = testing::RawConnection::Tcp(lockd_->port());
  ASSERT_TRUE(raw.SendRequest(testing::request::Hello()));
  const std::optional<wire::Response> refused = raw.ReadResponse();
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->code(), wire::FAILED_PRECONDITION) << refused->ShortDebugString();
  EXPECT_EQ(refused->request_id(), 0u);
}

TEST_F(TlsTest, OneIdentityCannotDriveAnothersSessionEvenWithItsIdTokenAndSecret) {
  RawConnection owner = Connect("worker-1");
  owner.Hello();
  const wire::Response opened = owner.Call(request::OpenSession(absl::Seconds(60)));
  ASSERT_EQ(opened.code(), wire::OK);
  const uint64_t session = opened.open_session().session_id();
  const std::string secret = opened.open_session().secret();
  const wire::Response granted = owner.Call(request::Acquire(session, "payout/a"));
  ASSERT_TRUE(granted.acquire().granted());
  const uint64_t token = granted.acquire().token();

  // worker-2 may acquire payout/ too, but this session is worker-1's.
  RawConnection stranger = Connect("worker-2");
  stranger.Hello();
  for (const wire::Request& r :
       {request::KeepAlive(session, "payout/a", token), request::Release(session, "payout/a", token),
        request::Validate("payout/a", token, session), request::Close(session),
        request::Resume(session, secret), request::Acquire(session, "payout/b")}) {
    const wire::Response reply = stranger.Call(r);
    EXPECT_EQ(reply.code(), wire::PERMISSION_DENIED) << r.ShortDebugString();
  }
  EXPECT_EQ(Stats().permission_denied_total(), 6u);
  // The owner, on a new connection with its secret, still holds the lock with its token.
  RawConnection again = Connect("worker-1");
  again.Hello();
  ASSERT_EQ(again.Call(request::Resume(session, secret)).code(), wire::OK);
  EXPECT_EQ(again.Call(request::Validate("payout/a", token, session)).code(), wire::OK);
  EXPECT_EQ(again.Call(request::KeepAlive(session, "payout/a", token)).keep_alive().lock_codes(0),
            wire::OK);
}

TEST_F(TlsTest, ARefusalAtAdmissionIsSaidInsideTls) {
  LockdProcess limited({.extra_args = [&] {
    auto args = ServeArgs(Certs().a(), "lockd");
    args.push_back("--max-connections-per-peer=1");
    return args;
  }()});
  RawConnection first = RawConnection::Tls(limited.port(), ClientContext(Certs().Client("worker-1")));
  ASSERT_EQ(first.Hello().code(), wire::OK);
  auto second = net::BlockingConnection::Connect(
      {.server = absl::StrCat("127.0.0.1:", limited.port()),
       .tls = ClientContext(Certs().Client("worker-2"))});
  // LIMIT_EXCEEDED, read as the protocol's codes read it everywhere (protocol/session.h).
  EXPECT_TRUE(absl::IsResourceExhausted(second.status())) << second.status();
  EXPECT_THAT(std::string(second.status().message()),
              HasSubstr("lockd --max-connections-per-peer=1"));
}

TEST_F(TlsTest, WithTlsLockdMayListenBeyondLoopback) {
  testing::TempDir state;
  LockdProcess wide({.extra_args = [&] {
    auto args = ServeArgs(Certs().a(), "lockd");
    args.push_back("--listen=0.0.0.0");
    return args;
  }()});
  RawConnection conn = RawConnection::Tls(wide.port(), ClientContext(Certs().Client("worker-1")));
  EXPECT_EQ(conn.Hello().code(), wire::OK);
}

}  // namespace
}  // namespace fencelock
