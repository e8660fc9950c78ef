#!/usr/bin/env bash
# The replicated setup in one command: installs what is missing (etcd-server among it), builds,
# and runs the payout demo with lockd's state in a local 3-member etcd cluster and three lockd
# replicas on loopback (the first serving, the others standing by). etcd requires client
# certificates, as production clusters do; they are made once by make-certs.sh in
# build/etcd-certs. Besides the demo's worker faults, the serving lockd is killed in the middle;
# a standby takes over, the workers follow it, and the run ends with the same reconciliation
# table as the demo. Extra arguments go to payout-demo (--help lists them). Exits with the
# demo's status.
source "$(dirname "$0")/lib.sh"

ensure_packages
build_tree build -DCMAKE_BUILD_TYPE=RelWithDebInfo

certs="$FENCELOCK_ROOT/build/etcd-certs"
if [ ! -f "$certs/lockd.key" ]; then
  say "making etcd's and lockd's certificates in $certs"
  bash "$FENCELOCK_ROOT/scripts/make-certs.sh" "$certs" etcd lockd
fi

say "running the replicated payout demo: build/payout-demo/payout-demo --ha --etcd-tls-dir=$certs $*"
exec "$FENCELOCK_ROOT/build/payout-demo/payout-demo" --ha --etcd-tls-dir="$certs" "$@"
