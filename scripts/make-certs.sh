#!/usr/bin/env bash
# Makes a small cluster's certificates with openssl: a certificate authority, lockd's server
# certificate, and one client certificate per identity (workers, lockctl). docs/security.md
# walks through it, and tests/certs_test.sh runs it.
#   scripts/make-certs.sh DIR SERVER-NAME [CLIENT-NAME...]
# Writes DIR/ca.{key,crt} (reused if present), DIR/SERVER-NAME.{key,crt} (names: DNS:SERVER-NAME,
# DNS:localhost, IP:127.0.0.1; for TLS servers) and DIR/CLIENT-NAME.{key,crt} (CN and DNS name
# CLIENT-NAME; for TLS clients). Keys are P-256 ECDSA, readable by their owner only.
# DAYS (default 365) sets how long the new certificates are valid.
set -euo pipefail

if [ $# -lt 2 ]; then
  echo "usage: $0 DIR SERVER-NAME [CLIENT-NAME...]" >&2
  exit 2
fi
dir="$1"
server="$2"
shift 2
days="${DAYS:-365}"
for name in "$server" "$@"; do
  if ! [[ "$name" =~ ^[A-Za-z0-9][A-Za-z0-9.-]*$ ]]; then
    echo "$0: \"$name\" is not a name (letters, digits, dots and dashes)" >&2
    exit 2
  fi
done
umask 077
mkdir -p "$dir"

if [ ! -f "$dir/ca.key" ]; then
  echo "making a certificate authority in $dir/ca.crt"
  openssl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
    -keyout "$dir/ca.key" -out "$dir/ca.crt" -days 3650 -subj "/CN=fencelock CA" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    2>/dev/null
fi

# issue NAME EXTENSIONS: a key and a certificate for NAME, signed by the CA.
issue() {
  local name="$1" extensions="$2"
  echo "making $dir/$name.crt ($days days)"
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
    -keyout "$dir/$name.key" -out "$dir/$name.csr" -subj "/CN=$name" 2>/dev/null
  openssl x509 -req -in "$dir/$name.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" \
    -CAcreateserial -out "$dir/$name.crt" -days "$days" -extfile <(printf '%s\n' "$extensions") \
    2>/dev/null
  rm -f "$dir/$name.csr"
}

issue "$server" "subjectAltName=DNS:$server,DNS:localhost,IP:127.0.0.1
extendedKeyUsage=serverAuth"
for client in "$@"; do
  issue "$client" "subjectAltName=DNS:$client
extendedKeyUsage=clientAuth"
done
