#!/usr/bin/env bash
# End-to-end tests: drive the real kvchat binary the way a user does and check its output.
# Env: KVCHAT_BIN (./kvchat), KVCHAT_SHARED (../shared), E2E (a glob of the files to run, e.g.
# `make e2e E2E=serve*` runs t_serve*.sh; default every file). Prints "N passed, N failed".
set -u
BIN=${KVCHAT_BIN:-./kvchat}
SHARED=${KVCHAT_SHARED:-../shared}
MODEL=$SHARED/models/stories260K.gguf
here=$(cd "$(dirname "$0")" && pwd)
pass=0
fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# the tests never read or write the user's own config file, models, conversations or history
export XDG_CONFIG_HOME="$tmp/xdg/config" XDG_DATA_HOME="$tmp/xdg/data" XDG_STATE_HOME="$tmp/xdg/state"
unset KVCHAT_MODEL KVCHAT_DB

ok() { pass=$((pass + 1)); echo "ok   - $1"; }
bad() { fail=$((fail + 1)); echo "FAIL - $1"; [ $# -gt 1 ] && echo "       $2"; }

for t in "$here"/t_${E2E:-*}.sh; do
    [ -e "$t" ] || { bad "no e2e file matches t_${E2E:-*}.sh"; continue; }
    e2e_file=$(basename "$t") e2e_file_t0=$(date +%s) # the files use t, s … themselves
    # shellcheck source=/dev/null
    . "$t"
    echo "# $e2e_file: $(($(date +%s) - e2e_file_t0)) s"
done

# a file that needs another's helpers (t_chat*.sh use t_chat.sh's chat_start) checks nothing alone
[ $((pass + fail)) -gt 0 ] || bad "no check ran for E2E='${E2E:-*}' (t_chat_*.sh need t_chat.sh: E2E='chat*')"
echo "e2e: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
