#!/usr/bin/env bash
# The Linux package, installed and run: builds the .deb with the Tauri CLI (`tools/package.sh --debug
# --bundles deb`: the dev profile, so it reuses `cargo build`'s output), unpacks it with dpkg-deb -x
# (no root needed) and checks its layout: usr/bin/Tandem, and in usr/lib/Tandem/ libmlx.so with the
# wheel's BLAS/LAPACK, the web UI and the bundled model; that the binary's RUNPATH is relative to
# itself (no build-tree path) and ldd finds libmlx in the package; then starts the unpacked app
# under Xvfb, away from the checkout (its own HOME, no TANDEM_CONFIG or TANDEM_UI_DIR), and checks
# that it maps libmlx from the package, writes ~/.tandem/models.toml naming the bundled model,
# serves the UI from its resources, answers a chat with that model, and shows a rendered window
# (target/desktop/package.png).
# `make test` runs it after the desktop smoke test (tools/test.sh), whose build it reuses: about 25 s
# then; `make package-test` runs it alone.
set -euo pipefail
if [ "$(uname -s)" = Darwin ]; then
  echo "package: skipped on macOS (this test runs the Linux .deb under Xvfb)"
  exit 0
fi
if [ -z "${TANDEM_DESKTOP_BUS:-}" ]; then
  command -v dbus-run-session >/dev/null || { echo "package: dbus-run-session not found (Debian package dbus-daemon)" >&2; exit 1; }
  TANDEM_DESKTOP_BUS=1 exec dbus-run-session -- bash "$0" "$@"
fi
cd "$(dirname "$0")/../.."
ROOT=$PWD
OUT=$ROOT/target/desktop
mkdir -p "$OUT"
for tool in Xvfb xwd python3 dpkg-deb readelf ldd; do
  command -v "$tool" >/dev/null || { echo "package: $tool not found" >&2; exit 1; }
done

start=$(date +%s)
bash tools/package.sh --debug --bundles deb
DEB=$(ls -t target/debug/bundle/deb/*.deb | head -1)
echo "package: $DEB ($(du -h "$DEB" | cut -f1)), built in $(( $(date +%s) - start )) s"

WORK=$(realpath "$(mktemp -d "${TMPDIR:-/tmp}/tandem-package.XXXXXX")")
case "$WORK" in "$ROOT"/*) echo "package: the scratch folder must lie outside the checkout" >&2; exit 1 ;; esac
XVFB_PID= APP_PID=
cleanup() {
  for pid in $APP_PID $XVFB_PID; do
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
  echo "package: $*" >&2
  [ -f "$WORK/app.log" ] && { echo "--- the app's log:" >&2; tail -n 60 "$WORK/app.log" >&2; cp "$WORK/app.log" "$OUT/package-app.log"; }
  exit 1
}

# The package's metadata and layout.
dpkg-deb -f "$DEB" Package Version Architecture Depends | sed 's/^/package:   /'
dpkg-deb -f "$DEB" Depends | grep -q 'libwebkit2gtk-4.1-0' || fail "the package does not depend on WebKitGTK"
PKG=$WORK/root
dpkg-deb -x "$DEB" "$PKG"
APP=$PKG/usr/bin/Tandem
RES=$PKG/usr/lib/Tandem
for f in "$APP" "$RES/mlx/lib/libmlx.so" "$RES/ui/dist/index.html" "$RES/models/tandem-tiny/config.json" \
         "$RES/models/tandem-tiny/model.safetensors" "$PKG/usr/share/applications/Tandem.desktop"; do
  [ -f "$f" ] || fail "the package has no ${f#"$PKG"}"
done
[ -n "$(ls "$RES"/mlx_cpu.libs/)" ] || fail "the package has no usr/lib/Tandem/mlx_cpu.libs/ (libmlx's BLAS and LAPACK)"
[ -z "$(find "$PKG" -type l)" ] || fail "the package holds links: $(find "$PKG" -type l | head -3)"

# RUNPATH: every entry relative to the binary; none into the build tree.
runpath=$(readelf -d "$APP" | sed -n 's/.*(RUNPATH).*\[\(.*\)\]/\1/p; s/.*(RPATH).*\[\(.*\)\]/\1/p')
echo "package: RUNPATH of usr/bin/Tandem: $runpath"
[ -n "$runpath" ] || fail "usr/bin/Tandem has no RUNPATH"
IFS=: read -ra entries <<<"$runpath"
for p in "${entries[@]}"; do
  case "$p" in '$ORIGIN'*) ;; *) fail "RUNPATH entry $p is not relative to the binary" ;; esac
done
case "$runpath" in *"$ROOT"*|*/target/*) fail "RUNPATH names the build tree: $runpath" ;; esac
deps=$(env -u LD_LIBRARY_PATH ldd "$APP")
mlx=$(grep 'libmlx\.so' <<<"$deps" | awk '{print $3}')
[ "$(realpath "$mlx" 2>/dev/null)" = "$RES/mlx/lib/libmlx.so" ] || fail "ldd finds libmlx at '$mlx', not in the package"
grep -q 'not found' <<<"$deps" && fail "libraries not found: $(grep 'not found' <<<"$deps")"
for lib in $(ldd "$RES/mlx/lib/libmlx.so" | grep -- '-[0-9a-f]\{8\}\.so' | awk '{print $3}'); do
  case "$(realpath "$lib")" in "$(realpath "$RES")"/*) ;; *) fail "libmlx's $lib is not the package's" ;; esac
done
echo "package: ldd finds $mlx"

# The unpacked app, started as a person would start it: no checkout around it.
mkdir -p "$WORK/home"
Xvfb -displayfd 3 -screen 0 1280x860x24 -nolisten tcp 3>"$WORK/display" 2>"$WORK/xvfb.log" &
XVFB_PID=$!
for _ in $(seq 100); do [ -s "$WORK/display" ] && break; sleep 0.1; done
[ -s "$WORK/display" ] || fail "Xvfb did not start: $(cat "$WORK/xvfb.log")"
export DISPLAY=":$(head -1 "$WORK/display")"
xwd -root -silent >"$WORK/blank.xwd"
(cd "$WORK" && exec env -u TANDEM_CONFIG -u TANDEM_UI_DIR -u LD_LIBRARY_PATH HOME="$WORK/home" TANDEM_PORT=0 \
  WEBKIT_DISABLE_COMPOSITING_MODE=1 WEBKIT_DISABLE_DMABUF_RENDERER=1 LIBGL_ALWAYS_SOFTWARE=1 NO_AT_BRIDGE=1 \
  "$APP" >"$WORK/app.log" 2>&1) &
APP_PID=$!
URL=
for _ in $(seq 600); do   # at most 60 s
  kill -0 "$APP_PID" 2>/dev/null || fail "the packaged app exited"
  URL=$(grep -o 'serving on http://127\.0\.0\.1:[0-9]*' "$WORK/app.log" | head -1 | sed 's/^serving on //' || true)
  [ -n "$URL" ] && grep -q "window loaded $URL" "$WORK/app.log" && break
  sleep 0.1
done
[ -n "$URL" ] || fail "the packaged app did not start its server within 60 s"
grep -q "window loaded $URL" "$WORK/app.log" || fail "the packaged app's window did not load $URL within 60 s"
echo "desktop: the packaged app's window loaded $URL"

# The process itself: the libmlx it mapped, the registry it wrote, the UI and model it serves.
# (APP_PID is the subshell that exec'd the app, so it is the app.)
mapped=$(grep -o '/[^ ]*libmlx\.so[^ ]*' "/proc/$APP_PID/maps" | sort -u)
[ "$(realpath "$mapped")" = "$RES/mlx/lib/libmlx.so" ] || fail "the app mapped libmlx from '$mapped'"
grep -q "/[^ ]*$ROOT/" "/proc/$APP_PID/maps" && fail "the app mapped files from the checkout: $(grep "$ROOT/" "/proc/$APP_PID/maps" | head -3)"
[ -f "$WORK/home/.tandem/models.toml" ] || fail "the packaged app wrote no ~/.tandem/models.toml"
grep -q "$RES/models/tandem-tiny" "$WORK/home/.tandem/models.toml" || fail "~/.tandem/models.toml does not name the bundled model"
python3 - "$URL" <<'PY' || fail "the packaged app's server did not answer"
import json, sys, urllib.request
url = sys.argv[1]
with urllib.request.urlopen(url + "/api/health", timeout=10) as r:
    print("package: /api/health ->", r.status, r.read(200).decode(errors="replace"))
with urllib.request.urlopen(url + "/", timeout=10) as r:
    page = r.read().decode(errors="replace")
    assert "<title>Tandem" in page and "assets/" in page, "the app does not serve the packaged UI"
body = json.dumps({"model": "tandem-tiny", "messages": [{"role": "user", "content": "Hello"}],
                   "max_tokens": 4, "temperature": 0}).encode()
req = urllib.request.Request(url + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"})
with urllib.request.urlopen(req, timeout=120) as r:
    reply = json.load(r)
assert reply["usage"]["completion_tokens"] > 0, reply
print("package: the bundled model answered:", json.dumps(reply["choices"][0]["message"]["content"]))
PY
grep -q "Some(\"$RES/ui/dist\")" "$WORK/app.log" || fail "the app does not serve the UI from its resources"

verdict=
for _ in $(seq 30); do
  xwd -root -silent >"$WORK/frame.xwd"
  verdict=$(python3 tests/desktop/screen.py --png "$OUT/package.png" --baseline "$WORK/blank.xwd" "$WORK/frame.xwd") && break
  sleep 1
done
case "$verdict" in *'"rendered": true'*) ;; *) fail "the packaged app's window looks blank: $verdict" ;; esac
echo "package: screenshot $OUT/package.png: $verdict"
cp "$WORK/app.log" "$OUT/package-app.log"
echo "package: ok ($(( $(date +%s) - start )) s in all)"
