#!/usr/bin/env bash
# Desktop smoke test: builds the Tauri app (src-tauri, the workspace's dev profile, so it reuses what
# `cargo test --workspace` compiled), starts it under Xvfb with a throwaway models.toml, waits for
# the window to load the UI from the in-process server, takes a screenshot (target/desktop/), checks
# that the window rendered a page (not a blank frame), that the in-process server answers
# /api/health and serves the UI, then drives the tray menu over D-Bus (tray.py: model, live tok/s,
# memory, load, unload, quit) and checks that Quit ends the app cleanly; before the tray, a second
# launch, which must exit and focus the first window (x11.py counts the windows and reads the focus);
# last, starts it on a broken models.toml and checks that the window shows the error
# (target/desktop/startup-error.png).
# Called by tools/test.sh; runs alone too: `bash tests/desktop/run.sh`.
set -euo pipefail
if [ "$(uname -s)" = Darwin ]; then
  echo "desktop: skipped on macOS (this smoke test runs the Linux build under Xvfb)"
  exit 0
fi
# A private D-Bus session: the tray icon's menu is exported on it, and tray.py drives it there.
if [ -z "${TANDEM_DESKTOP_BUS:-}" ]; then
  command -v dbus-run-session >/dev/null || { echo "desktop: dbus-run-session not found (Debian package dbus-daemon)" >&2; exit 1; }
  TANDEM_DESKTOP_BUS=1 exec dbus-run-session -- bash "$0" "$@"
fi
cd "$(dirname "$0")/../.."
ROOT=$PWD
OUT=$ROOT/target/desktop
mkdir -p "$OUT"
for tool in Xvfb xwd python3 gdbus; do
  command -v "$tool" >/dev/null || { echo "desktop: $tool not found (make setup installs xvfb, x11-apps and libglib2.0-bin)" >&2; exit 1; }
done

if [ ! -f ui/dist/index.html ] || [ -n "$(find ui/src ui/index.html ui/package.json ui/vite.config.ts -newer ui/dist/index.html -print -quit)" ]; then
  echo "desktop: building the UI"
  [ -d ui/node_modules ] || (cd ui && npm ci --no-audit --no-fund --loglevel=error)
  (cd ui && npm run build --silent)
fi
echo "desktop: building the app (cargo build -p tandem-desktop)"
start=$(date +%s)
cargo build -p tandem-desktop --quiet
echo "desktop: built in $(( $(date +%s) - start )) s"
APP=$ROOT/target/debug/tandem-desktop

WORK=$(mktemp -d "${TMPDIR:-/tmp}/tandem-desktop.XXXXXX")
XVFB_PID= APP_PID= SECOND_PID=
cleanup() {
  for pid in $SECOND_PID $APP_PID $XVFB_PID; do
    if kill -0 "$pid" 2>/dev/null; then
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
    fi
  done
  rm -rf "$WORK"
}
trap cleanup EXIT INT TERM
fail() {
  echo "desktop: $*" >&2
  [ -f "$WORK/app.log" ] && { echo "--- the app's log:" >&2; tail -n 60 "$WORK/app.log" >&2; cp "$WORK/app.log" "$OUT/app.log"; }
  exit 1
}

mkdir -p "$WORK/models"
cat > "$WORK/models.toml" <<TOML
models_dir = "$WORK/models"
default = "tandem-tiny"

[[model]]
name = "tandem-tiny"
path = "$ROOT/assets/models/tandem-tiny"
TOML

# Xvfb picks a free display and writes its number to fd 3.
Xvfb -displayfd 3 -screen 0 1280x860x24 -nolisten tcp 3>"$WORK/display" 2>"$WORK/xvfb.log" &
XVFB_PID=$!
for _ in $(seq 100); do [ -s "$WORK/display" ] && break; sleep 0.1; done
[ -s "$WORK/display" ] || fail "Xvfb did not start: $(cat "$WORK/xvfb.log")"
export DISPLAY=":$(head -1 "$WORK/display")"
xwd -root -silent >"$WORK/blank.xwd"

# Software rendering only (no GPU here). TANDEM_PORT=0: a free port, not 11435.
TANDEM_CONFIG="$WORK/models.toml" TANDEM_UI_DIR="$ROOT/ui/dist" TANDEM_PORT=0 \
  WEBKIT_DISABLE_COMPOSITING_MODE=1 WEBKIT_DISABLE_DMABUF_RENDERER=1 LIBGL_ALWAYS_SOFTWARE=1 NO_AT_BRIDGE=1 \
  "$APP" >"$WORK/app.log" 2>&1 &
APP_PID=$!

URL=
for _ in $(seq 600); do   # at most 60 s
  kill -0 "$APP_PID" 2>/dev/null || fail "the app exited"
  URL=$(grep -o 'serving on http://127\.0\.0\.1:[0-9]*' "$WORK/app.log" | head -1 | sed 's/^serving on //' || true)
  [ -n "$URL" ] && grep -q "window loaded $URL" "$WORK/app.log" && break
  sleep 0.1
done
[ -n "$URL" ] || fail "the app did not start its server within 60 s"
grep -q "window loaded $URL" "$WORK/app.log" || fail "the window did not load $URL within 60 s"
echo "desktop: the window loaded $URL"

# The in-process server: health, and the UI it serves to the window.
python3 - "$URL" <<'PY' || fail "the in-process server did not answer"
import json, sys, urllib.error, urllib.request
url = sys.argv[1]
with urllib.request.urlopen(url + "/api/health", timeout=10) as r:
    assert r.status == 200, r.status
    print("desktop: /api/health ->", r.status, r.read(200).decode(errors="replace"))
with urllib.request.urlopen(url + "/", timeout=10) as r:
    page = r.read().decode(errors="replace")
    assert "<title>Tandem" in page and "assets/" in page, "the server does not serve the built UI"
with urllib.request.urlopen(url + "/v1/models", timeout=10) as r:
    ids = [m["id"] for m in json.load(r)["data"]]
    assert "tandem-tiny" in ids, ids
# The app has a folder dialog, which only its window (holding the shell's token) may open.
for token in (None, "a-guess"):
    headers = {"Content-Type": "application/json"}
    if token:
        headers["X-Tandem-Shell"] = token
    req = urllib.request.Request(url + "/api/folders/pick", data=b"{}", headers=headers, method="POST")
    try:
        urllib.request.urlopen(req, timeout=10)
        raise AssertionError("the folder dialog opened without the window's token")
    except urllib.error.HTTPError as e:
        body = json.load(e)
        assert e.code == 403 and body["error"]["code"] == "not_the_app", (e.code, body)
print("desktop: the folder dialog refuses callers without the window's token")
PY

# The page paints a moment after it loads, then again once its first API answers arrive: poll the
# screen until it shows a rendered page that has stopped changing (two equal frames a second apart).
verdict= settled=
for _ in $(seq 60); do   # at most about 60 s
  xwd -root -silent >"$WORK/frame.xwd"
  if verdict=$(python3 tests/desktop/screen.py --png "$OUT/window.png" --baseline "$WORK/blank.xwd" "$WORK/frame.xwd") \
     && [ -f "$WORK/previous.xwd" ] && cmp -s "$WORK/frame.xwd" "$WORK/previous.xwd"; then
    settled=1
    break
  fi
  mv "$WORK/frame.xwd" "$WORK/previous.xwd"
  sleep 1
done
echo "desktop: screenshot $OUT/window.png: $verdict"
case "$verdict" in *'"rendered": true'*) ;; *) fail "the window looks blank" ;; esac
[ -n "$settled" ] || echo "desktop: (the window was still changing after 60 s)"
kill -0 "$APP_PID" 2>/dev/null || fail "the app exited"

# One instance: a second launch hands over to the first (over D-Bus) and exits without starting an
# engine; the first shows and focuses its window, and there is still one window and one server.
[ "$(python3 tests/desktop/x11.py windows Tandem)" = 1 ] || fail "not one Tandem window before the second launch"
python3 tests/desktop/x11.py unfocus
[ -z "$(python3 tests/desktop/x11.py focus)" ] || fail "the focus could not be taken from the window"
servers=$(grep -c 'serving on' "$WORK/app.log")
TANDEM_CONFIG="$WORK/models.toml" TANDEM_UI_DIR="$ROOT/ui/dist" TANDEM_PORT=0 \
  WEBKIT_DISABLE_COMPOSITING_MODE=1 WEBKIT_DISABLE_DMABUF_RENDERER=1 LIBGL_ALWAYS_SOFTWARE=1 NO_AT_BRIDGE=1 \
  "$APP" >"$WORK/second.log" 2>&1 &
SECOND_PID=$!
for _ in $(seq 200); do kill -0 "$SECOND_PID" 2>/dev/null || break; sleep 0.1; done   # at most 20 s
if kill -0 "$SECOND_PID" 2>/dev/null; then
  kill "$SECOND_PID"; cat "$WORK/second.log" >&2; fail "a second launch was still running after 20 s"
fi
status=0; wait "$SECOND_PID" || status=$?
[ "$status" = 0 ] || { cat "$WORK/second.log" >&2; fail "the second launch exited with status $status"; }
if grep -q 'serving on\|starting Tandem' "$WORK/second.log"; then
  cat "$WORK/second.log" >&2; fail "the second launch started an engine of its own"
fi
for _ in $(seq 100); do grep -q "another launch of Tandem" "$WORK/app.log" && break; sleep 0.1; done
grep -q "another launch of Tandem" "$WORK/app.log" || fail "the first instance did not hear of the second launch"
focused=
for _ in $(seq 50); do focused=$(python3 tests/desktop/x11.py focus); [ "$focused" = Tandem ] && break; sleep 0.1; done
[ "$focused" = Tandem ] || fail "the first window was not focused after the second launch (focus: '$focused')"
windows=$(python3 tests/desktop/x11.py windows Tandem)
[ "$windows" = 1 ] || fail "$windows Tandem windows after a second launch"
[ "$(grep -c 'serving on' "$WORK/app.log")" = "$servers" ] || fail "the first instance started a second server"
python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + "/api/health", timeout=10)' "$URL" \
  || fail "the first instance stopped answering after the second launch"
kill -0 "$APP_PID" 2>/dev/null || fail "the app exited after a second launch"
echo "desktop: a second launch exited (status 0) and focused the first window; one window, one server"

# The tray menu, as a desktop's indicator host sees it; its last click is Quit.
python3 tests/desktop/tray.py --pid "$APP_PID" --url "$URL" || fail "the tray menu check failed"
for _ in $(seq 200); do kill -0 "$APP_PID" 2>/dev/null || break; sleep 0.1; done   # at most 20 s
kill -0 "$APP_PID" 2>/dev/null && fail "the app did not quit within 20 s of Quit Tandem"
status=0; wait "$APP_PID" || status=$?
APP_PID=
[ "$status" = 0 ] || fail "the app quit with status $status"
echo "desktop: Quit Tandem ended the app (status 0)"

cp "$WORK/app.log" "$OUT/app.log"

# A models.toml the engine refuses: the window shows why instead of never appearing.
printf 'models_dirr = "typo"\n' >"$WORK/broken.toml"
TANDEM_CONFIG="$WORK/broken.toml" TANDEM_PORT=0 \
  WEBKIT_DISABLE_COMPOSITING_MODE=1 WEBKIT_DISABLE_DMABUF_RENDERER=1 LIBGL_ALWAYS_SOFTWARE=1 NO_AT_BRIDGE=1 \
  "$APP" >"$WORK/app.log" 2>&1 &
APP_PID=$!
for _ in $(seq 300); do   # at most 30 s
  grep -q "(the startup error)" "$WORK/app.log" && break
  kill -0 "$APP_PID" 2>/dev/null || fail "the app exited on a broken models.toml instead of showing why"
  sleep 0.1
done
grep -q "(the startup error)" "$WORK/app.log" || fail "no startup error page within 30 s"
grep -q "unknown field \`models_dirr\`" "$WORK/app.log" || fail "the startup error does not name the bad key"
sleep 1
xwd -root -silent >"$WORK/error.xwd"
verdict=$(python3 tests/desktop/screen.py --png "$OUT/startup-error.png" --baseline "$WORK/blank.xwd" "$WORK/error.xwd") \
  || fail "the startup error window looks blank: $verdict"
cp "$WORK/app.log" "$OUT/startup-error.log"
echo "desktop: a broken models.toml shows its error in the window: $OUT/startup-error.png"
echo "desktop: ok"
