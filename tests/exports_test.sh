#!/usr/bin/env bash
# Issue 41: the installed shared libraries export fencelock's API and nothing else.
#   exports_test.sh CLIENT_SO FENCE_SO METRICS_HTTP_SO
# Every symbol each library defines in its dynamic symbol table (nm -D) must be fencelock's
# (a function or variable in namespace fencelock, or the vtable, typeinfo or thunk of one of
# its classes), none of fencelock's internal namespaces, and the API a consumer calls must be
# there.
set -euo pipefail
client="$1" fence="$2" metrics_http="$3"
failed=0
fail() { echo "FAIL: $*" >&2; failed=1; }

api='^((typeinfo|typeinfo name|vtable|VTT) for |(non-)?virtual thunk to )?fencelock::'
internal='fencelock::(client_core|client_internal|net|wire|protocol|logging|server|runtime)::'
for lib in "$client" "$fence" "$metrics_http"; do
  # Mangled names have no spaces; c++filt reads them one a line.
  symbols="$(nm -D --defined-only "$lib" | awk '{print $3}' | c++filt)"
  count="$(printf '%s\n' "$symbols" | grep -c . || true)"
  others="$(printf '%s\n' "$symbols" | grep -vE "$api" || true)"
  leaked="$(printf '%s\n' "$symbols" | grep -E "$internal" || true)"
  if [ -n "$others" ]; then
    fail "$(basename "$lib") exports symbols that are not fencelock's API:
$(printf '%s\n' "$others" | head -20)"
  elif [ -n "$leaked" ]; then
    fail "$(basename "$lib") exports fencelock's internals:
$(printf '%s\n' "$leaked" | head -20)"
  else
    echo "$(basename "$lib"): $count symbols, all fencelock's API"
  fi
done

expect() {  # expect LIB TEXT: LIB exports a symbol whose demangled name holds TEXT
  local symbols
  symbols="$(nm -D --defined-only "$1" | awk '{print $3}' | c++filt)"
  grep -qF -- "$2" <<< "$symbols" || fail "$(basename "$1") does not export $2"
}
expect "$client" "fencelock::Client::Create(fencelock::ClientOptions const&)"
expect "$client" "typeinfo for fencelock::LockLostException"
expect "$client" "typeinfo for fencelock::StepRefusedException"
expect "$client" "fencelock::PoolClient::Create("
expect "$client" "fencelock::metrics::Registry::TextExposition"
expect "$fence" "fencelock::fence::TokenFence::OpenSqlite("
expect "$fence" "fencelock::fence::AdmitInTransaction("
expect "$metrics_http" "fencelock::metrics::Exposer::Start("
exit "$failed"
