#include "net/tls.h"

#include <arpa/inet.h>
#include <sys/stat.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <cstdio>
#include <ctime>

#include "absl/strings/str_cat.h"

namespace fencelock::net {
namespace {

// Certificates, chains and keys are a few kilobytes.
constexpr off_t kMaxPemBytes = off_t{1} << 20;

// Bytes a permissions file could not spell (spaces, controls, non-ASCII) as %XX, and '%'
// itself, so that an identity is always one printable word.
std::string Printable(const unsigned char* data, int length) {
  std::string out;
  for (int i = 0; i < length; ++i) {
    const unsigned char c = data[i];
    if (c > ' ' && c < 0x7f && c != '%') {
      out.push_back(static_cast<char>(c));
    } else {
      char hex[4];
      std::snprintf(hex, sizeof(hex), "%%%02X", c);
      out += hex;
    }
  }
  return out;
}

std::string CertificateIdentity(X509* cert) {
  if (cert == nullptr) return "";
  X509_NAME* subject = X509_get_subject_name(cert);
  const int index = X509_NAME_get_index_by_NID(subject, NID_commonName, -1);
  if (index >= 0) {
    unsigned char* utf8 = nullptr;
    const int n =
        ASN1_STRING_to_UTF8(&utf8, X509_NAME_ENTRY_get_data(X509_NAME_get_entry(subject, index)));
    if (n > 0) {
      std::string identity = absl::StrCat("cn:", Printable(utf8, n));
      OPENSSL_free(utf8);
      return identity;
    }
    OPENSSL_free(utf8);
  }
  std::string identity;
  auto* names = static_cast<GENERAL_NAMES*>(
      X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr));
  for (int i = 0; names != nullptr && i < sk_GENERAL_NAME_num(names); ++i) {
    const GENERAL_NAME* name = sk_GENERAL_NAME_value(names, i);
    if (name->type == GEN_DNS) {
      identity = absl::StrCat("dns:", Printable(ASN1_STRING_get0_data(name->d.dNSName),
                                                ASN1_STRING_length(name->d.dNSName)));
      break;
    }
  }
  GENERAL_NAMES_free(names);
  return identity;
}

// An ASN.1 time as OpenSSL prints it ("Dec  6 10:00:00 2027 GMT").
std::string TimeText(const ASN1_TIME* time) {
  BIO* bio = BIO_new(BIO_s_mem());
  if (bio == nullptr) return "?";
  std::string text = "?";
  if (ASN1_TIME_print(bio, time) == 1) {
    char* data = nullptr;
    const long n = BIO_get_mem_data(bio, &data);
    text.assign(data, n);
  }
  BIO_free(bio);
  return text;
}

// An ASN.1 time as an absl::Time; nullopt if OpenSSL cannot read it.
std::optional<absl::Time> ToTime(const ASN1_TIME* time) {
  struct tm tm {};
  if (time == nullptr || ASN1_TIME_to_tm(time, &tm) != 1) return std::nullopt;
  return absl::FromTimeT(timegm(&tm));
}

struct LoadedCrls {
  int revoked = 0;                        // certificates the CRLs revoke
  std::optional<absl::Time> next_update;  // the earliest next update of any of them
  std::string next_update_text;
};

// Loads every CRL in `path` into `ctx`'s store and turns revocation checks on for the peer's
// certificate. Each CRL must be issued and signed by a certificate of the CA file already in
// the store, and current.
absl::StatusOr<LoadedCrls> LoadCrls(SSL_CTX* ctx, const TlsFiles& files,
                                    const std::string& flag_prefix) {
  const std::string& path = files.crl_file;
  const std::string flag = absl::StrCat(" (", flag_prefix, "crl)");
  BIO* bio = BIO_new_file(path.c_str(), "r");
  if (bio == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read the CRL ", path, flag, ": ", TakeTlsErrors("?")));
  }
  X509_STORE* store = SSL_CTX_get_cert_store(ctx);
  STACK_OF(X509_OBJECT)* trusted = X509_STORE_get0_objects(store);
  absl::Status refused;
  int crls = 0;
  LoadedCrls loaded;
  while (X509_CRL* crl = PEM_read_bio_X509_CRL(bio, nullptr, nullptr, nullptr)) {
    ++crls;
    X509* issuer = nullptr;
    for (int i = 0; i < sk_X509_OBJECT_num(trusted) && issuer == nullptr; ++i) {
      X509* cert = X509_OBJECT_get0_X509(sk_X509_OBJECT_value(trusted, i));
      if (cert != nullptr &&
          X509_NAME_cmp(X509_get_subject_name(cert), X509_CRL_get_issuer(crl)) == 0) {
        issuer = cert;
      }
    }
    const ASN1_TIME* next = X509_CRL_get0_nextUpdate(crl);
    if (issuer == nullptr) {
      refused = absl::InvalidArgumentError(absl::StrCat(
          "the CRL ", path, flag, " is not issued by the CA in ", files.ca_file));
    } else if (X509_CRL_verify(crl, X509_get0_pubkey(issuer)) != 1) {
      refused = absl::InvalidArgumentError(absl::StrCat(
          "the CRL ", path, flag, " does not carry a valid signature of the CA in ",
          files.ca_file));
    } else if (X509_cmp_current_time(X509_CRL_get0_lastUpdate(crl)) > 0) {
      refused = absl::InvalidArgumentError(absl::StrCat("the CRL ", path, flag, " is not valid yet"));
    } else if (next != nullptr && X509_cmp_current_time(next) < 0) {
      refused = absl::InvalidArgumentError(absl::StrCat(
          "the CRL ", path, flag, " has expired (its next update was due ", TimeText(next),
          "): it would refuse every peer"));
    } else if (X509_STORE_add_crl(store, crl) != 1) {
      refused = absl::InvalidArgumentError(
          absl::StrCat("cannot use the CRL ", path, flag, ": ", TakeTlsErrors("?")));
    } else {
      if (STACK_OF(X509_REVOKED)* list = X509_CRL_get_REVOKED(crl)) {
        loaded.revoked += sk_X509_REVOKED_num(list);
      }
      const std::optional<absl::Time> due = ToTime(next);
      if (due.has_value() && (!loaded.next_update.has_value() || *due < *loaded.next_update)) {
        loaded.next_update = due;
        loaded.next_update_text = TimeText(next);
      }
    }
    X509_CRL_free(crl);
    if (!refused.ok()) break;
  }
  BIO_free(bio);
  ERR_clear_error();  // the read that found no more CRLs queued "no start line"
  if (!refused.ok()) return refused;
  if (crls == 0) {
    return absl::InvalidArgumentError(absl::StrCat("no CRL in ", path, flag));
  }
  X509_STORE_set_flags(store, X509_V_FLAG_CRL_CHECK);
  return loaded;
}

}  // namespace

std::string TakeTlsErrors(const std::string& fallback) {
  std::string text;
  while (const unsigned long e = ERR_get_error()) {
    char buffer[256];
    ERR_error_string_n(e, buffer, sizeof(buffer));
    // "error:0A000086:SSL routines::certificate verify failed": keep what a reader needs.
    const char* reason = ERR_reason_error_string(e);
    if (!text.empty()) text += "; ";
    text += reason != nullptr ? reason : buffer;
  }
  return text.empty() ? fallback : text;
}

absl::StatusOr<std::shared_ptr<TlsContext>> TlsContext::Create(const TlsFiles& files,
                                                               TlsRole role,
                                                               const std::string& flag_prefix) {
  for (auto [flag, file] : {std::pair{"ca", &files.ca_file}, std::pair{"cert", &files.cert_file},
                            std::pair{"key", &files.key_file}}) {
    if (file->empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "TLS needs all of ", flag_prefix, "ca, ", flag_prefix, "cert and ", flag_prefix,
          "key; ", flag_prefix, flag, " is missing"));
    }
  }
  for (auto [flag, file] : {std::pair{"ca", &files.ca_file}, std::pair{"cert", &files.cert_file},
                            std::pair{"key", &files.key_file}, std::pair{"crl", &files.crl_file}}) {
    // A FIFO would block the start until someone writes to it; a huge file is a mistake.
    struct stat st;
    if (::stat(file->c_str(), &st) == 0 &&
        (!S_ISREG(st.st_mode) || st.st_size > kMaxPemBytes)) {
      return absl::InvalidArgumentError(absl::StrCat(
          *file, " (", flag_prefix, flag, ") is not a regular PEM file of at most ",
          kMaxPemBytes, " bytes"));
    }
  }
  ERR_clear_error();
  SSL_CTX* ctx = SSL_CTX_new(TLS_method());
  if (ctx == nullptr) {
    return absl::InternalError(absl::StrCat("cannot make a TLS context: ", TakeTlsErrors("?")));
  }
  auto fail = [&](const std::string& what) {
    SSL_CTX_free(ctx);
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", TakeTlsErrors("unknown error")));
  };
  // TLS 1.3 only: no downgrade to older versions and their weaker suites.
  if (SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION) != 1) {
    return fail("cannot require TLS 1.3");
  }
  if (SSL_CTX_load_verify_file(ctx, files.ca_file.c_str()) != 1) {
    return fail(absl::StrCat("cannot load the CA certificate ", files.ca_file, " (", flag_prefix,
                             "ca)"));
  }
  if (SSL_CTX_use_certificate_chain_file(ctx, files.cert_file.c_str()) != 1) {
    return fail(absl::StrCat("cannot load the certificate ", files.cert_file, " (", flag_prefix,
                             "cert)"));
  }
  if (SSL_CTX_use_PrivateKey_file(ctx, files.key_file.c_str(), SSL_FILETYPE_PEM) != 1) {
    return fail(absl::StrCat("cannot load the private key ", files.key_file, " (", flag_prefix,
                             "key) for the certificate ", files.cert_file));
  }
  if (SSL_CTX_check_private_key(ctx) != 1) {
    return fail(absl::StrCat("the private key ", files.key_file, " does not belong to the "
                             "certificate ", files.cert_file));
  }
  X509* own = SSL_CTX_get0_certificate(ctx);
  // Peers would refuse it anyway; say so at startup, with the dates, rather than at every
  // handshake.
  if (X509_cmp_current_time(X509_get0_notAfter(own)) < 0) {
    return fail(absl::StrCat("the certificate ", files.cert_file, " has expired"));
  }
  if (X509_cmp_current_time(X509_get0_notBefore(own)) > 0) {
    return fail(absl::StrCat("the certificate ", files.cert_file, " is not valid yet"));
  }
  std::string summary = absl::StrCat(CertificateIdentity(own), ", valid until ",
                                     TimeText(X509_get0_notAfter(own)));
  std::optional<absl::Time> crl_next_update;
  if (!files.crl_file.empty()) {
    absl::StatusOr<LoadedCrls> crls = LoadCrls(ctx, files, flag_prefix);
    if (!crls.ok()) {
      SSL_CTX_free(ctx);
      return crls.status();
    }
    absl::StrAppend(&summary, ", ", crls->revoked, " revoked by the CRL");
    if (crls->next_update.has_value()) {
      absl::StrAppend(&summary, ", whose next update is due ", crls->next_update_text);
      crl_next_update = crls->next_update;
    }
  }
  if (role == TlsRole::kServer) {
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
    // Tells clients which CA to pick a certificate for.
    if (STACK_OF(X509_NAME)* names = SSL_load_client_CA_file(files.ca_file.c_str())) {
      SSL_CTX_set_client_CA_list(ctx, names);
    }
    // Connections are long-lived and never resumed: no session tickets to send.
    SSL_CTX_set_num_tickets(ctx, 0);
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
  } else {
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
  }
  ERR_clear_error();
  auto context = std::shared_ptr<TlsContext>(
      new TlsContext(ctx, role, CertificateIdentity(own), std::move(summary)));
  context->crl_next_update_ = crl_next_update;
  return context;
}

absl::StatusOr<std::shared_ptr<ReloadingTlsContext>> ReloadingTlsContext::Create(
    const TlsFiles& files, TlsRole role, const std::string& flag_prefix) {
  std::shared_ptr<ReloadingTlsContext> reloading(
      new ReloadingTlsContext(files, role, flag_prefix));
  std::string stamp = reloading->Stamp();
  auto first = TlsContext::Create(files, role, flag_prefix);
  if (!first.ok()) return first.status();
  absl::MutexLock lock(&reloading->mu_);
  reloading->current_ = std::move(*first);
  reloading->stamp_ = std::move(stamp);
  return reloading;
}

std::string ReloadingTlsContext::Stamp() const {
  std::string stamp;
  for (const std::string* file : {&files_.ca_file, &files_.cert_file, &files_.key_file,
                                  &files_.crl_file}) {
    struct stat st;
    if (file->empty()) {
      stamp += "-;";
    } else if (::stat(file->c_str(), &st) != 0) {
      stamp += "missing;";
    } else {
      absl::StrAppend(&stamp, st.st_ino, ":", st.st_size, ":", st.st_mtim.tv_sec, ".",
                      st.st_mtim.tv_nsec, ";");
    }
  }
  return stamp;
}

std::shared_ptr<TlsContext> ReloadingTlsContext::Current(std::string* refused) {
  std::string stamp = Stamp();
  absl::MutexLock lock(&mu_);
  if (stamp == stamp_) return current_;
  stamp_ = std::move(stamp);
  auto loaded = TlsContext::Create(files_, role_, flag_prefix_);
  if (!loaded.ok()) {
    if (refused != nullptr) *refused = std::string(loaded.status().message());
    return current_;
  }
  current_ = std::move(*loaded);
  return current_;
}

std::shared_ptr<TlsContext> ReloadingTlsContext::InForce() const {
  absl::MutexLock lock(&mu_);
  return current_;
}

absl::StatusOr<std::string> ReloadingTlsContext::Reload() {
  std::string stamp = Stamp();
  auto loaded = TlsContext::Create(files_, role_, flag_prefix_);
  absl::MutexLock lock(&mu_);
  stamp_ = std::move(stamp);
  if (!loaded.ok()) return loaded.status();
  current_ = std::move(*loaded);
  return current_->summary();
}

TlsContext::~TlsContext() { SSL_CTX_free(ctx_); }

absl::Status ExpectServerName(ssl_st* ssl, const std::string& server_name) {
  if (server_name.empty()) return absl::InvalidArgumentError("no server name to check");
  unsigned char address[16];
  const bool is_ip = ::inet_pton(AF_INET, server_name.c_str(), address) == 1 ||
                     ::inet_pton(AF_INET6, server_name.c_str(), address) == 1;
  if (is_ip) {
    if (X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), server_name.c_str()) != 1) {
      return absl::InvalidArgumentError(absl::StrCat("bad server address ", server_name));
    }
    return absl::OkStatus();
  }
  if (SSL_set1_host(ssl, server_name.c_str()) != 1 ||
      SSL_set_tlsext_host_name(ssl, server_name.c_str()) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad server name ", server_name, ": ", TakeTlsErrors("?")));
  }
  return absl::OkStatus();
}

std::string ServerNameOf(const std::string& address) {
  if (address.rfind("unix:", 0) == 0) return "";
  std::string host = address.substr(0, address.rfind(':'));
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return host;
}

std::string PeerIdentity(ssl_st* ssl) {
  if (SSL_get_verify_result(ssl) != X509_V_OK) return "";
  return CertificateIdentity(SSL_get0_peer_certificate(ssl));
}

}  // namespace fencelock::net
