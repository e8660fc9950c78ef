#!/usr/bin/env bash
# Plants each of lockd's durability bugs in powercut/planted/*.patch in turn (a segment's
# directory not synced, a batch acknowledged before its fdatasync, a snapshot renamed before its
# data was synced, the committed mark written before its records), rebuilds lockd, and runs
# fencelock-powercut until a run fails, up to 3 runs of 100 power cuts each (seeds 1 to 3);
# then reverts the patch. Exits 1 if a planted bug was not caught. Installs what is missing and
# builds first. It edits lock-server/src while it runs: the files the patches touch must have
# no changes of yours (it checks), and it reverts them on any exit.
source "$(dirname "$0")/lib.sh"

ensure_packages
build_tree build -DCMAKE_BUILD_TYPE=RelWithDebInfo
cd "$FENCELOCK_ROOT"
for patch in powercut/planted/*.patch; do
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
trap 'revert; cmake --build build -j "$JOBS" --target lockd > /dev/null' EXIT

missed=0
for patch in powercut/planted/*.patch; do
  name="$(basename "$patch" .patch)"
  say "planting $name"
  git apply "$patch"
  applied="$patch"
  cmake --build build -j "$JOBS" --target lockd > /dev/null
  caught=""
  for seed in 1 2 3; do
    out="$(build/powercut/fencelock-powercut lockd --cuts=100 --seed="$seed" 2>&1 || true)"
    summary="$(grep -E 'power cuts \(seed' <<<"$out")"
    echo "  seed $seed: $summary"
    if ! grep -q '; 0 violations' <<<"$summary"; then
      caught="$(grep -m1 VIOLATION <<<"$out")"
      break
    fi
  done
  revert
  if [ -n "$caught" ]; then
    echo "  caught: $caught"
  else
    echo "  NOT CAUGHT in 300 power cuts"
    missed=$((missed + 1))
  fi
done
say "$missed planted bugs not caught"
[ "$missed" -eq 0 ]
