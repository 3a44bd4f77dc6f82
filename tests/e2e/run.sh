#!/usr/bin/env bash
# Browser end-to-end tests: `tandem serve` on a loopback ephemeral port with a throwaway models.toml
# (the bundled model; models_dir and conversations_dir in a temporary folder, so conversions and saved
# chats land there, never in ~/.tandem), and Debian's
# Chromium, headless, driven by playwright-core (tests/e2e/e2e.test.mjs). Screenshots: target/e2e/.
# Called by tools/test.sh; runs alone too: `bash tests/e2e/run.sh`.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
if [ -z "${CHROMIUM:-}" ]; then
  for c in /usr/bin/chromium "/Applications/Chromium.app/Contents/MacOS/Chromium" "/Applications/Google Chrome.app/Contents/MacOS/Google Chrome"; do
    [ -x "$c" ] && { CHROMIUM=$c; break; }
  done
fi
[ -n "${CHROMIUM:-}" ] && [ -x "$CHROMIUM" ] || { echo "e2e: no Chromium found (make setup installs Debian's chromium; elsewhere set CHROMIUM)" >&2; exit 1; }

# playwright-core only: it never downloads a browser.
if [ ! -d tests/e2e/node_modules/playwright-core ] || [ tests/e2e/package-lock.json -nt tests/e2e/node_modules/.package-lock.json ]; then
  (cd tests/e2e && npm ci --no-audit --no-fund --loglevel=error)
fi
# The UI as served: rebuilt when a source is newer than the build.
if [ ! -f ui/dist/index.html ] || [ -n "$(find ui/src ui/index.html ui/package.json ui/vite.config.ts -newer ui/dist/index.html -print -quit)" ]; then
  echo "e2e: building the UI"
  [ -d ui/node_modules ] || (cd ui && npm ci --no-audit --no-fund --loglevel=error)
  (cd ui && npm run build --silent)
fi
# The development build: `cargo test --workspace` (tools/test.sh) has already compiled it with the
# same features, so CI compiles the engine once, not a second time in release. TANDEM_BIN overrides.
if [ -z "${TANDEM_BIN:-}" ]; then
  echo "e2e: building tandem (cargo build --workspace --bins)"
  cargo build --workspace --bins --quiet
fi
BIN=${TANDEM_BIN:-$ROOT/target/debug/tandem}

WORK=$(mktemp -d "${TMPDIR:-/tmp}/tandem-e2e.XXXXXX")
SERVER_PID=
HUB_PID=
cleanup() {
  [ -n "$HUB_PID" ] && kill "$HUB_PID" 2>/dev/null || true
  if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill "$SERVER_PID" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$SERVER_PID" 2>/dev/null || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT INT TERM

mkdir -p "$WORK/models/not-a-model" target/e2e
echo "Notes, not weights." > "$WORK/models/not-a-model/notes.txt"
cat > "$WORK/models.toml" <<TOML
# e2e registry: the bundled model; conversions go to models_dir, saved chats to conversations_dir.
models_dir = "$WORK/models"
conversations_dir = "$WORK/conversations"
default = "tandem-tiny"

[[model]]
name = "tandem-tiny"
path = "$ROOT/assets/models/tandem-tiny"
mtp = { enabled = true, depth = 3 }
sampling = { temperature = 0.0, top_p = 1.0, max_tokens = 200 }

# The Download page's catalogue: tandem/tiny beside the built-in Qwen3.5 repos.
[[catalog]]
repo = "tandem/tiny"
format = "hf"
params_b = 0.00727
bits = 16
mtp = true
TOML

# A mock of the Hugging Face Hub for the Download page (tests/e2e/mock_hub.mjs), serving tandem-tiny and a
# head-less MLX conversion of it (as mlx-lm writes them).
"$BIN" convert "$ROOT/assets/models/tandem-tiny" --out "$WORK/tiny-mlx" --mtp drop >"$WORK/convert.log" 2>&1 \
  || { cat "$WORK/convert.log" >&2; echo "e2e: cannot write the head-less conversion" >&2; exit 1; }
# Its card names its base, as mlx-community's cards do (the Hub's cardData is read from this front matter).
{ printf -- '---\nbase_model: tandem/tiny\nlibrary_name: mlx\n---\n'; cat "$WORK/tiny-mlx/README.md" 2>/dev/null; } > "$WORK/card.md"
mv "$WORK/card.md" "$WORK/tiny-mlx/README.md"
node tests/e2e/mock_hub.mjs "$ROOT/assets/models/tandem-tiny" "$WORK/tiny-mlx" >"$WORK/hub.url" 2>"$WORK/hub.log" &
HUB_PID=$!
for _ in $(seq 100); do [ -s "$WORK/hub.url" ] && break; sleep 0.1; done
HUB_URL=$(head -1 "$WORK/hub.url")
[ -n "$HUB_URL" ] || { cat "$WORK/hub.log" >&2; echo "e2e: the mock Hub did not start" >&2; exit 1; }

TANDEM_CONFIG="$WORK/models.toml" TANDEM_UI_DIR="$ROOT/ui/dist" HF_ENDPOINT="$HUB_URL" HF_HOME="$WORK/hf" \
  HF_HUB_CACHE= HF_TOKEN= HF_HUB_OFFLINE= \
  "$BIN" serve --host 127.0.0.1 --port 0 >"$WORK/server.log" 2>&1 &
SERVER_PID=$!
URL=
for _ in $(seq 300); do   # at most 30 s
  URL=$(grep -o 'http://127\.0\.0\.1:[0-9]*' "$WORK/server.log" | head -1 || true)
  [ -n "$URL" ] && break   # printed once the port is bound
  kill -0 "$SERVER_PID" 2>/dev/null || { cat "$WORK/server.log" >&2; echo "e2e: the server exited" >&2; exit 1; }
  sleep 0.1
done
[ -n "$URL" ] || { cat "$WORK/server.log" >&2; echo "e2e: the server did not answer within 30 s" >&2; exit 1; }
echo "e2e: server at $URL"

status=0
TANDEM_URL="$URL" TANDEM_E2E_WORK="$WORK" TANDEM_TINY="$ROOT/assets/models/tandem-tiny" CHROMIUM="$CHROMIUM" \
  SCREENSHOTS="$ROOT/target/e2e" \
  timeout 900 node --test --test-concurrency=1 --test-reporter=spec tests/e2e/e2e.test.mjs || status=$?
if [ "$status" != 0 ]; then
  echo "e2e: failed ($status); the server's log:" >&2
  tail -n 60 "$WORK/server.log" >&2
fi
echo "e2e: screenshots in target/e2e/"
exit "$status"
