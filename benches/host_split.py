"""mlx-lm's decode step split into host and device time, to set beside Tandem's `pipelined step` trace.

Usage: .venv/bin/python benches/host_split.py MODEL_DIR [--prompt-tokens N] [--gen-tokens M]
Decodes greedily as mlx-lm's generate_step does (the next step's graph built and started with
`mx.async_eval` before the current token is read) and times, per step: building the graph (the
model's Python forward), MLX's host work until `async_eval` returns (building and launching its
kernels), and the wait for the current token after that. Also counts the operations of one step's
graph (from `mx.export_to_dot`). Prints one line of means.
"""
import argparse
import io
import re
import time

import mlx.core as mx
from mlx_lm import load
from mlx_lm.models.cache import make_prompt_cache

p = argparse.ArgumentParser()
p.add_argument("model")
p.add_argument("--prompt-tokens", type=int, default=512)
p.add_argument("--gen-tokens", type=int, default=256)
a = p.parse_args()

model, _ = load(a.model)
cache = make_prompt_cache(model)
prompt = mx.array([(7 * i + 3) % 1000 + 10 for i in range(a.prompt_tokens)])
logits = model(prompt[None], cache=cache)
y = mx.argmax(logits[:, -1, :], axis=-1)
mx.eval(y)


def build(y):
    return mx.argmax(model(y.reshape(1, 1), cache=cache)[:, -1, :], axis=-1)


# One step's operations: the primitives of its graph (the dot file's rectangles).
probe = build(y)
dot = io.StringIO()
mx.export_to_dot(dot, probe)
ops = len(re.findall(r"shape=rectangle", dot.getvalue()))
mx.eval(probe)
y = probe

times = []
nxt = build(y)
mx.async_eval(nxt)
for i in range(a.gen_tokens):
    t0 = time.perf_counter()
    following = build(nxt)
    t1 = time.perf_counter()
    mx.async_eval(following)
    t2 = time.perf_counter()
    nxt.item()
    t3 = time.perf_counter()
    nxt = following
    if i >= a.gen_tokens // 4:
        times.append((t1 - t0, t2 - t1, t3 - t2, t3 - t0))
n = len(times)
mean = [sum(t[j] for t in times) / n * 1e3 for j in range(4)]
print(f"mlx-lm host split: {n} steps, ops {ops}, mean ms build {mean[0]:.2f}, launch {mean[1]:.2f}, "
      f"wait {mean[2]:.2f}, step {mean[3]:.2f} ({1e3 / mean[3]:.1f} tok/s)")
