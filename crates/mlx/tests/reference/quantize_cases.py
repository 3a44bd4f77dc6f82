"""Writes inputs and Python MLX's `mx.quantize` outputs for the Rust parity test.

Usage: python quantize_cases.py OUT.safetensors
Each case `c{n}` stores `c{n}.w` (the input), `c{n}.q`, `c{n}.scales`, `c{n}.biases`, and its
parameters in the metadata as "c{n}" -> "bits,group_size".
"""
import sys

import mlx.core as mx
import numpy as np

rng = np.random.default_rng(1234)
arrays, meta = {}, {}
n = 0
for shape in [(4, 128), (3, 5, 256), (64, 384)]:
    for dtype in [mx.float32, mx.bfloat16, mx.float16]:
        for bits in [2, 3, 4, 5, 6, 8]:
            for group in [32, 64, 128]:
                if shape[-1] % group:
                    continue
                # Heavy tails and exact zeros exercise the edge-value and zero-point rules.
                w = rng.standard_t(3, size=shape).astype(np.float32)
                w[..., :7] = 0.0
                w = mx.array(w).astype(dtype)
                q, s, b = mx.quantize(w, group_size=group, bits=bits)
                key = f"c{n}"
                arrays.update({f"{key}.w": w, f"{key}.q": q, f"{key}.scales": s, f"{key}.biases": b})
                meta[key] = f"{bits},{group}"
                n += 1
mx.save_safetensors(sys.argv[1], arrays, metadata=meta)
print(f"{n} cases", file=sys.stderr)
