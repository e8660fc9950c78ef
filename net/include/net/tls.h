// TLS for lockd's TCP connections: TLS 1.3 only, both ends authenticated with certificates
// from one configured CA (docs/security.md). Built on Debian's OpenSSL; this header names none
// of it, so that callers that only pass file names around stay light.
#ifndef FENCELOCK_NET_TLS_H_
#define FENCELOCK_NET_TLS_H_

#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

struct ssl_ctx_st;  // OpenSSL's SSL_CTX
struct ssl_st;      // OpenSSL's SSL

namespace fencelock::net {

// Where one end's certificates are: PEM files.
struct TlsFiles {
  // The CA that signs the peers' certificates; a peer whose certificate does not chain to it
  // is refused at the handshake.
  std::string ca_file;
  // This end's certificate (with any intermediates after it) and its private key.
  std::string cert_file;
  std::string key_file;
  // Optional: certificate revocation lists (PEM, one or more) issued by the CA. A peer whose
  // certificate one of them lists is refused at the handshake. Every CRL must be signed by the
  // CA and current (its next update not passed): an expired CRL would refuse every peer.
  std::string crl_file;

  // Whether any file is given (then the first three must be).
  bool enabled() const { return !ca_file.empty() || !cert_file.empty() || !key_file.empty(); }
};

enum class TlsRole { kServer, kClient };

// An OpenSSL context for one end, loaded and checked once; shared by its connections.
class TlsContext {
 public:
  // Loads `files` for `role`: TLS 1.3 only; the peer must present a certificate that chains to
  // files.ca_file (servers refuse a client without one). kInvalidArgument, naming the file and
  // OpenSSL's reason, when a file is missing or unreadable, does not parse, the key does not
  // belong to the certificate, or the certificate has expired or is not yet valid. `flag_prefix`
  // names the options in messages ("--tls-" gives "--tls-cert").
  static absl::StatusOr<std::shared_ptr<TlsContext>> Create(const TlsFiles& files, TlsRole role,
                                                            const std::string& flag_prefix);
  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;

  ssl_ctx_st* native() const { return ctx_; }
  TlsRole role() const { return role_; }
  // This end's own identity ("cn:lockd"), for logs.
  const std::string& identity() const { return identity_; }
  // What was loaded, for a log line: the identity, the certificate's expiry, the number of
  // certificates revoked by the CRLs and when their next update is due ("cn:lockd, valid until
  // Dec  6 10:00:00 2027 GMT, 2 revoked by the CRL, whose next update is due Dec  8 ...").
  const std::string& summary() const { return summary_; }
  // With CRLs: the earliest next update any of them names (a wall-clock time). Once it passes,
  // OpenSSL refuses every peer's certificate ("CRL has expired") until a new list is loaded.
  std::optional<absl::Time> crl_next_update() const { return crl_next_update_; }

 private:
  TlsContext(ssl_ctx_st* ctx, TlsRole role, std::string identity, std::string summary)
      : ctx_(ctx), role_(role), identity_(std::move(identity)), summary_(std::move(summary)) {}
  ssl_ctx_st* ctx_;
  TlsRole role_;
  std::string identity_;
  std::string summary_;
  std::optional<absl::Time> crl_next_update_;
};

// A TlsContext that follows its files (certificate rotation): Reload() loads them again, and
// Current() does when one of them changed since the last load (its size, modification time or
// inode). A new set that does not load (a missing or bad file, a key that does not match, an
// expired certificate or CRL) leaves the context in force as it was. Connections made before a
// reload keep the context they were made with. Thread-safe.
class ReloadingTlsContext {
 public:
  static absl::StatusOr<std::shared_ptr<ReloadingTlsContext>> Create(
      const TlsFiles& files, TlsRole role, const std::string& flag_prefix);

  // The context for a new connection. If the files changed since they were last loaded, loads
  // them first; when that fails, returns the context in force and sets `*refused` (if given)
  // to why, once per change of the files.
  std::shared_ptr<TlsContext> Current(std::string* refused = nullptr);
  // Loads the files now (lockd's SIGHUP): the new context's summary, or why the one in force
  // stays.
  absl::StatusOr<std::string> Reload();
  // The context in force, without looking at the files.
  std::shared_ptr<TlsContext> InForce() const;

 private:
  ReloadingTlsContext(TlsFiles files, TlsRole role, std::string flag_prefix)
      : files_(std::move(files)), role_(role), flag_prefix_(std::move(flag_prefix)) {}
  std::string Stamp() const;  // what Current() compares: the files' sizes, times and inodes

  const TlsFiles files_;
  const TlsRole role_;
  const std::string flag_prefix_;
  mutable absl::Mutex mu_;
  std::shared_ptr<TlsContext> current_ ABSL_GUARDED_BY(mu_);
  std::string stamp_ ABSL_GUARDED_BY(mu_);  // of the files last tried, loaded or not
};

// Sets up a client connection's `ssl` to check that the server's certificate names
// `server_name` (a DNS name or an IP address) and to send it as SNI.
absl::Status ExpectServerName(ssl_st* ssl, const std::string& server_name);

// The name a client expects on lockd's certificate when none is configured: the host of
// "host:port" ("[::1]:7420" gives "::1"); "" for a "unix:" address.
std::string ServerNameOf(const std::string& address);

// The identity a verified peer certificate gives: "cn:<common name>", or "dns:<first DNS
// name>" when the subject has no common name; "" without a certificate.
std::string PeerIdentity(ssl_st* ssl);

// OpenSSL's queued errors as one line (and the queue emptied); `fallback` when there are none.
std::string TakeTlsErrors(const std::string& fallback);

}  // namespace fencelock::net

#endif  // FENCELOCK_NET_TLS_H_
