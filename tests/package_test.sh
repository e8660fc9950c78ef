#!/usr/bin/env bash
# Issue 41: the Debian packages an operator and a developer install.
#   package_test.sh BUILD_DIR SOURCE_DIR PYTHON
# Builds the packages with `cpack -G DEB` from BUILD_DIR, checks their metadata and contents,
# unpacks them into a scratch root (nothing is installed on this machine), runs
# `systemd-analyze verify` on the units, serves a lockd from the unpacked package with the
# packaged flags file, builds and runs examples/consumer against the unpacked client package,
# and imports the Python module from the unpacked package and from `cmake --install` into a
# prefix (with PYTHON, the interpreter the module was built for).
set -euo pipefail
build="$1" src="$2" python="$3"
source "$(dirname "$0")/support/scratch.sh"

echo "== cpack -G DEB"
cpack -G DEB --config "$build/CPackConfig.cmake" -B "$work/out" > "$work/cpack.log" 2>&1 ||
  { cat "$work/cpack.log"; fail "cpack -G DEB"; }
server="$(ls "$work"/out/fencelock-server_*.deb 2>/dev/null || true)"
client="$(ls "$work"/out/fencelock-client-dev_*.deb 2>/dev/null || true)"
pymodule="$(ls "$work"/out/python3-fencelock_*.deb 2>/dev/null || true)"
[ -f "$server" ] || { ls "$work/out"; fail "no fencelock-server package"; }
[ -f "$client" ] || { ls "$work/out"; fail "no fencelock-client-dev package"; }
[ -f "$pymodule" ] || { ls "$work/out"; fail "no python3-fencelock package"; }
echo "built $(basename "$server"), $(basename "$client") and $(basename "$pymodule")"

echo "== metadata"
for deb in "$server" "$client" "$pymodule"; do
  depends="$(dpkg-deb -f "$deb" Depends)"
  # dpkg-shlibdeps found what the binaries load: Abseil and OpenSSL at least.
  # (grep reads a string, never a pipe: with pipefail, grep -q leaving a pipe early fails the
  # writer with SIGPIPE, and the check with it.)
  grep -q 'libabsl' <<< "$depends" || fail "$(basename "$deb") does not depend on Abseil: $depends"
  grep -q 'libssl3' <<< "$depends" || fail "$(basename "$deb") does not depend on OpenSSL: $depends"
done
grep -q adduser <<< "$(dpkg-deb -f "$server" Depends)" ||
  fail "the server package does not depend on adduser"
mkdir -p "$work/control"
dpkg-deb -e "$server" "$work/control"
for f in postinst prerm postrm conffiles; do
  [ -f "$work/control/$f" ] || fail "the server package has no $f"
done
for f in postinst prerm postrm; do
  sh -n "$work/control/$f" || fail "$f is not a valid shell script"
  [ -x "$work/control/$f" ] || fail "$f is not executable"
done
grep -qx /etc/fencelock/lockd.flags "$work/control/conffiles" ||
  fail "lockd.flags is not a conffile (dpkg would overwrite an operator's edits)"

echo "== contents"
contents() { dpkg-deb -c "$1" | awk '{print $6}' | sed 's|^\./|/|'; }
contents "$server" > "$work/server.list"
contents "$client" > "$work/client.list"
contents "$pymodule" > "$work/python.list"
grep -qE '^/usr/lib/python3/dist-packages/fencelock\..*\.so$' "$work/python.list" ||
  fail "the python3-fencelock package has no module: $(cat "$work/python.list")"
for f in /usr/bin/lockd /usr/bin/lockctl /usr/lib/systemd/system/lockd.service \
         /usr/lib/systemd/system/lockd@.service /etc/fencelock/lockd.flags \
         /etc/fencelock/lockd-replica.flags.example /usr/share/doc/fencelock-server/README.md; do
  grep -qx "$f" "$work/server.list" || fail "the server package has no $f"
done
for f in /usr/lib/libfencelock-client.so /usr/lib/libfencelock-fence.so \
         /usr/lib/libfencelock-metrics-http.so /usr/include/fencelock/lock-client/client.h \
         /usr/include/fencelock/metrics/exposer.h /usr/include/fencelock/api/export.h \
         /usr/lib/cmake/fencelock/fencelockConfig.cmake /usr/lib/pkgconfig/fencelock-client.pc; do
  grep -qx "$f" "$work/client.list" || fail "the client package has no $f"
done
if grep -E 'libfencelock|/include/' "$work/server.list"; then fail "the server package carries the client's files"; fi
if grep -E '/bin/|systemd|/etc/' "$work/client.list"; then fail "the client package carries the server's files"; fi
if grep -E '_test$|/tests?/|bench|harness|payout' "$work/server.list" "$work/client.list" \
     "$work/python.list"; then
  fail "a package carries a test, benchmark or demo program"
fi

echo "== unpacked into $work/root"
dpkg-deb -x "$server" "$work/root"
dpkg-deb -x "$client" "$work/root"
dpkg-deb -x "$pymodule" "$work/root"
for unit in lockd.service lockd@.service; do
  grep -q '^Restart=on-failure$' "$work/root/usr/lib/systemd/system/$unit" || fail "$unit does not restart on failure"
  for option in NoNewPrivileges=yes ProtectSystem=strict ProtectHome=yes PrivateTmp=yes \
                'CapabilityBoundingSet=$' 'SystemCallFilter=@system-service'; do
    grep -q "^$option" "$work/root/usr/lib/systemd/system/$unit" || fail "$unit has no $option"
  done
done
# Issue 59: the socket's directory exists under ProtectSystem=strict (the flags file puts the
# socket there), and netlink (who a loopback peer is) is allowed.
for unit in lockd.service lockd@.service; do
  grep -q '^RuntimeDirectory=fencelock' "$work/root/usr/lib/systemd/system/$unit" ||
    fail "$unit has no RuntimeDirectory=fencelock"
  grep -q '^RestrictAddressFamilies=.*AF_NETLINK' "$work/root/usr/lib/systemd/system/$unit" ||
    fail "$unit refuses AF_NETLINK: lockd could not tell local users apart"
done
grep -qx -- '--unix-socket=/run/fencelock/lockd.sock' "$work/root/etc/fencelock/lockd.flags" ||
  fail "the flags file's socket is not in lockd.service's RuntimeDirectory"
grep -q -- '--exit-on-depose' "$work/root/usr/lib/systemd/system/lockd@.service" ||
  fail "lockd@.service does not exit on depose (its restart is what stands a replica by again)"
# verify checks that ExecStart= names an executable: the copies it reads name the unpacked
# lockd (nothing is installed in /usr/bin here); a template is verified as an instance. It
# exits 0 on an unknown key, so any line it prints fails the test.
mkdir -p "$work/units"
sed "s|/usr/bin/lockd|$work/root/usr/bin/lockd|" "$work/root/usr/lib/systemd/system/lockd.service" \
  > "$work/units/lockd.service"
sed "s|/usr/bin/lockd|$work/root/usr/bin/lockd|" "$work/root/usr/lib/systemd/system/lockd@.service" \
  > "$work/units/lockd@replica1.service"
if ! SYSTEMD_LOG_LEVEL=notice systemd-analyze verify "$work/units/lockd.service" \
       "$work/units/lockd@replica1.service" > "$work/verify.log" 2>&1; then
  cat "$work/verify.log"
  fail "systemd-analyze verify"
fi
if [ -s "$work/verify.log" ]; then cat "$work/verify.log"; fail "systemd-analyze verify printed warnings"; fi
echo "systemd-analyze verify: both units clean"
# The hardening may not weaken: systemd's own exposure score, at most 1.7 (issue 59's figure).
for unit in lockd.service lockd@replica1.service; do
  exposure="$(systemd-analyze security --offline=yes --no-pager "$work/units/$unit" 2>&1 |
              sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p')"
  [ -n "$exposure" ] || fail "systemd-analyze security gave no exposure for $unit"
  awk -v e="$exposure" 'BEGIN { exit !(e <= 1.7) }' ||
    fail "$unit: systemd-analyze security exposure $exposure, above 1.7"
  echo "systemd-analyze security: $unit exposure $exposure"
done

echo "== the packaged lockd, with the packaged flags file"
"$work/root/usr/bin/lockd" init --flagfile="$work/root/etc/fencelock/lockd.flags" \
  --data-dir="$work/state" > "$work/init.log" 2>&1 || { cat "$work/init.log"; fail "lockd init"; }
# The flags after --flagfile move what a test cannot use (the state directory, the ports).
start_lockd "$work/root/usr/bin/lockd" --flagfile="$work/root/etc/fencelock/lockd.flags" \
  --data-dir="$work/state" --metrics-port=0 --admission-lock="$work/admission.lock" \
  --unix-socket="$work/lockd.sock"
"$work/root/usr/bin/lockctl" --server="127.0.0.1:$port" status > "$work/status.txt" 2>&1 ||
  { cat "$work/status.txt"; fail "the packaged lockctl could not read lockd's status"; }

echo "== examples/consumer against the unpacked client package"
cmake -S "$src/examples/consumer" -B "$work/consumer" -DCMAKE_PREFIX_PATH="$work/root/usr" \
  > "$work/configure.log" 2>&1 || { cat "$work/configure.log"; fail "configuring the consumer"; }
cmake --build "$work/consumer" > "$work/build.log" 2>&1 ||
  { cat "$work/build.log"; fail "building the consumer"; }
LD_LIBRARY_PATH="$work/root/usr/lib" "$work/consumer/consumer" "127.0.0.1:$port" ||
  fail "the consumer failed its lock cycle"
grep -q "$work/root/usr/lib/libfencelock-client" <<< "$(ldd "$work/consumer/consumer")" ||
  fail "the consumer did not load the packaged library"

echo "== the Python module, from the package and from cmake --install"
PYTHONPATH="$work/root/usr/lib/python3/dist-packages" "$python" -c \
  "import sys, fencelock; c = fencelock.Client(server=sys.argv[1]); l = c.acquire('py', wait=5); print('python3-fencelock: token', l.token); l.release()" \
  "127.0.0.1:$port" || fail "the packaged Python module did not take a lock"
cmake --install "$build" --prefix "$work/prefix" --component python > "$work/install.log"
# Issue 59: an install under a prefix keeps the configuration under it (GNUInstallDirs).
cmake --install "$build" --prefix "$work/prefix" --component server > "$work/install-server.log" ||
  { cat "$work/install-server.log"; fail "cmake --install --prefix --component server"; }
[ -f "$work/prefix/etc/fencelock/lockd.flags" ] ||
  fail "cmake --install --prefix P put the flags files outside P/etc"
[ -f "$work/root/etc/fencelock/lockd.flags" ] || fail "the package's flags file is not in /etc"
PYTHONPATH="$work/prefix/lib/python3/dist-packages" "$python" -c 'import fencelock' ||
  fail "import fencelock after cmake --install --component python"
echo "PASS: the packages built, their contents and units checked, a lockd served from them, the consumer built and the Python module imported from them"
