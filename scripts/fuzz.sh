#!/usr/bin/env bash
# Runs each libFuzzer target in build-fuzz/ for SECONDS (default 60), two at a time, from a
# scratch copy of its committed corpus and regression inputs, so nothing is written into the
# repository. A crash, leak, timeout or sanitizer report fails the run; the input that caused
# it is kept in the scratch directory and named in the output (add it under
# fuzz/regressions/<target>/ once fixed).
#   scripts/fuzz.sh [SECONDS] [TARGET...]
source "$(dirname "$0")/lib.sh"

seconds="${1:-60}"
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(frame_decoder_fuzz dispatch_fuzz wal_record_fuzz snapshot_fuzz permissions_fuzz)
scratch="$(mktemp -d "${TMPDIR:-/tmp}/fencelock-fuzz-XXXXXX")"

fuzz_one() {
  local t="$1" dir="$scratch/$1"
  mkdir -p "$dir/corpus" "$dir/artifacts"
  cp "$FENCELOCK_ROOT/fuzz/corpus/$t/"* "$dir/corpus/"
  if [ -d "$FENCELOCK_ROOT/fuzz/regressions/$t" ]; then
    cp "$FENCELOCK_ROOT/fuzz/regressions/$t/"* "$dir/corpus/"
  fi
  if "$FENCELOCK_ROOT/build-fuzz/fuzz/$t" "$dir/corpus" -max_total_time="$seconds" \
       -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$dir/artifacts/" \
       > "$dir/log" 2>&1; then
    echo "$t: $(grep -o 'number_of_executed_units: *[0-9]*' "$dir/log" | grep -o '[0-9]*$') executions in ${seconds}s, nothing found"
  else
    echo "$t: FAILED; input kept in $dir/artifacts/, log in $dir/log"
    tail -30 "$dir/log"
    return 1
  fi
}

say "fuzzing ${targets[*]} for ${seconds}s each, two at a time (scratch: $scratch)"
failed=0
for ((i = 0; i < ${#targets[@]}; i += 2)); do
  pids=()
  for t in "${targets[@]:i:2}"; do
    fuzz_one "$t" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || failed=1; done
done
if [ "$failed" -ne 0 ]; then
  say "a fuzzer found something"
  exit 1
fi
rm -rf "$scratch"
