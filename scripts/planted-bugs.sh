#!/usr/bin/env bash
# Plants each durability bug in powercut/planted/*.patch in turn (in lockd: a segment's
# directory not synced, a batch acknowledged before its fdatasync, a snapshot renamed before its
# data was synced, the committed mark written before its records; in the payout demo: the rail
# acknowledging a payment before its ledger is synced), rebuilds, and runs fencelock-powercut
# until a run fails, up to 3 runs (seeds 1 to 3) of 100 power cuts of lockd, or 10 of the
# payout host for a patch of payout-demo/; then reverts the patch. Then the same for each bug in
# sim/planted/*.patch (lockd's rules for shared locks and lock delays: a shared grant while an
# exclusive holder holds, a grant inside a delay) with 2,000 seeds of the simulator. Exits 1 if
# a planted bug was not caught. Installs what is missing and builds first. It edits the sources while it runs:
# the files the patches touch must have no changes of yours (it checks), and it reverts them on
# any exit.
source "$(dirname "$0")/lib.sh"

ensure_packages
build_tree build -DCMAKE_BUILD_TYPE=RelWithDebInfo
cd "$FENCELOCK_ROOT"
for patch in powercut/planted/*.patch sim/planted/*.patch; do
  if ! git apply --check "$patch"; then
    echo "$patch does not apply to this tree: update it" >&2
    exit 2
  fi
done

applied=""
revert() {
  if [ -n "$applied" ]; then
    git apply -R "$applied"
    applied=""
  fi
}
targets=(lockd payout-rail payout-worker fencelock-sim)
trap 'revert; cmake --build build -j "$JOBS" --target "${targets[@]}" > /dev/null' EXIT

missed=0
for patch in powercut/planted/*.patch; do
  name="$(basename "$patch" .patch)"
  say "planting $name"
  git apply "$patch"
  applied="$patch"
  cmake --build build -j "$JOBS" --target "${targets[@]}" > /dev/null
  run=(lockd --cuts=100)
  grep -q '^+++ b/payout-demo/' "$patch" && run=(payout --cuts=10)
  caught=""
  for seed in 1 2 3; do
    out="$(build/powercut/fencelock-powercut "${run[@]}" --seed="$seed" 2>&1 || true)"
    summary="$(grep -E 'power cuts (of the payout host )?\(seed' <<<"$out")"
    echo "  seed $seed: $summary"
    if ! grep -q '; 0 violations' <<<"$summary"; then
      caught="$(grep -m1 VIOLATION <<<"$out" || tail -n 1 <<<"$out")"
      break
    fi
  done
  revert
  if [ -n "$caught" ]; then
    echo "  caught: $caught"
  else
    echo "  NOT CAUGHT in 3 runs of ${run[*]}"
    missed=$((missed + 1))
  fi
done
for patch in sim/planted/*.patch; do
  name="$(basename "$patch" .patch)"
  say "planting $name"
  git apply "$patch"
  applied="$patch"
  cmake --build build -j "$JOBS" --target fencelock-sim > /dev/null
  out="$(build/sim/fencelock-sim --seeds=2000 2>/dev/null || true)"
  echo "  $(tail -n 1 <<<"$out")"
  revert
  if grep -q 'FAILED' <<<"$out"; then
    echo "  caught: $(grep -m1 -A1 FAILED <<<"$out" | tail -n 1)"
  else
    echo "  NOT CAUGHT in 2,000 seeds"
    missed=$((missed + 1))
  fi
done
say "$missed planted bugs not caught"
[ "$missed" -eq 0 ]
