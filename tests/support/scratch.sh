# Sourced by the tests' shell scripts (set -euo pipefail first): $work, a scratch directory
# removed on exit together with the lockd started by start_lockd; fail MESSAGE; and
# start_lockd LOCKD ARGS..., which serves `LOCKD serve ARGS` on a port the kernel picks, waits
# for it and sets $port.
work="$(mktemp -d)"
lockd_pid=""
cleanup() {
  [ -n "$lockd_pid" ] && kill "$lockd_pid" 2>/dev/null && wait "$lockd_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

start_lockd() {
  local binary="$1"
  shift
  "$binary" serve "$@" --port=0 --port-file="$work/port" > "$work/lockd.log" 2>&1 &
  lockd_pid=$!
  for _ in $(seq 1 300); do [ -s "$work/port" ] && break; sleep 0.1; done
  [ -s "$work/port" ] || { cat "$work/lockd.log"; fail "lockd did not start"; }
  port="$(cat "$work/port")"
}
