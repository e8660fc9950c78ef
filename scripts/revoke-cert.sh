#!/usr/bin/env bash
# Revocation for the certificate authority scripts/make-certs.sh made: revokes certificates and
# writes the CA's certificate revocation list, which lockd reads with --tls-crl (and again on
# SIGHUP). docs/security.md walks through it; tests/tls_test.cc runs it.
#   scripts/revoke-cert.sh DIR [NAME...]
# Revokes DIR/NAME.crt for each NAME (the CA's record of revocations: DIR/index.txt), then
# writes DIR/crl.pem listing every certificate revoked so far, valid for CRL_DAYS (default 30)
# days. With no NAME it only writes the list again: do so before it expires, and send lockd
# SIGHUP, since lockd refuses every client certificate once the list in force has expired.
set -euo pipefail

if [ $# -lt 1 ]; then
  echo "usage: $0 DIR [NAME...]" >&2
  exit 2
fi
dir="$1"
shift
days="${CRL_DAYS:-30}"
[ -f "$dir/ca.key" ] && [ -f "$dir/ca.crt" ] ||
  { echo "$0: $dir has no certificate authority (make it with scripts/make-certs.sh)" >&2; exit 2; }
for name in "$@"; do
  if ! [[ "$name" =~ ^[A-Za-z0-9][A-Za-z0-9.-]*$ ]]; then
    echo "$0: \"$name\" is not a name (letters, digits, dots and dashes)" >&2
    exit 2
  fi
  [ -f "$dir/$name.crt" ] || { echo "$0: there is no $dir/$name.crt" >&2; exit 2; }
done
umask 077
[ -f "$dir/index.txt" ] || : > "$dir/index.txt"
[ -f "$dir/crlnumber" ] || echo 1000 > "$dir/crlnumber"
config="$(mktemp)"
trap 'rm -f "$config"' EXIT
cat > "$config" <<CONFIG
[ ca ]
default_ca = fencelock_ca
[ fencelock_ca ]
database = $dir/index.txt
crlnumber = $dir/crlnumber
default_md = sha256
default_crl_days = $days
CONFIG

for name in "$@"; do
  serial="$(openssl x509 -in "$dir/$name.crt" -noout -serial | cut -d= -f2)"
  if awk -F'\t' -v s="$serial" '$1 == "R" && $4 == s { found = 1 } END { exit !found }' \
       "$dir/index.txt"; then
    echo "$dir/$name.crt (serial $serial) is already revoked"
    continue
  fi
  echo "revoking $dir/$name.crt (serial $serial)"
  openssl ca -config "$config" -keyfile "$dir/ca.key" -cert "$dir/ca.crt" \
    -revoke "$dir/$name.crt" 2>/dev/null ||
    { echo "$0: openssl could not revoke $dir/$name.crt" >&2; exit 1; }
done
# Written beside and renamed into place: lockd never reads half a list.
openssl ca -config "$config" -keyfile "$dir/ca.key" -cert "$dir/ca.crt" -gencrl \
  -out "$dir/crl.pem.new" 2>/dev/null
mv "$dir/crl.pem.new" "$dir/crl.pem"
echo "wrote $dir/crl.pem ($(grep -c '^R' "$dir/index.txt" || true) revoked, valid $days days)"
