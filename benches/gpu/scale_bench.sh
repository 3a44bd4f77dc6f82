#!/usr/bin/env bash
# Tandem at the size people run, on an NVIDIA GPU (MLX's CUDA backend): a random-weight slice of the
# Qwen3.5-27B shape (benches/gpu/random_qwen35.py --preset 27b-slice: 16 of 64 layers, 6.5B parameters),
# converted to 4-bit by `tandem convert` (the MTP probe's figures and cost from `inspect`); `tandem bench` at
# fixed depths, with oracle acceptance (0.8, and 0.0 with the adaptive controller), with and without kernels/;
# mlx-lm on the same files in 4-bit and bf16 (benches/vs_mlx_lm.py). Carrying: as benches/gpu/cuda_bench.sh says (.devcarry/: the mlx-cuda-13 wheel in
# two parts, the mlx and mlx-lm wheels, tandem.xz). TANDEM_BIN names the binary inside the carry if it is
# not target/release/tandem. Results go to $OUT (or /tmp/out): gpu.txt and bench-json.tgz (tee the output too).
# Not -e: one failed measurement must not stop the others (each prints its own error).
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p /tmp/site "$OUT" target/release
mkdir -p /tmp/keep && cp -n .devcarry/mlxcuda.tar.xz.part* /tmp/keep/ 2>/dev/null || true
cat /tmp/keep/mlxcuda.tar.xz.part* | xz -d | tar x -C /tmp/site
for w in .devcarry/*.whl; do python3 -m zipfile -e "$w" /tmp/site; done
export PYTHONPATH=/tmp/site
NV=$(python3 -c 'import nvidia, os; print(os.path.dirname(nvidia.__path__[0]))')/nvidia
export LD_LIBRARY_PATH=/tmp/site/mlx/lib:$(find "$NV" -name 'lib*.so*' -printf '%h\n' | sort -u | paste -sd:)
xz -dc .devcarry/tandem.xz > target/release/tandem && chmod +x target/release/tandem
B=target/release/tandem
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c 'import mlx.core as mx; print("mlx", mx.__version__, mx.default_device())' | tee -a "$OUT/gpu.txt"
git log -1 --format='commit %h %s' 2>/dev/null | tee -a "$OUT/gpu.txt" || true

M=/tmp/s27
python3 benches/gpu/random_qwen35.py $M --preset 27b-slice
time $B convert $M --out $M-4bit --bits 4 --group-size 64
echo "== the MTP head's acceptance probe: its figures and cost (inspect --json's mtp.probe)"
for model in $M-4bit; do
  $B inspect $model --json > "$OUT/inspect-$(basename $model).json" || true
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[1], json.dumps(d.get("mtp", {}).get("probe")))' "$OUT/inspect-$(basename $model).json" || true
done
BENCH="--prompt-tokens 512 --gen-tokens 128"
tag=$(basename $M-4bit)
echo "== $tag: fixed depths; oracle acceptance 0.8; 0.0 with the adaptive controller"
$B bench --model $M-4bit $BENCH --depths 0,1,3 --json > "$OUT/$tag-depths.json"
$B bench --model $M-4bit $BENCH --depths 0,1,3 --oracle-acceptance 0.8 --json > "$OUT/$tag-oracle08.json"
$B bench --model $M-4bit $BENCH --depths 0,3 --oracle-acceptance 0.0 --adaptive --json > "$OUT/$tag-oracle00.json"
python3 benches/gpu/summarize_bench.py "$OUT/$tag-depths.json" "$OUT/$tag-oracle08.json" "$OUT/$tag-oracle00.json"
echo "== 4-bit without kernels/ (TANDEM_KERNELS=off)"
TANDEM_KERNELS=off $B bench --model $M-4bit $BENCH --depths 0,3 --oracle-acceptance 0.8 --json > "$OUT/kernels-off.json"
python3 benches/gpu/summarize_bench.py "$OUT/kernels-off.json"
for model in $M-4bit $M; do
  echo "== $(basename $model): mlx-lm on the same files (tandem depth 0 and 3 beside it)"
  python3 benches/vs_mlx_lm.py $model --prompt-tokens 512 --gen-tokens 128
done
tar czf "$OUT/bench-json.tgz" -C "$OUT" $(cd "$OUT" && ls *.json)
