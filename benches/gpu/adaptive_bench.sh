#!/usr/bin/env bash
# The adaptive controller on an NVIDIA GPU when drafts never pay (oracle acceptance 0.0): what a parked
# step and a probing cycle cost, from `tandem bench` and the decoder's trace (RUST_LOG
# tandem::generate::mtp=trace: one line per parked step and per cycle, with the head's catch-up time).
# Model: benches/gpu/random_qwen35.py --preset 2b (or PRESET=27b-slice), converted to 4-bit.
# Carrying: as benches/gpu/cuda_bench.sh says (.devcarry/: the mlx-cuda-13 wheel in parts, the mlx and
# mlx-lm wheels, tandem.xz). Results in $OUT (or /tmp/out); summary on stdout.
set -uo pipefail
OUT=${OUT:-/tmp/out}
PRESET=${PRESET:-2b}
mkdir -p /tmp/site "$OUT" target/release
mkdir -p /tmp/keep && cp -n .devcarry/mlxcuda.tar.xz.part* /tmp/keep/ 2>/dev/null || true
cat /tmp/keep/mlxcuda.tar.xz.part* | xz -d | tar x -C /tmp/site
for w in .devcarry/*.whl; do python3 -m zipfile -e "$w" /tmp/site; done
export PYTHONPATH=/tmp/site
NV=$(python3 -c 'import nvidia, os; print(os.path.dirname(nvidia.__path__[0]))')/nvidia
export LD_LIBRARY_PATH=/tmp/site/mlx/lib:$(find "$NV" -name 'lib*.so*' -printf '%h\n' | sort -u | paste -sd:)
xz -dc .devcarry/tandem.xz > target/release/tandem && chmod +x target/release/tandem
B=target/release/tandem
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
M=/tmp/m-$PRESET
python3 benches/gpu/random_qwen35.py $M --preset "$PRESET" >/dev/null
$B convert $M --out $M-4bit --bits 4 --group-size 64 >/dev/null 2>&1 || echo "convert failed"
BENCH="--model $M-4bit --prompt-tokens 512 --gen-tokens 128"
echo "== fixed depths 0 and 3, and adaptive at 3; oracle acceptance 0.0"
$B bench $BENCH --depths 0,3 --oracle-acceptance 0.0 --adaptive --json > "$OUT/oracle00.json"
python3 benches/gpu/summarize_bench.py "$OUT/oracle00.json"
echo "== the adaptive run's trace"
RUST_LOG=tandem::generate::mtp=trace $B bench $BENCH --depths 3 --oracle-acceptance 0.0 --adaptive --json \
  > "$OUT/trace-run.json" 2> "$OUT/trace.log"
python3 - "$OUT/trace.log" <<'PY'
import re, sys, statistics as st
parked, cycles = [], []
for line in open(sys.argv[1]):
    line = re.sub(r'\x1b\[[0-9;]*m', '', line)  # tracing's colours
    m = dict(re.findall(r'(\w+)=([0-9.]+)', line))
    if 'parked step' in line: parked.append(float(m['ms']))
    elif 'mtp: cycle' in line: cycles.append(m)
print(f"parked steps: {len(parked)}, median {st.median(parked) if parked else 0:.2f} ms, max {max(parked, default=0):.1f} ms, sum {sum(parked):.0f} ms")
for c in cycles[:40]:
    print("cycle", {k: c.get(k) for k in ('k', 'accepted', 'ms', 'draft_ms', 'catch_up_ms', 'verify_ms')})
PY
echo "== the same without pipelining"
TANDEM_NO_PIPELINE=1 $B bench $BENCH --depths 0,3 --oracle-acceptance 0.0 --adaptive --json > "$OUT/nopipe.json"
python3 benches/gpu/summarize_bench.py "$OUT/nopipe.json"
