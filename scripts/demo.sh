#!/usr/bin/env bash
# The README's main command: installs what is missing, builds, and runs the payout demo on a
# fresh state directory (lockd, the rail simulator and 3 payout workers as separate processes;
# one worker frozen past its session TTL, another killed), ending with the reconciliation
# table. Extra arguments go to payout-demo (--help lists them). Exits with the demo's status.
source "$(dirname "$0")/lib.sh"

ensure_packages
# Only the demo's programs (payout-demo, lockd, payout-rail, payout-worker-faults), the
# README's C++ quickstart and the libraries they link: the tests, fuzz tools and benchmarks are
# the test command's to build.
FENCELOCK_TARGETS="payout-demo fencelock-quickstart" build_tree build -DCMAKE_BUILD_TYPE=RelWithDebInfo

say "running the payout demo: build/payout-demo/payout-demo $*"
exec "$FENCELOCK_ROOT/build/payout-demo/payout-demo" "$@"
