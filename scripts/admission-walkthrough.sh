#!/usr/bin/env bash
# The admission walk-through of docs/admission.md, driven entirely by lockctl: a pool of 8
# units and three profiles (build borrows; test reserves 2 lendable units; deploy reserves 2 it
# never lends), on a lockd that listens on a Unix socket only. It shows fair shares, demand
# expiry freeing units, borrowing, a manager vanishing with its active leases kept, a
# replacement manager reconciling, an operator's fenced recovery, a restart, and the rollback
# (drain, then stop). Every step checks its outcome; the script exits non-zero at the first
# surprise. The tests run it (admission_walkthrough_test).
#
#   scripts/admission-walkthrough.sh [BUILD_DIR]      (default: build)
set -euo pipefail

build="${1:-$(dirname "$0")/../build}"
lockd="$build/lock-server/lockd"
lockctl="$build/tools/lockctl"
for b in "$lockd" "$lockctl"; do
  [[ -x "$b" ]] || { echo "walkthrough: $b is missing: build first" >&2; exit 2; }
done
work="$(mktemp -d "${TMPDIR:-/tmp}/fencelock-admission.XXXXXX")"
sock="$work/lockd.sock"
lockd_pid=""
other_pid=""
# This walk-through's host lock (ADR 0005): the default one, /run/lock's, would make it clash
# with a real coordinator on this machine.
host_lock="$work/admission.lock"
cleanup() {
  [[ -n "$lockd_pid" ]] && kill "$lockd_pid" 2>/dev/null && wait "$lockd_pid" 2>/dev/null
  [[ -n "$other_pid" ]] && kill "$other_pid" 2>/dev/null && wait "$other_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

step() { printf '\n== %s\n' "$*"; }
fail() { echo "walkthrough: FAILED: $*" >&2; exit 1; }
pool() { "$lockctl" --server="unix:$sock" pool "$@"; }
# expect N CMD...: runs CMD (output shown), fails unless it exits with N.
expect() {
  local want="$1"; shift
  local got=0
  "$@" || got=$?
  [[ "$got" == "$want" ]] || fail "\"$*\" exited $got, expected $want"
}
# A field of `pool status --json` for one profile or the pool: status_field PROFILE|- FIELD
status_field() {
  pool status --pool=hosts --json | python3 -c '
import json, sys
s = json.load(sys.stdin)
who, field = sys.argv[1], sys.argv[2]
if who == "-":
    print(json.dumps(s[field]))
else:
    print(json.dumps(next(p for p in s["profiles"] if p["id"] == who)[field]))' "$1" "$2"
}
check() {  # check PROFILE|- FIELD EXPECTED
  local got
  got="$(status_field "$1" "$2")"
  [[ "$got" == "$3" ]] || fail "status $1.$2 is $got, expected $3"
  echo "   ok: $1 $2 = $got"
}
# Setup, the managers and the operator all run as this user here; a real host would give the
# operator and each profile's manager an identity of its own.
me="uid:$(id -u)"
printf '%s operator\n%s manage hosts/*\n%s list\n' "$me" "$me" "$me" >"$work/permissions"
start_lockd() {
  "$lockd" serve --data-dir="$work/state" --tcp=false --unix-socket="$sock" --metrics-port=-1 \
    --pool-demand-ttl=3s --permissions="$work/permissions" --admission-lock="$host_lock" \
    >>"$work/lockd.log" 2>&1 &
  lockd_pid=$!
  # Up to 60 s: a CI machine whose disk is busy with etcd's syncs took 3.5 s to restore this
  # small state, and 5 s was once too little. A lockd that exited fails at once.
  for _ in $(seq 1200); do
    [[ -S "$sock" ]] && "$lockctl" --server="unix:$sock" status >/dev/null 2>&1 && return 0
    kill -0 "$lockd_pid" 2>/dev/null || { cat "$work/lockd.log" >&2; fail "lockd exited at start"; }
    sleep 0.05
  done
  cat "$work/lockd.log" >&2
  fail "lockd did not start within 60 s"
}
acquire_active() {  # acquire_active PROFILE SLOT OWNER: acquires and activates; prints the token
  local token
  token="$(pool acquire --pool=hosts --profile="$1" --slot="$2" --owner="$3")" || return $?
  pool activate --pool=hosts --profile="$1" --slot="$2" --token="$token" --owner="$3" >/dev/null
  echo "$token"
}

step "lockd on a Unix socket only: no TCP listener, no metrics port (ADR-0003: no network port)"
"$lockd" init --data-dir="$work/state"
start_lockd
inodes="$(ls -l /proc/$lockd_pid/fd | sed -n 's/.*socket:\[\([0-9]*\)\]/\1/p' | sort -u)"
for inode in $inodes; do
  if [ -n "$(awk -v i="$inode" '$10 == i && $4 == "0A"' /proc/net/tcp /proc/net/tcp6)" ]; then
    fail "lockd listens on TCP (socket inode $inode)"
  fi
done
echo "   ok: lockd (pid $lockd_pid) has no listening TCP socket"
expect 1 "$lockd" serve --data-dir="$work/state" --tcp=false --unix-socket="$work/second.sock" \
  --metrics-port=-1
echo "   ok: a second lockd on the same state directory is refused"

step "setup publishes the policy and waits for lockd's acknowledgement"
pool publish --pool=hosts --generation=1 --budget=8 \
  --profiles=build:borrow,test:cost=2:reserve=2:lendable,deploy:reserve=2
expect 5 pool publish --pool=hosts --generation=1 --budget=9 --profiles=build
expect 2 pool publish --pool=hosts --generation=2 --budget=8 --profiles=build,build

step "one admission namespace per host (ADR 0005): a second coordinator is refused, naming the first"
"$lockd" init --data-dir="$work/other" >/dev/null
"$lockd" serve --data-dir="$work/other" --tcp=false --unix-socket="$work/other.sock" \
  --metrics-port=-1 --permissions="$work/permissions" --admission-lock="$host_lock" \
  >>"$work/other.log" 2>&1 &
other_pid=$!
for _ in $(seq 1200); do
  [[ -S "$work/other.sock" ]] && "$lockctl" --server="unix:$work/other.sock" status >/dev/null 2>&1 && break
  kill -0 "$other_pid" 2>/dev/null || { cat "$work/other.log" >&2; fail "the second lockd exited at start"; }
  sleep 0.05
done
rc=0
out="$("$lockctl" --server="unix:$work/other.sock" pool publish --pool=elsewhere --generation=1 \
  --budget=4 --profiles=x 2>&1)" || rc=$?
echo "$out"
[[ "$rc" == 5 ]] || fail "a second coordinator's publish exited $rc, expected 5"
[[ "$out" == *"locked by lockd pid $lockd_pid "* ]] || fail "the refusal does not name lockd $lockd_pid"
kill "$other_pid" && wait "$other_pid" || true
other_pid=""
echo "   ok: the second lockd serves locks, and its publish is refused naming lockd $lockd_pid"

step "each profile's manager claims its profile (an epoch and a key)"
BUILD="$(pool claim --pool=hosts --profile=build --generation=1)"
TEST="$(pool claim --pool=hosts --profile=test --generation=1)"
DEPLOY="$(pool claim --pool=hosts --profile=deploy --generation=1)"
echo "   build's owner: $BUILD"
check - complete true

step "fair shares: build and test want more than the pool at once; 4 fair units, 2 each"
# test's lendable reservation is test's own while test wants it, so the fair units are the 4
# unreserved ones.
pool set-demand --pool=hosts --profile=build --owner="$BUILD" --slots=6
pool set-demand --pool=hosts --profile=test --owner="$TEST" --slots=3
for slot in b1 b2; do acquire_active build "$slot" "$BUILD" >/dev/null; done
expect 3 pool acquire --pool=hosts --profile=build --slot=b3 --owner="$BUILD"
check test withheld_units 2
pool status --pool=hosts

step "test's manager vanishes before it acquires: its demand expires after 3 s (--pool-demand-ttl)"
sleep 3.5
check test pending_units null
check test withheld_units null
for slot in b3 b4 b5 b6; do acquire_active build "$slot" "$BUILD" >/dev/null; done
echo "   ok: build got b3, b4 (unreserved) and b5, b6 (borrowed: test's lendable reservation)"
expect 3 pool acquire --pool=hosts --profile=build --slot=b7 --owner="$BUILD"
echo "   ok: deploy's 2 reserved units are never lent"
D1="$(acquire_active deploy d1 "$DEPLOY")"
acquire_active deploy d2 "$DEPLOY" >/dev/null
check - used_units 8

step "test comes back: its lent units are not taken back from build's active leases"
expect 3 pool acquire --pool=hosts --profile=test --slot=t1 --owner="$TEST"

step "build's manager vanishes; its 6 active leases stay (time never frees an active lease)"
token_of() {  # token_of SLOT: the token of the lease on SLOT, from pool status
  pool status --pool=hosts --json | python3 -c '
import json, sys
print(next(l["token"] for l in json.load(sys.stdin)["leases"] if l["slot"] == sys.argv[1]))' "$1"
}
B5_TOKEN="$(token_of b5)"
B6_TOKEN="$(token_of b6)"
NEW_BUILD="$(pool claim --pool=hosts --profile=build --generation=1)"
echo "   the replacement manager's owner: $NEW_BUILD"
expect 6 pool release --pool=hosts --profile=build --slot=b6 --token="$B6_TOKEN" --owner="$BUILD"
echo "   ok: the old manager's release is refused (stale epoch)"
check build active_units 6
expect 4 pool release --pool=hosts --profile=build --slot=b6 --token="$B5_TOKEN" --owner="$NEW_BUILD"
echo "   ok: a release must name the exact slot and token"
pool release --pool=hosts --profile=build --slot=b5 --token="$B5_TOKEN" --owner="$NEW_BUILD"
pool release --pool=hosts --profile=build --slot=b6 --token="$B6_TOKEN" --owner="$NEW_BUILD"
echo "   ok: the replacement proved b5's and b6's workers absent and released those exact slots"
check build active_units 4
T1="$(acquire_active test t1 "$TEST")"
echo "   ok: test got t1 (token $T1) from its own reservation"

step "deploy's profile is removed for good with d1 still leased: an operator's fenced recovery"
expect 2 pool recover --pool=hosts --profile=deploy --slot=d1 --token="$D1"
pool recover --pool=hosts --profile=deploy --slot=d1 --token="$D1" \
  --evidence="no container deploy-d1 on the daemon (docker ps -a), registration gone"
expect 5 pool recover --pool=hosts --profile=deploy --slot=d1 --token="$D1" --evidence=again
expect 5 pool recover --pool=hosts --profile=deploy --slot=d2 --token="$((D1 + 1000))" --evidence=stale
echo "   ok: a repeated and a stale recovery are refused"
pool status --pool=hosts

step "lockd restarts: policy, leases, epochs, tombstones and the decision sequence come back"
before="$(pool status --pool=hosts --json | python3 -c '
import json, sys
s = json.load(sys.stdin)
print(s["decision"], s["used_units"], len(s["leases"]), len(s["tombstones"]))')"
kill "$lockd_pid"; wait "$lockd_pid" || true
start_lockd
after="$(pool status --pool=hosts --json | python3 -c '
import json, sys
s = json.load(sys.stdin)
print(s["decision"], s["used_units"], len(s["leases"]), len(s["tombstones"]))')"
[[ "$before" == "$after" ]] || fail "after the restart: $after, before: $before"
echo "   ok: decision, units, leases and tombstones: $after"
expect 6 pool set-demand --pool=hosts --profile=build --owner="$BUILD" --slots=1
echo "   ok: the old build manager is still stale after the restart"

step "rollback: drain, lockd stops only once no lease remains, and its state goes only then"
pool drain --pool=hosts
expect 5 pool acquire --pool=hosts --profile=deploy --slot=d3 --owner="$DEPLOY"
expect 5 pool stop
expect 1 "$lockd" destroy --data-dir="$work/state"
echo "   ok: lockd destroy is refused while lockd runs on the state"
kill "$lockd_pid"; wait "$lockd_pid" || true
lockd_pid=""
expect 4 "$lockd" destroy --data-dir="$work/state"
[[ -f "$work/state/FORMAT" ]] || fail "lockd destroy removed something while leases remained"
echo "   ok: lockd destroy lists the leases left and removes nothing"
start_lockd
pool status --pool=hosts --json | python3 -c '
import json, sys
for l in json.load(sys.stdin)["leases"]:
    print(l["profile"], l["slot"], l["token"])' | while read -r profile slot token; do
  case "$profile" in build) owner="$NEW_BUILD" ;; test) owner="$TEST" ;; deploy) owner="$DEPLOY" ;; esac
  pool release --pool=hosts --profile="$profile" --slot="$slot" --token="$token" --owner="$owner" >/dev/null
done
check - used_units 0
pool stop
wait "$lockd_pid"
lockd_pid=""
echo "   ok: lockd stopped"
"$lockd" destroy --data-dir="$work/state"
[[ ! -e "$work/state" ]] || fail "lockd destroy left $work/state"
echo "   ok: lockd destroy removed exactly the coordinator's state"
printf '\nwalkthrough: OK\n'
