#!/usr/bin/env bash
# The benchmarks in one command each. Installs what is missing (the build's packages, and for
# the M7 benchmark Redis and gnuplot), builds, and runs:
#
#   ./scripts/bench.sh [ARGS]          the M7 benchmark, fencelock-bench (docs/benchmarks.md):
#                                      floors, heartbeat RTT, lock cycles beside Redis and etcd,
#                                      the margin sweep, payout scaling and the plots, into
#                                      build/m7 (about 9 minutes). ARGS go to fencelock-bench
#                                      (--out=DIR, ...).
#   ./scripts/bench.sh durable [ARGS]  the durability benchmark, lockd_durable_bench: durable
#                                      acquire + release cycles on the local log over plaintext
#                                      and TLS, and on the etcd backend (about a minute).
source "$(dirname "$0")/lib.sh"

if [ "${1:-}" = "durable" ]; then
  shift
  ensure_packages
  build_tree build -DCMAKE_BUILD_TYPE=RelWithDebInfo
  certs="$(mktemp -d)"
  trap 'rm -rf "$certs"' EXIT
  say "making throwaway certificates in $certs"
  "$FENCELOCK_ROOT/scripts/make-certs.sh" "$certs" lockd bench > /dev/null
  say "running lockd_durable_bench (plaintext, TLS, etcd)"
  "$FENCELOCK_ROOT/build/tools/lockd_durable_bench" \
    --lockd="$FENCELOCK_ROOT/build/lock-server/lockd" --tls-dir="$certs" \
    --etcd="$(command -v etcd)" "$@"
  exit
fi

ensure_packages redis-server gnuplot-nox
build_tree build -DCMAKE_BUILD_TYPE=RelWithDebInfo
say "running fencelock-bench (results, plots and summary into build/m7 unless --out says otherwise)"
b="$FENCELOCK_ROOT/build"
"$b/bench/fencelock-bench" --lockd="$b/lock-server/lockd" --rail="$b/payout-demo/payout-rail" \
  --worker="$b/payout-demo/payout-worker" --demo="$b/payout-demo/payout-demo" \
  --redis="$(command -v redis-server)" \
  --etcd="$(command -v etcd)" --gnuplot="$(command -v gnuplot)" --out="$b/m7" "$@"
