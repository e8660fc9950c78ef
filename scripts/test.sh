#!/usr/bin/env bash
# The README's test command (and CI's): installs what is missing, builds, runs every test, then
# builds and runs the same tests again under AddressSanitizer + UndefinedBehaviorSanitizer and
# under ThreadSanitizer, builds everything with clang (its -Wthread-safety analysis is an
# error there) and runs each libFuzzer target for FENCELOCK_FUZZ_SECONDS (default 30) from its
# committed corpus. Any failure, sanitizer report or fuzzer finding fails the run. The `stress`
# label (1000 lockd kills, about 6 minutes) is left out; run it with:
#   ctest --test-dir build -L stress
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

build_tree build-tsan -DCMAKE_BUILD_TYPE=Debug -DFENCELOCK_SANITIZE=thread
say "running all tests under ThreadSanitizer (build-tsan)"
TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
  ctest --test-dir "$FENCELOCK_ROOT/build-tsan" --output-on-failure -j "$JOBS" -LE stress

build_tree build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
  -DFENCELOCK_FUZZ=ON
"$FENCELOCK_ROOT/scripts/fuzz.sh" "${FENCELOCK_FUZZ_SECONDS:-30}"

say "all tests passed: plain, ASan+UBSan, TSan; clang -Wthread-safety clean; fuzzers found nothing"
