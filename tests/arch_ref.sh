#!/bin/sh
# Regenerate tests/arch-ref/*.json: reference logits of llama.cpp (the npm build, node-llama-cpp) for
# the synthetic model of each newer architecture (see tests/arch_ref.mjs). Installs node-llama-cpp
# once under ${KVCHAT_REF_DIR:-/tmp/kvchat-ref}, as ../shared/bench/llamacpp-bench.sh does.
# usage: tests/arch_ref.sh [case ...]   (run from the repository root after `make`)
#        tests/arch_ref.sh --install       (only install node-llama-cpp; prints its folder)
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
ref=${KVCHAT_REF_DIR:-/tmp/kvchat-ref}
if [ ! -d "$ref/node_modules/node-llama-cpp" ]; then
  mkdir -p "$ref" && cd "$ref" && { [ -f package.json ] || npm init -y >/dev/null; }
  cd "$ref" && NODE_LLAMA_CPP_SKIP_DOWNLOAD=true npm install --silent --omit=optional \
    node-llama-cpp@3.22.1 @node-llama-cpp/linux-x64@3.22.1 >/dev/null 2>&1
fi
[ "${1:-}" = --install ] && { echo "$ref"; exit 0; }
cp "$root/tests/arch_ref.mjs" "$ref/"
cd "$ref" && exec node arch_ref.mjs "$root/kvchat" "$root/tests/arch-ref" "$@"
