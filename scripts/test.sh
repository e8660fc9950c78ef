#!/usr/bin/env bash
# The README's test command (and CI's): installs what is missing, builds, runs every test, then
# builds and runs the same tests again under AddressSanitizer + UndefinedBehaviorSanitizer and
# under ThreadSanitizer, builds the libraries, programs and fuzz targets with clang (its
# -Wthread-safety analysis is an error there; the tests carry no annotations) and runs each
# libFuzzer target for FENCELOCK_FUZZ_SECONDS (default 30) from its committed corpus. Any
# failure, sanitizer report or fuzzer finding fails the run; so does any compiler warning
# (FENCELOCK_WERROR). The long runs of the `stress` label are registered only in a tree
# configured with -DFENCELOCK_STRESS=ON, so each `ctest` here is a plain one; run them with:
#   cmake -B build -DFENCELOCK_STRESS=ON && cmake --build build && ctest --test-dir build -L stress
#
# The tests mostly wait on processes, sockets and leases (the plain run keeps about a third of
# one core busy), so the next tree is built while a tree's tests run, at the lowest CPU and I/O
# priority: it gets only what the tests leave idle. FENCELOCK_SERIAL=1 builds and tests one
# tree after the other.
source "$(dirname "$0")/lib.sh"

ensure_packages

background=""      # pid (and process group) of the tree being built beside the tests
background_dir=""
background_log=""
# Job control gives the background build a process group of its own, so that a failure or a
# Ctrl-C here stops its compilers too.
set -m
trap '[ -z "$background" ] || kill -- "-$background" 2> /dev/null || true' EXIT
trap 'exit 130' INT TERM

# start_build DIR [cmake args...]: builds DIR beside what runs next (or now, when serial).
start_build() {
  local dir="$1"
  if [ "${FENCELOCK_SERIAL:-0}" = 1 ]; then
    build_tree "$@"
    return
  fi
  background_dir="$dir"
  background_log="$(mktemp "${TMPDIR:-/tmp}/fencelock-build-XXXXXX.log")"
  say "building $dir in the background, at the lowest priority (log: $background_log)"
  (
    renice -n 19 -p "$BASHPID" > /dev/null
    ionice -c 3 -p "$BASHPID" 2> /dev/null || true
    build_tree "$@"
  ) > "$background_log" 2>&1 &
  background=$!
}

# finish_build: waits for the background build; its failure fails the run, with its output.
finish_build() {
  [ -n "$background" ] || return 0
  local pid="$background"
  background=""
  if ! wait "$pid"; then
    tail -n 60 "$background_log"
    say "building $background_dir failed (whole log: $background_log)"
    exit 1
  fi
  say "built $background_dir"
  rm -f "$background_log"
}

build_tree build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFENCELOCK_WERROR=ON -DFENCELOCK_STRESS=OFF
start_build build-asan -DCMAKE_BUILD_TYPE=Debug -DFENCELOCK_SANITIZE=address,undefined \
  -DFENCELOCK_WERROR=ON -DFENCELOCK_STRESS=OFF
say "running all tests (build)"
ctest --test-dir "$FENCELOCK_ROOT/build" --output-on-failure -j "$JOBS"
finish_build

start_build build-tsan -DCMAKE_BUILD_TYPE=Debug -DFENCELOCK_SANITIZE=thread \
  -DFENCELOCK_WERROR=ON -DFENCELOCK_STRESS=OFF
say "running all tests under AddressSanitizer + UndefinedBehaviorSanitizer (build-asan)"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1 \
UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir "$FENCELOCK_ROOT/build-asan" --output-on-failure -j "$JOBS"
finish_build

start_build build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
  -DFENCELOCK_FUZZ=ON -DFENCELOCK_TESTS=OFF -DFENCELOCK_WERROR=ON
say "running all tests under ThreadSanitizer (build-tsan)"
TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
  ctest --test-dir "$FENCELOCK_ROOT/build-tsan" --output-on-failure -j "$JOBS"
finish_build

"$FENCELOCK_ROOT/scripts/fuzz.sh" "${FENCELOCK_FUZZ_SECONDS:-30}"

say "all tests passed: plain, ASan+UBSan, TSan; clang -Wthread-safety clean; fuzzers found nothing"
