# Shared by the README's two commands. Sourced, not run.
set -euo pipefail

FENCELOCK_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
JOBS="${JOBS:-2}"

# Debian packages the build, the tests and the demo need.
FENCELOCK_PACKAGES=(
  g++ cmake ninja-build ccache pkg-config
  libabsl-dev libboost-dev libprotobuf-dev protobuf-compiler
  googletest libgtest-dev libgmock-dev libbenchmark-dev libsqlite3-dev
  prometheus faketime openssl libssl-dev
  etcd-server etcd-client libgrpc++-dev protobuf-compiler-grpc libhiredis-dev libspdlog-dev
  clang libclang-rt-14-dev
  python3
  libfuse3-dev fuse3
  nlohmann-json3-dev
  dpkg-dev systemd
  python3-dev python3-pybind11
)

say() { printf '\n==> %s\n' "$*"; }

# Installs whatever in FENCELOCK_PACKAGES, and the packages named as arguments, is missing;
# does nothing when all are present.
ensure_packages() {
  local wanted=("${FENCELOCK_PACKAGES[@]}" "$@")
  local missing=()
  for p in "${wanted[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
      missing+=("$p")
  done
  if [ ${#missing[@]} -eq 0 ]; then
    say "all ${#wanted[@]} Debian packages already installed"
    return
  fi
  say "installing missing Debian packages: ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
}

# build_tree DIR [extra cmake args...]: configures (once) and builds DIR with Ninja: all of it,
# or only the targets FENCELOCK_TARGETS names (and what they need).
build_tree() {
  local dir="$1"
  shift
  say "configuring $dir $*"
  cmake -S "$FENCELOCK_ROOT" -B "$FENCELOCK_ROOT/$dir" -G Ninja "$@" > /dev/null
  if [ -n "${FENCELOCK_TARGETS:-}" ]; then
    say "building $FENCELOCK_TARGETS and what it needs in $dir with $JOBS jobs"
    # shellcheck disable=SC2086  # a list of target names
    cmake --build "$FENCELOCK_ROOT/$dir" -j "$JOBS" --target $FENCELOCK_TARGETS
  else
    say "building $dir with $JOBS jobs"
    cmake --build "$FENCELOCK_ROOT/$dir" -j "$JOBS"
  fi
}
