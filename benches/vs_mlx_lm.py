"""Tandem and mlx-lm side by side: the same model, prompt length and machine, in one run.

Usage: .venv/bin/python benches/vs_mlx_lm.py [MODEL_DIR] [--prompt-tokens N] [--gen-tokens M]
Runs `target/release/tandem bench --json` (depth 0 and 3) and mlx-lm's stream_generate on the same
prompt length (greedy), and prints prefill and decode tokens per second for each.
"""
import argparse
import json
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
from mlx_lm import load, stream_generate
from mlx_lm.sample_utils import make_sampler

ROOT = Path(__file__).resolve().parent.parent
TEXT = ("Call me Ishmael. Some years ago, never mind how long precisely, having little or no money in my "
        "purse, and nothing particular to interest me on shore, I thought I would sail about a little and see "
        "the watery part of the world. ")

p = argparse.ArgumentParser()
p.add_argument("model", nargs="?", default=str(ROOT / "assets/models/tandem-tiny"))
p.add_argument("--prompt-tokens", type=int, default=128)
p.add_argument("--gen-tokens", type=int, default=128)
p.add_argument("--mlx-lm-only", action="store_true", help="measure mlx-lm alone (Tandem measured separately)")
a = p.parse_args()

ours = {"runs": []}
if not a.mlx_lm_only:
    out = subprocess.run([str(ROOT / "target/release/tandem"), "bench", "--model", a.model, "--json",
                          "--prompt-tokens", str(a.prompt_tokens), "--gen-tokens", str(a.gen_tokens), "--depths", "0,3"],
                         check=True, capture_output=True, text=True)
    ours = json.loads(out.stdout)

model, tok = load(a.model)
ids = []
while len(ids) < a.prompt_tokens:
    ids += tok.encode(TEXT, add_special_tokens=False)
ids = ids[: a.prompt_tokens]
# Warm-up, then the measured run.
for _ in stream_generate(model, tok, ids[:16], max_tokens=4, sampler=make_sampler(0.0)):
    pass
last = None
for last in stream_generate(model, tok, ids, max_tokens=a.gen_tokens, sampler=make_sampler(0.0)):
    pass

print(f"model {a.model}, prompt {a.prompt_tokens} tokens, {a.gen_tokens} generated, MLX {mx.__version__}, device {mx.default_device()}")
print(f"{'engine':<24} {'prefill tok/s':>14} {'decode tok/s':>13}")
for r in ours["runs"]:
    s = r["stats"]
    name = f"tandem depth {r['depth']}"
    print(f"{name:<24} {s['prefill_tok_s']:>14.1f} {s['decode_tok_s']:>13.1f}")
# The generated count too: mlx-lm stops at an end-of-sequence token, which random weights can draw.
print(f"{'mlx-lm ' + '0.32.2':<24} {last.prompt_tps:>14.1f} {last.generation_tps:>13.1f}  ({last.generation_tokens} tokens)")
sys.exit(0)
