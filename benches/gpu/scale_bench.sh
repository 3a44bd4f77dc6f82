#!/usr/bin/env bash
# Tandem at the size people run, on an NVIDIA GPU (MLX's CUDA backend): a random-weight slice of the
# Qwen3.5-27B shape (benches/gpu/random_qwen35.py --preset 27b-slice: 16 of 64 layers, 6.5B parameters),
# converted to 4-bit and 8-bit by `tandem convert`; `tandem bench` at fixed depths, with oracle acceptance
# (0.8, and 0.0 with the adaptive controller), with and without kernels/ and compiled chains; MLX operations
# per forward (bench --json's graph_ops); mlx-lm on the same files (benches/vs_mlx_lm.py).
# Usage: scale_bench.sh [PHASE...] with phases setup, q4, q8, kernels, bf16 (default: all, in that order); a
# later call on the same (warm) machine may run later phases, since the models stay in /tmp.
# Carrying: as benches/gpu/cuda_bench.sh says (.devcarry/: the mlx-cuda-13 wheel in parts, the mlx and
# mlx-lm wheels, tandem.xz); parts may come in earlier calls, each copied to /tmp/keep. TANDEM_BIN names
# the binary inside the carry if it is not target/release/tandem. Results go to $OUT (or /tmp/out).
# Not -e: one failed measurement must not stop the others (each prints its own error).
set -uo pipefail
OUT=${OUT:-/tmp/out}
PHASES=${*:-setup q4 q8 kernels bf16}
mkdir -p /tmp/site "$OUT" target/release /tmp/keep
cp -n .devcarry/mlxcuda.tar.xz.part* /tmp/keep/ 2>/dev/null || true
export PYTHONPATH=/tmp/site
M=/tmp/s27
BENCH="--prompt-tokens 512 --gen-tokens 128"
B=target/release/tandem
env_setup() {
  NV=$(python3 -c 'import nvidia, os; print(os.path.dirname(nvidia.__path__[0]))')/nvidia
  export LD_LIBRARY_PATH=/tmp/site/mlx/lib:$(find "$NV" -name 'lib*.so*' -printf '%h\n' | sort -u | paste -sd:)
}
for phase in $PHASES; do
  case $phase in
  setup)
    cat /tmp/keep/mlxcuda.tar.xz.part* | xz -d | tar x -C /tmp/site
    for w in .devcarry/*.whl; do python3 -m zipfile -e "$w" /tmp/site; done
    xz -dc .devcarry/tandem.xz > /tmp/keep/tandem && chmod +x /tmp/keep/tandem
    env_setup
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
    python3 -c 'import mlx.core as mx; print("mlx", mx.__version__, mx.default_device())' | tee -a "$OUT/gpu.txt"
    git log -1 --format='commit %h %s' 2>/dev/null | tee -a "$OUT/gpu.txt" || true
    python3 benches/gpu/random_qwen35.py $M --preset 27b-slice
    ;;
  q4 | q8)
    env_setup
    cp /tmp/keep/tandem $B
    bits=${phase#q}
    time $B convert $M --out $M-${bits}bit --bits $bits --group-size 64
    tag=s27-${bits}bit
    echo "== $tag: the MTP head's acceptance probe, its figures and cost (inspect --json's mtp.probe)"
    $B inspect $M-${bits}bit --json > "$OUT/$tag-inspect.json" || true
    python3 -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1])).get("mtp", {}).get("probe")))' "$OUT/$tag-inspect.json" || true
    echo "== $tag: fixed depths; oracle acceptance 0.8; 0.0 with the adaptive controller"
    $B bench --model $M-${bits}bit $BENCH --depths 0,1,3 --json > "$OUT/$tag-depths.json"
    $B bench --model $M-${bits}bit $BENCH --depths 0,1,3 --oracle-acceptance 0.8 --json > "$OUT/$tag-oracle08.json"
    $B bench --model $M-${bits}bit $BENCH --depths 0,3 --oracle-acceptance 0.0 --adaptive --json > "$OUT/$tag-oracle00.json"
    python3 benches/gpu/summarize_bench.py "$OUT/$tag-depths.json" "$OUT/$tag-oracle08.json" "$OUT/$tag-oracle00.json"
    echo "== $tag: chains op by op (TANDEM_COMPILE=off), then without kernels/ (TANDEM_KERNELS=off)"
    TANDEM_COMPILE=off $B bench --model $M-${bits}bit $BENCH --depths 0,3 --oracle-acceptance 0.8 --json > "$OUT/$tag-compile-off.json"
    TANDEM_KERNELS=off $B bench --model $M-${bits}bit $BENCH --depths 0,3 --oracle-acceptance 0.8 --json > "$OUT/$tag-kernels-off.json"
    python3 benches/gpu/summarize_bench.py "$OUT/$tag-compile-off.json" "$OUT/$tag-kernels-off.json"
    echo "== $tag: mlx-lm on the same files (tandem depth 0 and 3 beside it)"
    python3 benches/vs_mlx_lm.py $M-${bits}bit --prompt-tokens 512 --gen-tokens 128
    ;;
  kernels)
    # The Rust suite's kernel tests (tests/it/kernels.rs: the verify-width matmul's CUDA parity, every
    # compiled chain against its op-by-op body) with the CUDA libmlx; .devcarry/it.xz is the stripped
    # integration-test binary built on the CPU machine against the same MLX version.
    env_setup
    mkdir -p /tmp/itbin/deps && xz -dc .devcarry/it.xz > /tmp/itbin/deps/it && chmod +x /tmp/itbin/deps/it
    ln -sfn /tmp/site/mlx /tmp/itbin/mlx
    /tmp/itbin/deps/it kernels:: --test-threads 1 --nocapture 2>&1 | tail -30
    TANDEM_COMPILE=off /tmp/itbin/deps/it kernels::fused --nocapture 2>&1 | tail -3
    ;;
  bf16)
    env_setup
    cp /tmp/keep/tandem $B
    $B bench --model $M $BENCH --depths 0,3 --oracle-acceptance 0.8 --json > "$OUT/s27-bf16.json"
    python3 benches/gpu/summarize_bench.py "$OUT/s27-bf16.json"
    echo "== bf16: mlx-lm on the same files"
    python3 benches/vs_mlx_lm.py $M --prompt-tokens 512 --gen-tokens 128
    ;;
  esac
done
(cd "$OUT" && ls *.json >/dev/null 2>&1 && tar czf bench-json-$(echo $PHASES | tr ' ' '-').tgz *.json && rm -f *.json) || true
