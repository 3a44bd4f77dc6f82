#!/usr/bin/env bash
# Every test, in the order that fails fastest. Called by `make test` after `make setup`.
set -euo pipefail
cd "$(dirname "$0")/.."
export TANDEM_PYTHON="${TANDEM_PYTHON:-$PWD/.venv/bin/python}"

echo "== Rust: format =="
cargo fmt --all --check

echo "== Rust: clippy (warnings are errors) =="
cargo clippy --workspace --all-targets --quiet -- -D warnings

echo "== Rust: unit and integration tests (crates/mlx, engine, server) =="
cargo test --workspace --no-fail-fast

if [ -f ui/package.json ]; then
  echo "== UI: types (tsc --noEmit, against the types generated from Rust) =="
  (cd ui && npx tsc --noEmit -p .)
  echo "== UI: unit tests =="
  (cd ui && npm test --silent)
fi

if [ -f tests/e2e/run.sh ]; then
  echo "== Browser end-to-end tests =="
  bash tests/e2e/run.sh
fi

if [ -f tests/desktop/run.sh ]; then
  echo "== Desktop smoke test =="
  bash tests/desktop/run.sh
fi

if [ -f tests/desktop/package.sh ]; then
  echo "== Linux package: the .deb, unpacked and run =="
  bash tests/desktop/package.sh
fi
