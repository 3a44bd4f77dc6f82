"""Parity and timing of kernels/cuda/quantized_matmul (the verify-width quantized matmul) against MLX's own
mx.quantized_matmul, on the GPU machine, from Python with the same kernel sources the engine loads.

Usage: python3 benches/gpu/qmm_kernel.py [--variants 2,4,2;4,4,2] [--out DIR] [--quick]
Each variant is R,KS,U[,P] (16-row tiles per warp, warps per block, groups per load round, the loads' L2
prefetch mode, 0 by default); the first is the one
src/kernels/quantized_matmul.rs launches. It checks on random data,
M = 1..8, 4 and 8 bits: the first variant on the 27B projection shapes, a 248320-row vocabulary projection
and edge shapes in bf16 and f16, the others in bf16 on edge shapes and one 27B shape:
  - against an fp32 reference (x and the dequantized weight in fp32): relative Frobenius error, and the
    same figure for MLX's op, so the two are judged by one yardstick;
  - against MLX's op element by element: largest |kernel - mlx| / (|mlx| + rms(mlx));
  - batch invariance: each row of an M-row call equals, bit for bit, that row alone (M = 1);
  - a misaligned x (a view starting one element into its buffer) takes the scalar-load path.
Then it times both at M = 1, 2, 4, 8 (each call in a batch of calls rotating over weight copies that
together exceed the L2, so each call reads its weights from HBM) and prints a table.
"""
import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import mlx.core as mx

ROOT = Path(__file__).resolve().parents[2]
HEADER = (ROOT / "kernels/cuda/quantized_matmul.cuh").read_text()
SOURCE = (ROOT / "kernels/cuda/quantized_matmul.cu").read_text()
GROUP = 64

# (name, N, K) at the Qwen3.5-27B shape (hidden 5120, intermediate 17408, 24 query heads of 256 with gate,
# 4 KV heads, linear attention 16 key heads and 48 value heads of 128): the engine fuses q/k/v and
# linear attention's qkv/z/b/a into one matmul each.
SHAPES_27B = [
    ("mlp.gate/up", 17408, 5120),
    ("mlp.down", 5120, 17408),
    ("attn.qkv", 14336, 5120),
    ("linear.in_proj", 16480, 5120),
    ("o_proj/out_proj", 5120, 6144),
    ("lm_head", 248320, 5120),
]
EDGE_SHAPES = [("edge.small", 40, 256), ("edge.b/a", 48, 5120), ("edge.odd", 1000, 128)]

KERNELS = {}


def kernel(dtype):
    name = {mx.bfloat16: "bf16", mx.float16: "f16"}[dtype]
    if name not in KERNELS:
        KERNELS[name] = mx.fast.cuda_kernel(
            name=f"tandem_qmm_{name}",
            input_names=["x", "w", "scales", "biases"],
            output_names=["y"],
            source=SOURCE,
            header=HEADER,
        )
    return KERNELS[name]


def qmm_kernel(x, w, s, b, bits, variant):
    r, ks, u, pf = (tuple(variant) + (0,))[:4]
    m, k = x.shape
    n = w.shape[0]
    blocks = (n + 16 * r - 1) // (16 * r)
    return kernel(x.dtype)(
        inputs=[x, w, s, b],
        template=[("BITS", bits), ("R", r), ("KS", ks), ("U", u), ("P", pf), ("S", 1), ("XD", 2)],
        grid=(blocks * 32 * ks, 1, 1),
        threadgroup=(32 * ks, 1, 1),
        output_shapes=[(m, n)],
        output_dtypes=[x.dtype],
    )[0]


def qmm_mlx(x, w, s, b, bits):
    return mx.quantized_matmul(x, w, s, b, transpose=True, group_size=GROUP, bits=bits)


def make_weights(n, k, bits, dtype, seed):
    mx.random.seed(seed)
    wd = (mx.random.normal((n, k)) * 0.02).astype(dtype)
    w, s, b = mx.quantize(wd, group_size=GROUP, bits=bits)
    mx.eval(w, s, b)
    return w, s, b


def rel_fro(a, ref):
    a32, r32 = a.astype(mx.float32), ref.astype(mx.float32)
    return (mx.sqrt(mx.sum((a32 - r32) ** 2)) / mx.sqrt(mx.sum(r32**2))).item()


def max_rel_elem(a, ref):
    a32, r32 = a.astype(mx.float32), ref.astype(mx.float32)
    rms = mx.sqrt(mx.mean(r32**2))
    return mx.max(mx.abs(a32 - r32) / (mx.abs(r32) + rms)).item()


def parity(variant, bits, dtype, shapes, ms, seed):
    rows = []
    for name, n, k in shapes:
        w, s, b = make_weights(n, k, bits, dtype, seed)
        # Dequantized in fp32 (scales and biases upcast first), so the reference itself is not rounded.
        wref = mx.dequantize(w, s.astype(mx.float32), b.astype(mx.float32), group_size=GROUP, bits=bits)
        mx.random.seed(seed + 1)
        x8 = mx.random.normal((8, k)).astype(dtype)
        y8 = qmm_kernel(x8, w, s, b, bits, variant)
        worst = {"kernel_vs_ref": 0.0, "mlx_vs_ref": 0.0, "kernel_vs_mlx_elem": 0.0}
        invariant = True
        for m in ms:
            x = x8[:m]
            yk = qmm_kernel(x, w, s, b, bits, variant)
            ym = qmm_mlx(x, w, s, b, bits)
            yr = x.astype(mx.float32) @ wref.T
            nan = mx.any(mx.isnan(yk)).item() or mx.any(mx.isinf(yk)).item()
            worst["kernel_vs_ref"] = max(worst["kernel_vs_ref"], math.inf if nan else rel_fro(yk, yr))
            worst["mlx_vs_ref"] = max(worst["mlx_vs_ref"], rel_fro(ym, yr))
            worst["kernel_vs_mlx_elem"] = max(worst["kernel_vs_mlx_elem"], max_rel_elem(yk, ym))
            invariant &= mx.array_equal(yk, y8[:m]).item()
        # A view one element into its buffer: the kernel's scalar-load path.
        flat = mx.concatenate([mx.zeros((1,), dtype), x8[:3].reshape(-1)])
        xm = flat[1:].reshape(3, k)
        ymis = qmm_kernel(xm, w, s, b, bits, variant)
        misaligned_ok = mx.array_equal(ymis, y8[:3]).item()
        rows.append(dict(shape=name, n=n, k=k, bits=bits, dtype=str(dtype), variant=list(variant),
                         invariant=bool(invariant), misaligned_equal=bool(misaligned_ok), **worst))
    return rows


def bench(fn, sets, x, iters, reps):
    outs = [fn(x, *sets[i % len(sets)]) for i in range(len(sets))]
    mx.eval(outs)  # warm-up: compile, allocate
    times = []
    for _ in range(reps):
        mx.synchronize()
        t0 = time.perf_counter()
        outs = [fn(x, *sets[i % len(sets)]) for i in range(iters)]
        mx.eval(outs)
        mx.synchronize()
        times.append((time.perf_counter() - t0) / iters * 1e6)
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--variants", default="2,4,2;4,4,2;2,4,4")
    p.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    p.add_argument("--quick", action="store_true", help="parity on fewer shapes, fewer timing repeats")
    p.add_argument("--iters", type=int, default=96)
    p.add_argument("--reps", type=int, default=7)
    a = p.parse_args()
    variants = [tuple(int(v) for v in s.split(",")) for s in a.variants.split(";")]
    Path(a.out).mkdir(parents=True, exist_ok=True)
    print("mlx", mx.__version__, mx.default_device(), flush=True)
    try:
        print("device", mx.device_info(), flush=True)
    except Exception as e:  # noqa: BLE001
        print("device_info:", e)

    # Parity: every variant, both bit widths (shapes and dtypes as the docstring says).
    results = {"parity": [], "timing": []}
    failed = []
    for variant in variants:
        for bits in (4, 8):
            if variant == variants[0]:  # each variant and dtype is a compile: f16 on the first only
                dtypes = [(mx.bfloat16, SHAPES_27B + EDGE_SHAPES), (mx.float16, EDGE_SHAPES + SHAPES_27B)]
            else:
                dtypes = [(mx.bfloat16, SHAPES_27B[:1] + EDGE_SHAPES)]
            for dtype, shapes in dtypes:
                if a.quick:
                    shapes = shapes[:1] + EDGE_SHAPES[:1]
                try:
                    rows = parity(variant, bits, dtype, shapes, range(1, 9), seed=7)
                except Exception as e:  # noqa: BLE001
                    print(f"variant {variant} bits {bits} {dtype}: FAILED to run: {e}", flush=True)
                    failed.append((variant, bits, str(dtype), str(e)))
                    continue
                results["parity"].extend(rows)
                for r in rows:
                    # The stated tolerance: half an ulp of the output dtype at its worst, relative.
                    tol = 2**-11 if dtype == mx.float16 else 2**-8
                    ok = r["invariant"] and r["misaligned_equal"] and r["kernel_vs_ref"] <= tol
                    if not ok:
                        failed.append((variant, bits, str(dtype), r))
                worst = max(r["kernel_vs_ref"] for r in rows)
                worst_m = max(r["mlx_vs_ref"] for r in rows)
                worst_e = max(r["kernel_vs_mlx_elem"] for r in rows)
                inv = all(r["invariant"] and r["misaligned_equal"] for r in rows)
                print(f"parity {variant} {bits}-bit {dtype}: kernel/ref {worst:.2e}  mlx/ref {worst_m:.2e}  "
                      f"kernel/mlx elem {worst_e:.2e}  batch-invariant+misaligned {inv}", flush=True)

    # Timing, bf16 (the 27B checkpoints' dtype).
    dtype = mx.bfloat16
    l2_bytes = 60 << 20
    for name, n, k in SHAPES_27B:
        for bits in (4, 8):
            one = n * k * bits // 8 + 2 * n * (k // GROUP) * 2
            nsets = max(2, math.ceil(3 * l2_bytes / one))
            sets = [make_weights(n, k, bits, dtype, seed=100 + i) for i in range(nsets)]
            for m in (1, 2, 4, 8):
                mx.random.seed(m)
                x = mx.random.normal((m, k)).astype(dtype)
                mx.eval(x)
                row = dict(shape=name, n=n, k=k, bits=bits, m=m, bytes=one)
                row["mlx_us"] = bench(lambda x, w, s, b: qmm_mlx(x, w, s, b, bits), sets, x, a.iters, a.reps)
                for v in variants:
                    try:
                        row["k" + "_".join(map(str, v)) + "_us"] = bench(
                            lambda x, w, s, b: qmm_kernel(x, w, s, b, bits, v), sets, x, a.iters, a.reps)
                    except Exception as e:  # noqa: BLE001
                        row["k" + "_".join(map(str, v)) + "_us"] = None
                        print("timing failed", v, e)
                results["timing"].append(row)
                ks = {kk: vv for kk, vv in row.items() if kk.startswith("k") and kk.endswith("_us")}
                best = min((vv, kk) for kk, vv in ks.items() if vv is not None)
                print(f"time {name:16s} {bits}-bit M={m}: mlx {row['mlx_us']:7.1f} us  best {best[1]} "
                      f"{best[0]:7.1f} us  ({one / best[0] / 1e3:.0f} GB/s)  all "
                      + " ".join(f"{kk[1:-3]}={vv:.1f}" for kk, vv in ks.items() if vv is not None), flush=True)
            del sets
            mx.clear_cache()

    (Path(a.out) / "qmm_kernel.json").write_text(json.dumps(results, indent=1))
    first = "k" + "_".join(map(str, variants[0])) + "_us"
    print(f"\n== summary (us per call, bf16; kernel = first variant {variants[0]}, best = best of all variants)")
    print(f"{'shape':16s} bits   M    mlx  kernel    best  mlx(M)/mlx(1)  kernel(M)/kernel(1)  mlx/kernel")
    base = {}
    for row in results["timing"]:
        ks = [vv for kk, vv in row.items() if kk.startswith("k") and kk.endswith("_us") and vv is not None]
        kb, k0 = min(ks), row[first]
        key = (row["shape"], row["bits"])
        if row["m"] == 1:
            base[key] = (row["mlx_us"], k0)
        bm, bk = base[key]
        print(f"{row['shape']:16s} {row['bits']:4d} {row['m']:3d} {row['mlx_us']:6.1f} {k0:7.1f} {kb:7.1f} "
              f"{row['mlx_us'] / bm:10.2f} {k0 / bk:16.2f} {row['mlx_us'] / k0:15.2f}")
    if failed:
        print("PARITY FAILURES:", len(failed))
        for f in failed[:20]:
            print("  ", f)
        sys.exit(1)
    print("parity: all variants passed")


if __name__ == "__main__":
    main()
