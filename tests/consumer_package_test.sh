#!/usr/bin/env bash
# Issue 19: a separate project builds against the installed package and runs a lock cycle.
#   consumer_package_test.sh BUILD_DIR SOURCE_DIR LOCKD
# Installs BUILD_DIR into a fresh prefix, builds examples/consumer with find_package from that
# prefix and, as a non-CMake user would, with g++ and pkg-config; runs both against a real
# lockd on a free loopback port; and checks that neither links prometheus-cpp.
set -euo pipefail
build="$1" src="$2" lockd="$3"
source "$(dirname "$0")/support/scratch.sh"

echo "== installing $build into $work/prefix"
cmake --install "$build" --prefix "$work/prefix" --component client > "$work/install.log"
for f in include/fencelock/lock-client/client.h lib/cmake/fencelock/fencelockConfig.cmake \
         lib/pkgconfig/fencelock-client.pc lib/pkgconfig/fencelock-metrics-http.pc \
         lib/libfencelock-client.so lib/libfencelock-fence.so lib/libfencelock-metrics-http.so \
         include/fencelock/metrics/exposer.h include/fencelock/api/export.h; do
  [ -e "$work/prefix/$f" ] || fail "the install has no $f"
done
# A worker includes client.h to lock: nothing of Asio, protobuf or prometheus-cpp comes with it.
# Only async.h, the Asio adapter that a consumer includes on purpose, includes Boost.Asio.
[ -e "$work/prefix/include/fencelock/lock-client/async.h" ] || fail "the install has no async.h"
if grep -rlE 'boost/|google/protobuf|prometheus/' --exclude=async.h "$work/prefix/include"; then
  fail "an installed header includes Asio, protobuf or prometheus-cpp"
fi
if grep -rlE '#include .*async\.h' --exclude=async.h "$work/prefix/include"; then
  fail "an installed header other than async.h pulls in the Asio adapter"
fi

echo "== building examples/consumer with find_package(fencelock)"
cmake -S "$src/examples/consumer" -B "$work/consumer" -DCMAKE_PREFIX_PATH="$work/prefix" \
  > "$work/configure.log" || { cat "$work/configure.log"; fail "configuring the consumer"; }
cmake --build "$work/consumer" > "$work/build.log" || { cat "$work/build.log"; fail "building the consumer"; }

echo "== building it again with g++ and pkg-config"
export PKG_CONFIG_PATH="$work/prefix/lib/pkgconfig"
# shellcheck disable=SC2046
g++ -o "$work/consumer-pc" "$src/examples/consumer/main.cc" \
  $(pkg-config --cflags --libs fencelock-client fencelock-fence fencelock-metrics-http) \
  -Wl,-rpath,"$work/prefix/lib" \
  || fail "building with pkg-config"

[ -x "$work/consumer/consumer-async" ] || fail "the async consumer was not built (Boost not found?)"
for exe in "$work/consumer/consumer" "$work/consumer-pc" "$work/consumer/consumer-async"; do
  if ldd "$exe" | grep -i prometheus; then fail "$exe loads prometheus-cpp"; fi
  if nm -D --undefined-only "$exe" | grep -i prometheus; then fail "$exe needs a prometheus-cpp symbol"; fi
done

echo "== running both against a real lockd"
"$lockd" init --data-dir="$work/state" > /dev/null
start_lockd "$lockd" --data-dir="$work/state" --metrics-port=-1
for exe in "$work/consumer/consumer" "$work/consumer-pc" "$work/consumer/consumer-async"; do
  "$exe" "127.0.0.1:$port" || fail "$exe failed its lock cycle"
done
echo "PASS: installed, built with CMake (blocking and co_await) and with pkg-config, a lock cycle each (and /metrics served), no prometheus-cpp"
