#!/usr/bin/env bash
# `make run`: the desktop app where a display is available, otherwise the web UI served by `tandem serve`.
set -euo pipefail
cd "$(dirname "$0")/.."
has_display() { [ "$(uname -s)" = Darwin ] || [ -n "${DISPLAY:-}" ] || [ -n "${WAYLAND_DISPLAY:-}" ]; }

if has_display && [ -f src-tauri/Cargo.toml ]; then
  echo "Starting the Tandem desktop app..."
  [ -f ui/package.json ] && (cd ui && npm run build --silent)
  exec cargo run --release --manifest-path src-tauri/Cargo.toml
fi
echo "No display found: serving the web UI instead."
[ -f ui/package.json ] && (cd ui && npm run build --silent)
cargo build --release --bin tandem
exec target/release/tandem serve "$@"
