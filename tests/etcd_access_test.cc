// Issue 37: lockd on a production-shaped etcd. A real etcd that speaks TLS and requires client
// certificates (made by scripts/make-certs.sh), then the same with etcd's own auth enabled:
// lockd serves from it, survives a restart of itself on it, takes snapshots (which compact
// etcd's history) through it; a wrong certificate, a wrong password or a user without rights
// on the prefix is a startup error that names what to fix.
#include <sys/stat.h>
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "etcd_process.h"
#include "lockd_process.h"
#include "raw_connection.h"

namespace fencelock {
namespace {

using ::testing::HasSubstr;
using testing::EtcdProcess;
using testing::LockdProcess;
using testing::RawConnection;
namespace request = testing::request;

// scripts/make-certs.sh DIR etcd lockd root ...; aborts if it fails.
std::string MakeCerts(const std::string& dir, const std::string& names) {
  const std::string command =
      absl::StrCat(MAKE_CERTS, " ", dir, " etcd ", names, " > ", dir, ".log 2>&1");
  if (std::system(command.c_str()) != 0) {
    std::fprintf(stderr, "%s failed:\n%s\n", command.c_str(),
                 testing::ReadTextFile(dir + ".log").c_str());
    std::abort();
  }
  return dir;
}

class EtcdAccessTest : public ::testing::Test {
 protected:
  EtcdAccessTest()
      : certs_(MakeCerts(tmp_.path() + "/certs", "lockd root")),
        other_(MakeCerts(tmp_.path() + "/other", "lockd")),
        etcd_(EtcdProcess::Options{.certs = certs_}) {}

  std::vector<std::string> Tls(const std::string& dir) const {
    return {"--etcd-tls-ca=" + certs_ + "/ca.crt", "--etcd-tls-cert=" + dir + "/lockd.crt",
            "--etcd-tls-key=" + dir + "/lockd.key"};
  }
  std::string PasswordFile(const std::string& name, const std::string& password) const {
    const std::string path = tmp_.path() + "/" + name;
    std::ofstream(path) << password << "\n";
    ::chmod(path.c_str(), 0600);
    return path;
  }
  // `lockd init` on `prefix` with `args`: its exit status and standard error.
  std::pair<int, std::string> Init(const std::string& prefix, std::vector<std::string> args) {
    args.insert(args.begin(), {"init", "--etcd=" + etcd_.endpoint(), "--etcd-prefix=" + prefix});
    return testing::RunLockdToExit(args);
  }
  // A lockd serving `prefix` (already initialized) with `args`; a lock taken and confirmed
  // through it, a snapshot every 4 KiB of log.
  void ServeAndLock(const std::string& prefix, const std::vector<std::string>& args) {
    LockdProcess::Options options{
        .extra_args = {testing::OwnerTtlFlag(), "--etcd-snapshot-bytes=4096"},
        .stderr_file = tmp_.path() + "/lockd.err",
        .etcd = etcd_.endpoint(),
        .etcd_prefix = prefix,
        .etcd_init = false,
        .etcd_args = args};
    uint64_t token = 0;
    {
      LockdProcess lockd(options);
      RawConnection c = RawConnection::Tcp(lockd.port());
      const uint64_t session = c.HelloAndOpenSession(absl::Minutes(5));
      // Enough records for snapshots, each followed by a compaction of etcd's history.
      for (int i = 0; i < 200; ++i) {
        const wire::Response r = c.Call(request::Acquire(session, absl::StrCat("payout/", i)));
        ASSERT_TRUE(r.acquire().granted()) << r.ShortDebugString();
        token = r.acquire().token();
      }
      wire::Response stats = c.Call(request::GetStats());
      for (int i = 0; i < 100 && stats.stats().snapshots_total() == 0; ++i) {
        absl::SleepFor(absl::Milliseconds(20));
        stats = c.Call(request::GetStats());
      }
      EXPECT_GT(stats.stats().snapshots_total(), 0u) << stats.ShortDebugString();
      absl::SleepFor(absl::Milliseconds(200));  // the compaction after the snapshot
    }
    // etcd let lockd compact its history too (with auth on, etcd checks that as well).
    const std::string said = testing::ReadTextFile(options.stderr_file);
    EXPECT_THAT(said, ::testing::Not(HasSubstr("could not compact"))) << said;
    options.stderr_file = tmp_.path() + "/lockd-again.err";
    // A second lockd restores it from the snapshot and the log over the same access.
    LockdProcess again(options);
    RawConnection c = RawConnection::Tcp(again.port());
    c.Hello();
    EXPECT_EQ(c.Call(request::Validate("payout/199", token)).code(), wire::OK);
  }

  testing::TempDir tmp_;
  const std::string certs_;
  const std::string other_;  // a second CA and its certificates, which etcd does not trust
  EtcdProcess etcd_;
};

TEST_F(EtcdAccessTest, LockdServesFromAnEtcdThatRequiresClientCertificates) {
  ASSERT_EQ(Init("/fencelock/tls", Tls(certs_)).first, 0);
  ServeAndLock("/fencelock/tls", Tls(certs_));

  // Plaintext to etcd's TLS port, no client certificate, one from a CA etcd does not trust,
  // and a key that is not the certificate's: each an error naming the flag to look at.
  auto [plain, plain_err] = Init("/fencelock/x", {});
  EXPECT_NE(plain, 0);
  EXPECT_THAT(plain_err, HasSubstr("an etcd that speaks TLS needs --etcd-tls-ca"));
  auto [no_cert, no_cert_err] = Init("/fencelock/x", {"--etcd-tls-ca=" + certs_ + "/ca.crt"});
  EXPECT_NE(no_cert, 0);
  EXPECT_THAT(no_cert_err, HasSubstr("needs --etcd-tls-cert and --etcd-tls-key"));
  auto [stranger, stranger_err] = Init("/fencelock/x", Tls(other_));
  EXPECT_NE(stranger, 0);
  EXPECT_THAT(stranger_err, HasSubstr("--etcd-tls-cert=" + other_ + "/lockd.crt must chain to a "
                                      "CA etcd trusts"));
  std::vector<std::string> mismatched = Tls(certs_);
  mismatched[2] = "--etcd-tls-key=" + certs_ + "/root.key";
  auto [pair, pair_err] = Init("/fencelock/x", mismatched);
  EXPECT_NE(pair, 0);
  EXPECT_THAT(pair_err, HasSubstr("--etcd-tls-key=" + certs_ + "/root.key is not the key of "
                                  "--etcd-tls-cert=" + certs_ + "/lockd.crt"));
  auto [missing, missing_err] =
      Init("/fencelock/x", {"--etcd-tls-ca=" + tmp_.path() + "/no-such.crt"});
  EXPECT_NE(missing, 0);
  EXPECT_THAT(missing_err, HasSubstr("--etcd-tls-ca=" + tmp_.path() + "/no-such.crt: cannot be read"));
  // Nothing was written under the prefixes that were refused.
  EXPECT_TRUE(etcd_.Keys("/fencelock/x").empty());
}

TEST_F(EtcdAccessTest, LockdServesFromAnEtcdWithAuthAndAWrongPasswordIsNamed) {
  // As an operator would: a root user (etcdctl authenticates as root by its certificate's
  // common name), a role with readwrite on /fencelock/auth/, a user with that role, and one
  // without.
  for (const char* step :
       {"user add root --new-user-password=root-secret", "user add fence --new-user-password=s3cret",
        "user add nobody --new-user-password=other", "role add fencelock",
        "role grant-permission fencelock readwrite /fencelock/auth/ --prefix=true",
        "user grant-role fence fencelock", "auth enable"}) {
    auto [ok, out] = etcd_.Etcdctl(step);
    ASSERT_TRUE(ok) << "etcdctl " << step << ": " << out;
  }
  std::vector<std::string> as_fence = Tls(certs_);
  as_fence.insert(as_fence.end(),
                  {"--etcd-user=fence", "--etcd-password-file=" + PasswordFile("pw", "s3cret")});
  ASSERT_EQ(Init("/fencelock/auth", as_fence).first, 0);
  ServeAndLock("/fencelock/auth", as_fence);

  std::vector<std::string> wrong = Tls(certs_);
  wrong.insert(wrong.end(),
               {"--etcd-user=fence", "--etcd-password-file=" + PasswordFile("bad", "guess")});
  auto [refused, refused_err] = Init("/fencelock/auth-2", wrong);
  EXPECT_NE(refused, 0);
  EXPECT_THAT(refused_err, HasSubstr("etcd refused user \"fence\" (--etcd-user, "
                                     "--etcd-password-file)"));
  EXPECT_THAT(refused_err, HasSubstr("invalid user ID or password"));
  // lockd serve refuses at start, as init does.
  auto [serve, serve_err] = testing::RunLockdToExit(
      {"serve", "--etcd=" + etcd_.endpoint(), "--etcd-prefix=/fencelock/auth", "--port=0",
       "--metrics-port=-1", wrong[0], wrong[1], wrong[2], wrong[3], wrong[4]});
  EXPECT_TRUE(WIFEXITED(serve) && WEXITSTATUS(serve) == 1) << serve;
  EXPECT_THAT(serve_err, HasSubstr("etcd refused user \"fence\""));

  // A user without rights on the prefix, and the certificate alone (its common name, lockd,
  // is no etcd user): permission denied, naming what it needs.
  std::vector<std::string> nobody = Tls(certs_);
  nobody.insert(nobody.end(),
                {"--etcd-user=nobody", "--etcd-password-file=" + PasswordFile("nobody", "other")});
  auto [denied, denied_err] = Init("/fencelock/auth-3", nobody);
  EXPECT_NE(denied, 0);
  EXPECT_THAT(denied_err, HasSubstr("user \"nobody\" needs a role with readwrite on the prefix"));
  auto [cn, cn_err] = Init("/fencelock/auth-3", Tls(certs_));
  EXPECT_NE(cn, 0);
  EXPECT_THAT(cn_err, HasSubstr("lockd's client certificate's common name needs a role"));
  // A user without its password file, and an empty one.
  auto [half, half_err] = Init("/fencelock/auth-3", {"--etcd-user=fence"});
  EXPECT_NE(half, 0);
  EXPECT_THAT(half_err, HasSubstr("--etcd-user and --etcd-password-file go together"));
  const std::string empty = tmp_.path() + "/empty";
  std::ofstream(empty).flush();
  auto [blank, blank_err] =
      Init("/fencelock/auth-3", {"--etcd-user=fence", "--etcd-password-file=" + empty});
  EXPECT_NE(blank, 0);
  EXPECT_THAT(blank_err, HasSubstr("--etcd-password-file=" + empty + " is empty"));
}

}  // namespace
}  // namespace fencelock
