#!/usr/bin/env bash
# The custom kernels (kernels/) on an NVIDIA GPU: parity against MLX's ops and timings
# (benches/gpu/qmm_kernel.py), then, when .devcarry/it.xz is there, the Rust parity tests
# (`cargo test --test it kernels::`, built here against the same MLX version, run with the CUDA libmlx).
# Run on the lent GPU machine from the repository root. It needs what cuda_bench.sh's header describes:
# the mlx-cuda-13 wheel's mlx/ and mlx_cuda_13.libs/ as .devcarry/mlxcuda.tar.xz.part* (tar + xz, split to
# fit the carry limit; a part carried by an earlier call in the same warm machine waits in /tmp/keep) and
# the mlx 0.32.4 wheel. Optional: .devcarry/it.xz, the integration-test binary built here
#   (cargo test --test it --no-run; strip -o /tmp/it the path it prints; xz -9 -c /tmp/it > .devcarry/it.xz:
#   about 4 MB; its RUNPATH yields to LD_LIBRARY_PATH, so it runs with the CUDA libmlx).
# Extra arguments go to qmm_kernel.py. Results go to $OUT (or /tmp/out).
set -euo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p /tmp/site "$OUT" /tmp/keep
cp -n .devcarry/mlxcuda.tar.xz.part* /tmp/keep/ 2>/dev/null || true
if [ ! -e /tmp/site/mlx/lib/libmlx.so ]; then
  cat /tmp/keep/mlxcuda.tar.xz.part* | xz -d | tar x -C /tmp/site
  for w in .devcarry/mlx-*.whl; do python3 -m zipfile -e "$w" /tmp/site; done
fi
export PYTHONPATH=/tmp/site
NV=$(python3 -c 'import nvidia, os; print(os.path.dirname(nvidia.__path__[0]))')/nvidia
export LD_LIBRARY_PATH=/tmp/site/mlx/lib:$(find "$NV" -name 'lib*.so*' -printf '%h\n' | sort -u | paste -sd:)
export MLX_PTX_CACHE_DIR=/tmp/ptx
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/gpu.txt"
PYTHONUNBUFFERED=1 python3 benches/gpu/qmm_kernel.py --out "$OUT" "$@" 2>&1 | tee "$OUT/qmm_kernel.txt"
if [ -e .devcarry/it.xz ]; then
  xz -dc .devcarry/it.xz > /tmp/it && chmod +x /tmp/it
  /tmp/it kernels:: gated_delta_kernel:: --nocapture --test-threads=1 2>&1 | tee "$OUT/rust_kernels.txt"
fi
