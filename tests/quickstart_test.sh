#!/usr/bin/env bash
# Issue 59: the README's first screen runs as printed. quickstart_test.sh QUICKSTART LOCKD
# [PYTHON PYTHONPATH]: serves a fresh lockd on a free loopback port and runs the C++ example
# (the built examples/quickstart/quickstart.cc) and, given an interpreter and the module's
# folder, the Python one (examples/quickstart/quickstart.py), each taking one lock; the tokens
# they print rise. doc_snippets_test checks that the README shows these files word for word.
set -euo pipefail
quickstart="$1" lockd="$2" python="${3:-}" pythonpath="${4:-}"
src="$(cd "$(dirname "$0")/.." && pwd)"
source "$(dirname "$0")/support/scratch.sh"

"$lockd" init --data-dir="$work/state" > /dev/null 2>&1 || fail "lockd init"
start_lockd "$lockd" --data-dir="$work/state" --metrics-port=-1 \
  --admission-lock="$work/admission.lock"
out="$("$quickstart" "127.0.0.1:$port")" || fail "the C++ quickstart failed: $out"
echo "$out"
[ "$out" = "paying payout/42 with token 1" ] || fail "the C++ quickstart printed \"$out\""
if [ -n "$python" ]; then
  out="$(PYTHONPATH="$pythonpath" "$python" "$src/examples/quickstart/quickstart.py" "127.0.0.1:$port")" ||
    fail "the Python quickstart failed: $out"
  echo "$out"
  [ "$out" = "paying payout/42 with token 2" ] || fail "the Python quickstart printed \"$out\""
fi
echo "PASS: the README's quickstart examples took payout/42 and printed their tokens"
