// Issue 15: lockd on TCP with TLS 1.3 and client certificates, against a real lockd with
// certificates the test makes with scripts/make-certs.sh (openssl). A client is served only
// with a certificate from lockd's CA, that has not expired, and with its own key; it is known
// by its certificate's name, which the permissions file limits; and one identity cannot drive
// another's session even with its exact id, token and secret.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "clock/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "metrics/http_get.h"
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
using ::testing::Not;
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

// Issue 41: certificate rotation and revocation. Each test has its own copy of CA a (so that
// what it issues and revokes is its own) and serves lockd from files it can replace.
class TlsRotationTest : public ::testing::Test {
 protected:
  TlsRotationTest() {
    Shell(absl::StrCat("cp ", Certs().a(), "/ca.crt ", Certs().a(), "/ca.key ", ca_));
    Shell(absl::StrCat(MAKE_CERTS_SCRIPT, " ", ca_, " lockd client-a client-b > /dev/null"));
    Shell(absl::StrCat(REVOKE_CERT_SCRIPT, " ", ca_, " > /dev/null"));  // an empty list
    for (const char* file : {"ca.crt", "lockd.crt", "lockd.key"}) Install(ca_ + "/" + file, file);
  }
  // Issues a new certificate for `name` from the same CA, in a fresh directory, for a server
  // (lockd) or a client; returns the directory.
  enum class Role { kServer, kClient };
  std::string Issue(const std::string& name, Role role = Role::kServer) {
    const std::string dir = absl::StrCat(tmp_.path(), "/issued-", ++issued_);
    Shell(absl::StrCat("mkdir -p ", dir, " && cp ", ca_, "/ca.crt ", ca_, "/ca.key ", dir, " && ",
                       MAKE_CERTS_SCRIPT, " ", dir, " ",
                       role == Role::kServer ? name : "unused-server " + name, " > /dev/null"));
    return dir;
  }
  // Puts `from` in place as served/`name`, as an operator would: a copy renamed over the old.
  void Install(const std::string& from, const std::string& name) {
    Shell(absl::StrCat("cp ", from, " ", served_, "/", name, ".new && mv ", served_, "/", name,
                       ".new ", served_, "/", name));
  }
  void StartLockd() {
    lockd_ = std::make_unique<LockdProcess>(LockdProcess::Options{
        .extra_args = {"--tls-ca=" + served_ + "/ca.crt", "--tls-cert=" + served_ + "/lockd.crt",
                       "--tls-key=" + served_ + "/lockd.key", "--tls-crl=" + ca_ + "/crl.pem"},
        .stderr_file = err_,
        .stdout_file = out_});
  }
  // Sends SIGHUP and waits for lockd to say what it did with the TLS files (a new context on
  // standard output, a refusal on standard error); returns the line.
  std::string Hup() {
    const size_t said = Count(testing::ReadTextFile(out_));
    const size_t warned = Count(testing::ReadTextFile(err_));
    lockd_->child().Signal(SIGHUP);
    for (int i = 0; i < 200; ++i) {
      for (const auto& [file, before] : {std::pair{out_, said}, std::pair{err_, warned}}) {
        const std::string log = testing::ReadTextFile(file);
        if (Count(log) > before) {
          const size_t at = log.rfind("SIGHUP: TLS");
          return log.substr(at, log.find('\n', at) - at);
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ADD_FAILURE() << "lockd did not log its TLS reload";
    return "";
  }
  static size_t Count(const std::string& log) {
    size_t n = 0;
    for (size_t at = log.find("SIGHUP: TLS"); at != std::string::npos;
         at = log.find("SIGHUP: TLS", at + 1)) {
      ++n;
    }
    return n;
  }
  // The serial number of the certificate lockd presents to a new connection.
  std::string PresentedSerial() {
    return Serial(TryHandshakeCertificate(lockd_->port(), ca_ + "/ca.crt"));
  }
  static std::string FileSerial(const std::string& pem) {
    FILE* f = std::fopen(pem.c_str(), "r");
    if (f == nullptr) return "";
    X509* cert = PEM_read_X509(f, nullptr, nullptr, nullptr);
    std::fclose(f);
    return Serial(cert);
  }
  static std::string Serial(X509* cert) {
    if (cert == nullptr) return "";
    BIGNUM* n = ASN1_INTEGER_to_BN(X509_get0_serialNumber(cert), nullptr);
    char* hex = BN_bn2hex(n);
    std::string serial = hex;
    OPENSSL_free(hex);
    BN_free(n);
    X509_free(cert);
    return serial;
  }
  // The certificate the server at 127.0.0.1:`port` presents (nullptr if none): a handshake as
  // client-a, whose outcome does not matter.
  X509* TryHandshakeCertificate(int port, const std::string& ca) {
    SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
    SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
    SSL_CTX_load_verify_file(ctx, ca.c_str());
    SSL_CTX_use_certificate_file(ctx, (ca_ + "/client-a.crt").c_str(), SSL_FILETYPE_PEM);
    SSL_CTX_use_PrivateKey_file(ctx, (ca_ + "/client-a.key").c_str(), SSL_FILETYPE_PEM);
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
    X509* cert = nullptr;
    SSL* ssl = SSL_new(ctx);
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
      SSL_set_fd(ssl, fd);
      if (SSL_connect(ssl) == 1) cert = SSL_get1_peer_certificate(ssl);
    }
    ERR_clear_error();
    SSL_free(ssl);
    SSL_CTX_free(ctx);
    close(fd);
    return cert;
  }
  ClientOptions ClientAs(const std::string& dir, const std::string& name) {
    return {.server = absl::StrCat("127.0.0.1:", lockd_->port()),
            .tls_ca_file = dir + "/ca.crt",
            .tls_cert_file = dir + "/" + name + ".crt",
            .tls_key_file = dir + "/" + name + ".key",
            .tls_server_name = "lockd",
            .client_name = name};
  }

  testing::TempDir tmp_;
  const std::string ca_ = [this] {
    Shell(absl::StrCat("mkdir -p ", tmp_.path(), "/ca ", tmp_.path(), "/served"));
    return tmp_.path() + "/ca";
  }();
  const std::string served_ = tmp_.path() + "/served";
  const std::string out_ = tmp_.path() + "/lockd.stdout";
  const std::string err_ = tmp_.path() + "/lockd.stderr";
  int issued_ = 0;
  std::unique_ptr<LockdProcess> lockd_;
};

TEST_F(TlsRotationTest, ACertificateRotatedUnderLoadDropsNoSession) {
  StartLockd();
  const std::string first = PresentedSerial();
  ASSERT_EQ(first, FileSerial(ca_ + "/lockd.crt"));
  // Four clients acquire and release their own lock in a loop while lockd's certificate is
  // replaced under them.
  constexpr int kClients = 4;
  std::vector<std::unique_ptr<Client>> clients;
  std::vector<uint64_t> sessions;
  // Every client's log: a connection lockd closed would show as a session resumed on a new
  // one (the client resumes transparently, so unchanged session ids alone cannot tell).
  absl::Mutex log_mu;
  std::string said;
  for (int i = 0; i < kClients; ++i) {
    ClientOptions options = ClientAs(ca_, i % 2 == 0 ? "client-a" : "client-b");
    options.log = [&log_mu, &said, i](fencelock::LogLevel, const std::string& line) {
      absl::MutexLock lock(&log_mu);
      absl::StrAppend(&said, "client ", i, ": ", line, "\n");
    };
    auto client = Client::Create(std::move(options));
    ASSERT_TRUE(client.ok()) << client.status();
    sessions.push_back((*client)->sessionId());
    clients.push_back(std::move(*client));
  }
  std::atomic<bool> stop{false};
  std::vector<int> cycles(kClients, 0);
  std::vector<std::string> errors(kClients);
  std::vector<std::thread> load;
  for (int i = 0; i < kClients; ++i) {
    load.emplace_back([&, i] {
      while (!stop && errors[i].empty()) {
        auto held = clients[i]->acquire(absl::StrCat("rotation/", i), absl::Seconds(5));
        if (!held.ok()) {
          errors[i] = held.status().ToString();
        } else if (absl::Status s = clients[i]->release(*held); !s.ok()) {
          errors[i] = s.ToString();
        } else {
          ++cycles[i];
        }
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const std::string second_dir = Issue("lockd");
  Install(second_dir + "/lockd.key", "lockd.key");
  Install(second_dir + "/lockd.crt", "lockd.crt");
  EXPECT_THAT(Hup(), HasSubstr("SIGHUP: TLS: now cn:lockd, valid until "));
  const std::string second = PresentedSerial();
  EXPECT_EQ(second, FileSerial(second_dir + "/lockd.crt"));
  EXPECT_NE(second, first);
  // New clients are served under the new certificate, and the load goes on.
  auto late = Client::Create(ClientAs(ca_, "client-a"));
  ASSERT_TRUE(late.ok()) << late.status();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  stop = true;
  for (auto& t : load) t.join();
  for (int i = 0; i < kClients; ++i) {
    EXPECT_EQ(errors[i], "") << "client " << i;
    EXPECT_GT(cycles[i], 0) << "client " << i;
    EXPECT_EQ(clients[i]->sessionId(), sessions[i]) << "client " << i << " lost its session";
  }
  clients.clear();
  absl::MutexLock lock(&log_mu);
  for (int i = 0; i < kClients; ++i) {
    EXPECT_THAT(said, HasSubstr(absl::StrCat("client ", i, ": session ", sessions[i], " opened")));
  }
  EXPECT_THAT(said, Not(HasSubstr("resumed on a new connection"))) << said;
}

TEST_F(TlsRotationTest, FilesThatDoNotLoadLeaveTheCertificatesInForce) {
  StartLockd();
  const std::string first = PresentedSerial();
  // A new certificate whose key has not been put in place yet: they do not match.
  const std::string second_dir = Issue("lockd");
  Install(second_dir + "/lockd.crt", "lockd.crt");
  EXPECT_THAT(Hup(), HasSubstr("key values mismatch"));
  EXPECT_EQ(PresentedSerial(), first);
  // A truncated certificate.
  Shell(absl::StrCat("head -c 100 ", second_dir, "/lockd.crt > ", served_, "/lockd.crt"));
  const std::string refused = Hup();
  EXPECT_THAT(refused, HasSubstr("cannot load the certificate"));
  EXPECT_THAT(refused, HasSubstr("the certificates in force are unchanged"));
  EXPECT_EQ(PresentedSerial(), first);
  auto client = Client::Create(ClientAs(ca_, "client-a"));
  EXPECT_TRUE(client.ok()) << client.status();
  // Both in place: the next SIGHUP takes them.
  Install(second_dir + "/lockd.crt", "lockd.crt");
  Install(second_dir + "/lockd.key", "lockd.key");
  EXPECT_THAT(Hup(), HasSubstr("SIGHUP: TLS: now cn:lockd"));
  EXPECT_EQ(PresentedSerial(), FileSerial(second_dir + "/lockd.crt"));
}

TEST_F(TlsRotationTest, ARevokedClientCertificateIsRefused) {
  StartLockd();
  const std::string ca = ca_ + "/ca.crt";
  const auto handshake = [&](const std::string& name) {
    return TryHandshake(lockd_->port(), ca, ca_ + "/" + name + ".crt", ca_ + "/" + name + ".key");
  };
  EXPECT_EQ(handshake("client-b"), "");
  Shell(absl::StrCat(REVOKE_CERT_SCRIPT, " ", ca_, " client-b > /dev/null"));
  EXPECT_THAT(Hup(), HasSubstr("1 revoked by the CRL"));
  EXPECT_THAT(handshake("client-b"), HasSubstr("certificate revoked"));
  EXPECT_EQ(handshake("client-a"), "");
  EXPECT_THAT(testing::ReadTextFile(err_), HasSubstr("certificate revoked"));
  // So does a lockd that starts with the list.
  lockd_->Restart();
  EXPECT_THAT(handshake("client-b"), HasSubstr("certificate revoked"));
  EXPECT_EQ(handshake("client-a"), "");
}

// Issue 59: a CRL that expires refuses every new TLS client at that moment. lockd logs its next
// update at every load, exports the time left, and warns from a day before it.
TEST_F(TlsRotationTest, ACrlDueWithinADayIsWarnedOfAndItsNextUpdateExported) {
  StartLockd();  // the fixture's list is valid for weeks
  EXPECT_THAT(testing::ReadTextFile(out_), HasSubstr("revoked by the CRL, whose next update is due"));
  auto left = metrics::ScrapeSample("127.0.0.1", lockd_->metrics_port(),
                                    "lockd_tls_crl_next_update_seconds");
  ASSERT_TRUE(left.ok()) << left.status();
  EXPECT_GT(*left, 86400);
  EXPECT_THAT(testing::ReadTextFile(err_), Not(HasSubstr("is due for its next update")));
  // A list of a day, made twelve hours ago: due in about twelve hours.
  Shell(absl::StrCat("CRL_DAYS=1 ", FAKETIME_BINARY, " -f -12h ", REVOKE_CERT_SCRIPT, " ", ca_,
                     " > /dev/null"));
  EXPECT_THAT(Hup(), HasSubstr("whose next update is due"));
  std::string warned;
  for (int i = 0; i < 100 && !absl::StrContains(warned, "is due for its next update in"); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    warned = testing::ReadTextFile(err_);
  }
  EXPECT_THAT(warned, HasSubstr("the CRL (--tls-crl) is due for its next update in"));
  EXPECT_THAT(warned, HasSubstr("once it passes, lockd refuses every new TLS client"));
  left = metrics::ScrapeSample("127.0.0.1", lockd_->metrics_port(),
                               "lockd_tls_crl_next_update_seconds");
  ASSERT_TRUE(left.ok()) << left.status();
  EXPECT_GT(*left, 0);
  EXPECT_LT(*left, 86400);
}

TEST_F(TlsRotationTest, ACrlThatIsNotCurrentOrNotTheCasKeepsLockdFromStarting) {
  testing::TempDir state;
  Shell(absl::StrCat(LOCKD_BINARY, " init --data-dir=", state.path(), "/s > /dev/null"));
  const auto serve = [&](const std::string& crl) {
    auto lockd = process::Child::Spawn(
        LOCKD_BINARY,
        {"serve", "--data-dir=" + state.path() + "/s", "--port=0", "--metrics-port=-1",
         "--admission-lock=" + state.path() + "/admission.lock", "--tls-ca=" + ca_ + "/ca.crt",
         "--tls-cert=" + ca_ + "/lockd.crt", "--tls-key=" + ca_ + "/lockd.key",
         "--tls-crl=" + crl},
        {.stderr_file = state.path() + "/err"});
    EXPECT_TRUE(lockd.ok());
    const std::optional<int> status = lockd->Wait(absl::Seconds(20));
    EXPECT_TRUE(status.has_value() && *status != 0) << "lockd served with " << crl;
    return testing::ReadTextFile(state.path() + "/err");
  };
  // A list of a day, made sixty days ago.
  const std::string old_dir = Issue("old");
  Shell(absl::StrCat("CRL_DAYS=1 ", FAKETIME_BINARY, " -f -60d ", REVOKE_CERT_SCRIPT, " ",
                     old_dir, " > /dev/null"));
  EXPECT_THAT(serve(old_dir + "/crl.pem"), HasSubstr("has expired"));
  // Another CA's list.
  const std::string other = tmp_.path() + "/other";
  Shell(absl::StrCat("mkdir -p ", other, " && cp ", Certs().b(), "/ca.crt ", Certs().b(),
                     "/ca.key ", other, " && ", REVOKE_CERT_SCRIPT, " ", other, " > /dev/null"));
  // (make-certs.sh names every CA alike: its name matches, its signature does not.)
  EXPECT_THAT(serve(other + "/crl.pem"), HasSubstr("does not carry a valid signature"));
  // Not a list at all.
  EXPECT_THAT(serve(ca_ + "/ca.crt"), HasSubstr("no CRL in"));
  EXPECT_THAT(serve(tmp_.path() + "/missing.pem"), HasSubstr("cannot read the CRL"));
}

TEST_F(TlsRotationTest, AClientPicksUpRotatedFilesWhenItReconnects) {
  StartLockd();
  // The client's own copies of its files, which its operator rotates.
  const std::string mine = tmp_.path() + "/mine";
  Shell(absl::StrCat("mkdir -p ", mine, " && cp ", ca_, "/ca.crt ", ca_, "/client-a.crt ", ca_,
                     "/client-a.key ", mine));
  auto client = Client::Create(ClientAs(mine, "client-a"));
  ASSERT_TRUE(client.ok()) << client.status();
  const uint64_t session = (*client)->sessionId();
  auto held = (*client)->acquire("rotated", absl::Seconds(5));
  ASSERT_TRUE(held.ok()) << held.status();
  ASSERT_TRUE((*client)->release(*held).ok());
  // A new certificate for the client, and the old one revoked: from now on only the new one
  // is served.
  const std::string renewed = Issue("client-a", Role::kClient);
  Shell(absl::StrCat("cp ", renewed, "/client-a.key ", mine, "/client-a.key.new && mv ", mine,
                     "/client-a.key.new ", mine, "/client-a.key && cp ", renewed,
                     "/client-a.crt ", mine, "/client-a.crt.new && mv ", mine,
                     "/client-a.crt.new ", mine, "/client-a.crt"));
  Shell(absl::StrCat(REVOKE_CERT_SCRIPT, " ", ca_, " client-a > /dev/null"));
  // lockd restarts with the list (its connections go with it); the client reconnects with its
  // new files and resumes its session.
  lockd_->Restart();
  auto again = (*client)->acquire("rotated", absl::Seconds(20));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_GT(again->token(), held->token());
  EXPECT_EQ((*client)->sessionId(), session);
  EXPECT_TRUE((*client)->release(*again).ok());
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
