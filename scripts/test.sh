#!/usr/bin/env bash
# The README's test command (and CI's): installs what is missing, builds, runs every test, then
# builds and runs the same tests again under AddressSanitizer + UndefinedBehaviorSanitizer.
# Any failure or sanitizer report fails the run. The `stress` label (1000 lockd kills, about
# 6 minutes) is left out; run it with: ctest --test-dir build -L stress
source "$(dirname "$0")/lib.sh"

ensure_packages

build_tree build -DCMAKE_BUILD_TYPE=RelWithDebInfo
say "running all tests (build)"
ctest --test-dir "$FENCELOCK_ROOT/build" --output-on-failure -j "$JOBS" -LE stress

build_tree build-asan -DCMAKE_BUILD_TYPE=Debug -DFENCELOCK_SANITIZE=address,undefined
say "running all tests under AddressSanitizer + UndefinedBehaviorSanitizer (build-asan)"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1 \
UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir "$FENCELOCK_ROOT/build-asan" --output-on-failure -j "$JOBS" -LE stress

say "all tests passed, plain and sanitized"
