#!/usr/bin/env bash
# scripts/make-certs.sh makes certificates that openssl accepts for their purpose and refuses
# otherwise: a client's and the server's chain to the CA; a certificate from another CA, an
# expired one (made under faketime) and a server certificate used as a client's are refused.
#   tests/certs_test.sh MAKE-CERTS FAKETIME
set -euo pipefail
make_certs="$1"
faketime="$2"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAILED: $*" >&2; exit 1; }

"$make_certs" "$dir/a" lockd worker-1 lockctl
"$make_certs" "$dir/b" other worker-1
DAYS=1 "$faketime" -f '-3d' "$make_certs" "$dir/a" lockd2 expired-worker

openssl verify -CAfile "$dir/a/ca.crt" -purpose sslserver "$dir/a/lockd.crt" || fail "server certificate"
openssl verify -CAfile "$dir/a/ca.crt" -purpose sslclient "$dir/a/worker-1.crt" "$dir/a/lockctl.crt" ||
  fail "client certificates"
# Read into a string, not piped: under pipefail a grep -q that exits at its match can fail the
# pipeline with the writer's SIGPIPE.
san="$(openssl x509 -in "$dir/a/lockd.crt" -noout -ext subjectAltName)"
grep -q "IP Address:127.0.0.1" <<<"$san" || fail "the server certificate does not name 127.0.0.1"
subject="$(openssl x509 -in "$dir/a/worker-1.crt" -noout -subject)"
grep -q "CN = worker-1" <<<"$subject" || fail "the client certificate does not carry its name"
if openssl verify -CAfile "$dir/a/ca.crt" "$dir/b/worker-1.crt" 2>/dev/null; then
  fail "a certificate from another CA was accepted"
fi
out="$(openssl verify -CAfile "$dir/a/ca.crt" "$dir/a/expired-worker.crt" 2>&1 || true)"
grep -q "certificate has expired" <<<"$out" || fail "an expired certificate was accepted: $out"
if openssl verify -CAfile "$dir/a/ca.crt" -purpose sslclient "$dir/a/lockd.crt" 2>/dev/null; then
  fail "a server certificate was accepted as a client's"
fi
[ "$(stat -c %a "$dir/a/worker-1.key")" = 600 ] || fail "a key is readable by others"
if "$make_certs" "$dir/c" "bad name" 2>/dev/null; then fail "a bad name was accepted"; fi
echo "certificates: OK"
