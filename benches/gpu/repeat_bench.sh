#!/usr/bin/env bash
# Plain decoding on the 27B-shaped 4-bit slice, Tandem (chains compiled and op by op) and mlx-lm in
# alternating rounds, 512 tokens each (single 128-token runs varied by up to 1.6x on the lent H200).
# Carrying and setup: as benches/gpu/scale_bench.sh (its `setup` phase is run first when /tmp/s27 is
# missing). Results: $OUT/repeat.txt.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
[ -d /tmp/s27-4bit ] || bash benches/gpu/scale_bench.sh setup
export PYTHONPATH=/tmp/site
NV=$(python3 -c 'import nvidia, os; print(os.path.dirname(nvidia.__path__[0]))')/nvidia
export LD_LIBRARY_PATH=/tmp/site/mlx/lib:$(find "$NV" -name 'lib*.so*' -printf '%h\n' | sort -u | paste -sd:)
B=target/release/tandem
mkdir -p target/release && cp /tmp/keep/tandem $B
M=/tmp/s27-4bit
[ -d $M ] || $B convert /tmp/s27 --out $M --bits 4 --group-size 64
ARGS="--prompt-tokens 512 --gen-tokens 512"
for round in 1 2 3; do
  for c in on off; do
    TANDEM_COMPILE=$c $B bench --model $M $ARGS --depths 0 --json > /tmp/r.json
    python3 -c "import json; r=json.load(open('/tmp/r.json'))['runs'][0]['stats']; print('round $round tandem compile $c: decode %.1f tok/s, prefill %.0f' % (r['decode_tok_s'], r['prefill_tok_s']))"
  done
  python3 benches/vs_mlx_lm.py $M $ARGS --mlx-lm-only | tail -1 | sed "s/^/round $round /"
done | tee "$OUT/repeat.txt"
