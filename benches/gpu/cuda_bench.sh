#!/usr/bin/env bash
# Tandem on an NVIDIA GPU (MLX's CUDA backend): `tandem bench` and benches/vs_mlx_lm.py on tandem-tiny and
# on a Qwen3.5-2B-shaped random checkpoint (benches/gpu/random_qwen35.py). Run on the lent GPU machine,
# from the repository root, with .devcarry/ holding: mlxcuda.tar.xz.part* (the mlx-cuda-13 wheel's mlx/ and
# mlx_cuda_13.libs/, tar + xz, split to fit the carry limit), tandem.xz (target/release/tandem built here
# against the same MLX version), and the mlx and mlx-lm wheels. Results go to $OUT (or /tmp/out).
set -euo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p /tmp/site "$OUT" target/release
# The parts may come in separate calls (carry limit): each call leaves its part in /tmp/keep.
mkdir -p /tmp/keep && cp -n .devcarry/mlxcuda.tar.xz.part* /tmp/keep/ 2>/dev/null || true
cat /tmp/keep/mlxcuda.tar.xz.part* | xz -d | tar x -C /tmp/site
for w in .devcarry/*.whl; do python3 -m zipfile -e "$w" /tmp/site; done  # merged into the same mlx/ package
export PYTHONPATH=/tmp/site
NV=$(python3 -c 'import nvidia, os; print(os.path.dirname(nvidia.__path__[0]))')/nvidia
export LD_LIBRARY_PATH=/tmp/site/mlx/lib:$(find "$NV" -name 'lib*.so*' -printf '%h\n' | sort -u | paste -sd:)
xz -dc .devcarry/tandem.xz > target/release/tandem && chmod +x target/release/tandem
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c 'import mlx.core as mx; print("mlx", mx.__version__, mx.default_device(), (mx.arange(4) * 2).tolist())' | tee -a "$OUT/gpu.txt"
B=target/release/tandem
echo "== tandem-tiny: tandem bench"
$B bench --prompt-tokens 128 --gen-tokens 256 --depths 0,1,2,3 --adaptive --json > "$OUT/tiny.json"
$B bench --prompt-tokens 128 --gen-tokens 256 --depths 0,1,2,3 --adaptive
echo "== tandem-tiny: vs mlx-lm"
python3 benches/vs_mlx_lm.py --prompt-tokens 128 --gen-tokens 256 | tee "$OUT/tiny_vs_mlx_lm.txt"
echo "== random Qwen3.5-2B shape"
python3 benches/gpu/random_qwen35.py /tmp/big
$B bench --model /tmp/big --prompt-tokens 512 --gen-tokens 128 --depths 0,1,2,3 --adaptive --json > "$OUT/big.json"
$B bench --model /tmp/big --prompt-tokens 512 --gen-tokens 128 --depths 0,1,2,3 --adaptive
python3 benches/vs_mlx_lm.py /tmp/big --prompt-tokens 512 --gen-tokens 128 | tee "$OUT/big_vs_mlx_lm.txt"
