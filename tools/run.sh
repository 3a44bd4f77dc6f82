#!/usr/bin/env bash
# `make run`: the desktop app where a display is available (macOS, or Linux with X11/Wayland), else
# the web UI served by `tandem serve` (its address is printed). Builds what is missing first.
# TANDEM_HEADLESS=1 serves the web UI even where there is a display; arguments go to `tandem serve`.
set -euo pipefail
cd "$(dirname "$0")/.."
has_display() {
  [ -z "${TANDEM_HEADLESS:-}" ] && { [ "$(uname -s)" = Darwin ] || [ -n "${DISPLAY:-}" ] || [ -n "${WAYLAND_DISPLAY:-}" ]; }
}
build_ui() {
  [ -f ui/package.json ] || return 0
  if [ ! -f ui/dist/index.html ] || [ -n "$(find ui/src ui/index.html ui/package.json ui/vite.config.ts -newer ui/dist/index.html -print -quit)" ]; then
    echo "Building the web UI..."
    (cd ui && npm run build --silent)
  fi
}

build_ui
if has_display && [ -f src-tauri/Cargo.toml ]; then
  echo "Starting the Tandem desktop app (the engine and its API run inside it; the tray icon shows it)..."
  cargo build --release -p tandem-desktop
  exec target/release/tandem-desktop
fi
echo "No display (or TANDEM_HEADLESS is set): serving the web UI instead."
cargo build --release --bin tandem
exec target/release/tandem serve "$@"
