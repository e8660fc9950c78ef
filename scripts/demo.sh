#!/usr/bin/env bash
# The README's main command: installs what is missing, builds, starts lockd on a fresh state
# directory and runs a short scripted client session against it, then stops lockd.
source "$(dirname "$0")/lib.sh"

ensure_packages
build_tree build -DCMAKE_BUILD_TYPE=RelWithDebInfo

work="$(mktemp -d "${TMPDIR:-/tmp}/fencelock-demo-XXXXXX")"
lockd_pid=""
cleanup() {
  if [ -n "$lockd_pid" ] && kill -0 "$lockd_pid" 2>/dev/null; then
    kill "$lockd_pid"
    wait "$lockd_pid" || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT INT TERM

say "creating a fresh state folder: lockd init --data-dir $work/state"
"$FENCELOCK_ROOT/build/lock-server/lockd" init --data-dir="$work/state" --wal-segment-bytes=4194304

say "starting lockd on a free loopback port"
"$FENCELOCK_ROOT/build/lock-server/lockd" serve --data-dir="$work/state" --port=0 \
  --port-file="$work/port" --unix-socket="$work/lockd.sock" --metrics-port=0 \
  > "$work/lockd.log" 2>&1 &
lockd_pid=$!
for _ in $(seq 1 200); do [ -s "$work/port" ] && break; sleep 0.05; done
[ -s "$work/port" ] || { cat "$work/lockd.log"; echo "lockd did not start" >&2; exit 1; }
cat "$work/lockd.log"

say "running the scripted client session"
"$FENCELOCK_ROOT/build/lock-client/fencelock-session-demo" --server="127.0.0.1:$(cat "$work/port")"

say "lockd's own view afterwards: lockctl status"
"$FENCELOCK_ROOT/build/lock-server/lockctl" --server="127.0.0.1:$(cat "$work/port")" status
