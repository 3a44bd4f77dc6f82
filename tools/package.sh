#!/usr/bin/env bash
# `make package`: the desktop app as this platform's bundle, built by the Tauri CLI (prebuilt, from
# npm: tools/package/, installed by `make setup-package`), with MLX carried inside:
#   Linux: a .deb and an AppImage (target/<profile>/bundle/deb/, .../appimage/); the binary is
#          usr/bin/Tandem, libmlx.so and the wheel's BLAS/LAPACK in usr/lib/Tandem/ (mlx/lib/,
#          mlx_cpu.libs/), found through the binary's RUNPATH $ORIGIN/../lib/Tandem/mlx/lib;
#   macOS: Tandem.app and a .dmg (target/<profile>/bundle/macos/, .../dmg/); libmlx.dylib and
#          mlx.metallib side by side in Contents/Resources/mlx/lib, the rpath
#          @executable_path/../Resources/mlx/lib.
# The bundles also carry the web UI and the bundled model; the packaged app keeps its models.toml in
# ~/.tandem/ (written on first start). Arguments go to `tauri build`: `--debug` bundles the dev
# profile (what the tests use: it reuses `cargo build`'s output), `--bundles deb` only the .deb.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
TAURI=$ROOT/tools/package/node_modules/.bin/tauri
[ -x "$TAURI" ] || { echo "package: the Tauri CLI is not installed (make setup-package)" >&2; exit 1; }

case "$(uname -s)" in
  Darwin) lib=.mlx/wheel/mlx/lib/libmlx.dylib
          [ -f .mlx/wheel/mlx/lib/mlx.metallib ] || { echo "package: .mlx/wheel/mlx/lib/mlx.metallib is missing (make setup)" >&2; exit 1; } ;;
  *)      lib=.mlx/wheel/mlx/lib/libmlx.so
          # tauri.linux.conf.json carries the CPU wheel's libraries; the CUDA wheel's come from other
          # pip packages, which the package does not carry.
          [ -d .mlx/wheel/mlx_cpu.libs ] || { echo "package: only the CPU build of MLX (the mlx-cpu wheel) is packaged on Linux" >&2; exit 1; } ;;
esac
[ -f "$lib" ] || { echo "package: $lib is missing (make setup)" >&2; exit 1; }

if [ ! -f ui/dist/index.html ] || [ -n "$(find ui/src ui/index.html ui/package.json ui/vite.config.ts -newer ui/dist/index.html -print -quit)" ]; then
  echo "package: building the UI"
  (cd ui && npm run build --silent)
fi

profile=release
for a in "$@"; do [ "$a" = --debug ] && profile=debug; done
start=$(date +%s)
echo "package: tauri build $*"
(cd src-tauri && "$TAURI" build --ci "$@")
echo "package: built in $(( $(date +%s) - start )) s:"
find "target/$profile/bundle" -maxdepth 2 \( -name '*.deb' -o -name '*.AppImage' -o -name '*.app' -o -name '*.dmg' \) -newermt "@$start" -print | sed 's/^/  /'
