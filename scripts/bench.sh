#!/usr/bin/env bash
# The durability benchmark in one command: installs what is missing, builds, makes throwaway
# certificates, and measures durable acquire + release cycles on the local log over plaintext
# TCP and over TLS, and on the etcd backend (a one-member etcd the benchmark starts), at 1, 8
# and 64 clients. Extra arguments go to lockd_durable_bench (e.g. --seconds=10 --clients=1,64).
source "$(dirname "$0")/lib.sh"

ensure_packages
build_tree build -DCMAKE_BUILD_TYPE=RelWithDebInfo
certs="$(mktemp -d)"
trap 'rm -rf "$certs"' EXIT
say "making throwaway certificates in $certs"
"$FENCELOCK_ROOT/scripts/make-certs.sh" "$certs" lockd bench > /dev/null
say "running lockd_durable_bench (plaintext, TLS, etcd)"
"$FENCELOCK_ROOT/build/lock-server/lockd_durable_bench" \
  --lockd="$FENCELOCK_ROOT/build/lock-server/lockd" --tls-dir="$certs" \
  --etcd="$(command -v etcd)" "$@"
