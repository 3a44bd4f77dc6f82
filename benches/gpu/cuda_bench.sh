#!/usr/bin/env bash
# Tandem on an NVIDIA GPU (MLX's CUDA backend): `tandem bench` and benches/vs_mlx_lm.py on tandem-tiny and
# on a Qwen3.5-2B-shaped random checkpoint (benches/gpu/random_qwen35.py). Run on the lent GPU machine,
# from the repository root, with .devcarry/ holding: mlxcuda.tar.xz.part* (the mlx-cuda-13 wheel's mlx/ and
# mlx_cuda_13.libs/, tar + xz, split to fit the carry limit), tandem.xz (target/release/tandem built here
# against the same MLX version), and the mlx and mlx-lm wheels. Results go to $OUT (or /tmp/out).
#
# Preparing .devcarry/ here (git-ignored):
#   P="--no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_35_x86_64"
#   python3 -m pip download $P -d /tmp/w mlx-cuda-13==0.32.4 mlx==0.32.4 mlx-lm==0.32.2
#   (mkdir x && cd x && python3 -m zipfile -e /tmp/w/mlx_cuda_13-*.whl . && tar cf - mlx mlx_cuda_13.libs) \
#     | xz -T2 -6 | split -b 41m - .devcarry/mlxcuda.tar.xz.part        # ~75 MB -> two parts
#   cp /tmp/w/mlx-0.32.4-*.whl /tmp/w/mlx_lm-*.whl .devcarry/
#   cargo build --release --bin tandem && xz -c target/release/tandem > .devcarry/tandem.xz
# The device tool carries at most 64 MiB per call with the working tree (~23 MB), so the first call
# carries `.devcarry/mlxcuda.tar.xz.partaa` and copies it to /tmp/keep; the next call, within the 30 s
# the machine stays warm, carries partab, tandem.xz and the two wheels and runs this script.
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
