// How lockd reaches etcd beyond its endpoints: TLS and etcd's users (lockd's --etcd-tls-* and
// --etcd-user flags). Its own header, so that ServerOptions carries it without the etcd log.
#ifndef FENCELOCK_LOCK_SERVER_ETCD_ACCESS_H_
#define FENCELOCK_LOCK_SERVER_ETCD_ACCESS_H_

#include <string>

namespace fencelock::server {

// How lockd reaches etcd beyond its endpoints: TLS (etcdctl's --cacert, --cert and --key) and
// etcd's own users (etcdctl's --user).
struct EtcdAccess {
  // The CA (PEM) that etcd's certificates must chain to; set, every endpoint is spoken to over
  // TLS, its name checked against the certificate. Empty: plaintext.
  std::string ca_file;
  // lockd's client certificate (PEM, intermediates after it) and its key, for an etcd that
  // requires client certificates (--client-cert-auth); both or neither, and only with ca_file.
  std::string cert_file;
  std::string key_file;
  // An etcd user and its password, for an etcd with auth enabled; lockd asks etcd for a token
  // with them and asks again when etcd says the token is no longer valid. Empty: none (with
  // auth enabled and a client certificate, etcd takes the certificate's common name).
  std::string user;
  std::string password;
  bool tls() const { return !ca_file.empty(); }
};

}  // namespace fencelock::server

#endif  // FENCELOCK_LOCK_SERVER_ETCD_ACCESS_H_
