// TLS for lockd's TCP connections: TLS 1.3 only, both ends authenticated with certificates
// from one configured CA (docs/security.md). Built on Debian's OpenSSL; this header names none
// of it, so that callers that only pass file names around stay light.
#ifndef FENCELOCK_NET_TLS_H_
#define FENCELOCK_NET_TLS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"

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

  // Whether any file is given (then all three must be).
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

 private:
  TlsContext(ssl_ctx_st* ctx, TlsRole role, std::string identity)
      : ctx_(ctx), role_(role), identity_(std::move(identity)) {}
  ssl_ctx_st* ctx_;
  TlsRole role_;
  std::string identity_;
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
