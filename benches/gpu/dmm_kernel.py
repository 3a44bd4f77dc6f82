"""Parity and timing of kernels/cuda/dense_matmul (the verify-width dense bf16/f16 matmul) against MLX's own
matmul (`x @ w.T`), on the GPU machine, from Python with the same kernel sources the engine loads.

Usage: python3 benches/gpu/dmm_kernel.py [--variants 2,4,2;2,8,2] [--out DIR] [--quick]
Each variant is R,KS,U (16-row tiles per warp, warps per block splitting K, chunks of 64 k per load round);
the first is the one src/kernels/dense_matmul.rs launches. On random data, M = 1..8:
  - against an fp32 reference (x and w upcast): relative Frobenius error, and the same for MLX's op;
  - batch invariance: each row of an M-row call equals, bit for bit, the same row of the 8-row call, for the
    kernel, and (reported, not required) for MLX's op;
  - a misaligned x (a view one element into its buffer) takes the element-wise load path, same bits.
Then it times both at M = 1, 2, 4, 8 (each call in a batch rotating over weight copies that together exceed
the L2, so weights come from HBM) and prints a table.
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
HEADER = (ROOT / "kernels/cuda/dense_matmul.cuh").read_text()
SOURCE = (ROOT / "kernels/cuda/dense_matmul.cu").read_text()

# (name, N, K) at the Qwen3.5-27B shape; the engine fuses q/k/v and linear attention's qkv/z/b/a into one
# matmul each. lm_head.slice is the 27B-shape slice's own vocabulary (4096), lm_head the real one.
SHAPES_27B = [
    ("mlp.gate/up", 17408, 5120),
    ("mlp.down", 5120, 17408),
    ("attn.qkv", 14336, 5120),
    ("linear.in_proj", 16480, 5120),
    ("o_proj/out_proj", 5120, 6144),
    ("attn.q", 6144, 5120),
    ("lm_head.slice", 4096, 5120),
    ("lm_head", 248320, 5120),
]
EDGE_SHAPES = [("edge.small", 40, 256), ("edge.odd", 1000, 128), ("edge.k64", 3, 64), ("edge.b/a", 48, 5120)]

KERNELS = {}


def kernel(dtype):
    name = {mx.bfloat16: "bf16", mx.float16: "f16"}[dtype]
    if name not in KERNELS:
        KERNELS[name] = mx.fast.cuda_kernel(
            name=f"tandem_dmm_{name}",
            input_names=["x", "w"],
            output_names=["y"],
            source=SOURCE,
            header=HEADER,
        )
    return KERNELS[name]


def dmm_kernel(x, w, variant):
    r, ks, u = variant
    m, k = x.shape
    n = w.shape[0]
    blocks = (n + 16 * r - 1) // (16 * r)
    return kernel(x.dtype)(
        inputs=[x, w],
        template=[("R", r), ("KS", ks), ("U", u), ("S", 1), ("XD", 2)],
        grid=(blocks * 32 * ks, 1, 1),
        threadgroup=(32 * ks, 1, 1),
        output_shapes=[(m, n)],
        output_dtypes=[x.dtype],
    )[0]


def dmm_mlx(x, w):
    return x @ w.T


def make_weight(n, k, dtype, seed):
    mx.random.seed(seed)
    w = (mx.random.normal((n, k)) * 0.02).astype(dtype)
    mx.eval(w)
    return w


def rel_fro(a, ref):
    a32, r32 = a.astype(mx.float32), ref.astype(mx.float32)
    return (mx.sqrt(mx.sum((a32 - r32) ** 2)) / mx.sqrt(mx.sum(r32**2))).item()


def parity(variant, dtype, shapes, seed):
    rows = []
    for name, n, k in shapes:
        w = make_weight(n, k, dtype, seed)
        w32 = w.astype(mx.float32)
        mx.random.seed(seed + 1)
        x8 = mx.random.normal((8, k)).astype(dtype)
        y8, m8 = dmm_kernel(x8, w, variant), dmm_mlx(x8, w)
        worst = {"kernel_vs_ref": 0.0, "mlx_vs_ref": 0.0, "kernel_vs_mlx": 0.0}
        invariant, mlx_invariant, mlx_max_diff = True, True, 0.0
        for m in range(1, 9):
            x = x8[:m]
            yk, ym = dmm_kernel(x, w, variant), dmm_mlx(x, w)
            yr = x.astype(mx.float32) @ w32.T
            bad = mx.any(mx.isnan(yk)).item() or mx.any(mx.isinf(yk)).item()
            worst["kernel_vs_ref"] = max(worst["kernel_vs_ref"], math.inf if bad else rel_fro(yk, yr))
            worst["mlx_vs_ref"] = max(worst["mlx_vs_ref"], rel_fro(ym, yr))
            worst["kernel_vs_mlx"] = max(worst["kernel_vs_mlx"], rel_fro(yk, ym))
            invariant &= mx.array_equal(yk, y8[:m]).item()
            same = mx.array_equal(ym, m8[:m]).item()
            mlx_invariant &= same
            if not same:
                d = mx.max(mx.abs(ym.astype(mx.float32) - m8[:m].astype(mx.float32))).item()
                mlx_max_diff = max(mlx_max_diff, d)
        flat = mx.concatenate([mx.zeros((1,), dtype), x8[:3].reshape(-1)])
        ymis = dmm_kernel(flat[1:].reshape(3, k), w, variant)
        misaligned_ok = mx.array_equal(ymis, y8[:3]).item()
        rows.append(dict(shape=name, n=n, k=k, dtype=str(dtype), variant=list(variant), invariant=bool(invariant),
                         misaligned_equal=bool(misaligned_ok), mlx_invariant=bool(mlx_invariant),
                         mlx_max_row_diff=mlx_max_diff, **worst))
        del w, w32
    return rows


def bench(fn, sets, x, iters, reps):
    outs = [fn(x, sets[i % len(sets)]) for i in range(len(sets))]
    mx.eval(outs)  # warm-up: compile, allocate
    times = []
    for _ in range(reps):
        mx.synchronize()
        t0 = time.perf_counter()
        outs = [fn(x, sets[i % len(sets)]) for i in range(iters)]
        mx.eval(outs)
        mx.synchronize()
        times.append((time.perf_counter() - t0) / iters * 1e6)
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--variants", default="2,4,2;2,8,2;1,4,4;4,4,1;1,8,2")
    p.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    p.add_argument("--quick", action="store_true", help="parity on fewer shapes")
    p.add_argument("--iters", type=int, default=96)
    p.add_argument("--reps", type=int, default=7)
    a = p.parse_args()
    variants = [tuple(int(v) for v in s.split(",")) for s in a.variants.split(";")]
    Path(a.out).mkdir(parents=True, exist_ok=True)
    print("mlx", mx.__version__, mx.default_device(), flush=True)

    results = {"parity": [], "timing": []}
    failed = []
    for variant in variants:
        if variant == variants[0]:  # each variant and dtype is a compile: f16 and every shape on the first only
            cases = [(mx.bfloat16, SHAPES_27B + EDGE_SHAPES), (mx.float16, EDGE_SHAPES + SHAPES_27B)]
        else:
            cases = [(mx.bfloat16, SHAPES_27B[:2] + EDGE_SHAPES)]
        for dtype, shapes in cases:
            if a.quick:
                shapes = shapes[:1] + EDGE_SHAPES[:1]
            try:
                rows = parity(variant, dtype, shapes, seed=7)
            except Exception as e:  # noqa: BLE001
                print(f"variant {variant} {dtype}: FAILED to run: {e}", flush=True)
                failed.append((variant, str(dtype), str(e)))
                continue
            results["parity"].extend(rows)
            tol = 2**-11 if dtype == mx.float16 else 2**-8
            for r in rows:
                if not (r["invariant"] and r["misaligned_equal"] and r["kernel_vs_ref"] <= tol):
                    failed.append((variant, str(dtype), r))
                if variant == variants[0]:
                    print(f"  {r['shape']:16s} {dtype}: kernel/ref {r['kernel_vs_ref']:.2e} mlx/ref "
                          f"{r['mlx_vs_ref']:.2e} kernel/mlx {r['kernel_vs_mlx']:.2e} invariant {r['invariant']} "
                          f"mlx invariant {r['mlx_invariant']} (max row diff {r['mlx_max_row_diff']:.3g})", flush=True)
            print(f"parity {variant} {dtype}: kernel/ref {max(r['kernel_vs_ref'] for r in rows):.2e}  mlx/ref "
                  f"{max(r['mlx_vs_ref'] for r in rows):.2e}  batch-invariant+misaligned "
                  f"{all(r['invariant'] and r['misaligned_equal'] for r in rows)}  mlx batch-invariant "
                  f"{all(r['mlx_invariant'] for r in rows)}", flush=True)

    dtype = mx.bfloat16
    l2_bytes = 60 << 20
    for name, n, k in SHAPES_27B:
        one = n * k * 2
        nsets = max(2, math.ceil(3 * l2_bytes / one))
        sets = [make_weight(n, k, dtype, seed=100 + i) for i in range(nsets)]
        for m in (1, 2, 4, 8):
            mx.random.seed(m)
            x = mx.random.normal((m, k)).astype(dtype)
            mx.eval(x)
            row = dict(shape=name, n=n, k=k, m=m, bytes=one)
            row["mlx_us"] = bench(dmm_mlx, sets, x, a.iters, a.reps)
            for v in variants:
                key = "k" + "_".join(map(str, v)) + "_us"
                try:
                    row[key] = bench(lambda x, w: dmm_kernel(x, w, v), sets, x, a.iters, a.reps)
                except Exception as e:  # noqa: BLE001
                    row[key] = None
                    print("timing failed", v, e)
            row["mlx_again_us"] = bench(dmm_mlx, sets, x, a.iters, a.reps)  # the spread between two timings
            results["timing"].append(row)
            ks = {kk: vv for kk, vv in row.items() if kk.startswith("k") and kk.endswith("_us") and vv is not None}
            best = min((vv, kk) for kk, vv in ks.items())
            print(f"time {name:16s} M={m}: mlx {row['mlx_us']:7.1f} / {row['mlx_again_us']:7.1f} us  best "
                  f"{best[1]} {best[0]:7.1f} us ({one / best[0] / 1e3:.0f} GB/s)  all "
                  + " ".join(f"{kk[1:-3]}={vv:.1f}" for kk, vv in ks.items()), flush=True)
        del sets
        mx.clear_cache()

    (Path(a.out) / "dmm_kernel.json").write_text(json.dumps(results, indent=1))
    first = "k" + "_".join(map(str, variants[0])) + "_us"
    print(f"\n== summary (us per call, bf16; kernel = first variant {variants[0]}; GB/s of weight bytes)")
    print(f"{'shape':16s}   M    mlx  kernel  GB/s  mlx(M)/mlx(1)  kernel(M)/kernel(1)  mlx/kernel")
    base = {}
    for row in results["timing"]:
        k0 = row[first]
        if row["m"] == 1:
            base[row["shape"]] = (row["mlx_us"], k0)
        bm, bk = base[row["shape"]]
        print(f"{row['shape']:16s} {row['m']:3d} {row['mlx_us']:6.1f} {k0:7.1f} {row['bytes'] / k0 / 1e3:5.0f} "
              f"{row['mlx_us'] / bm:10.2f} {k0 / bk:16.2f} {row['mlx_us'] / k0:15.2f}")
    sums = {}
    for row in results["timing"]:
        if row["shape"] in ("lm_head",):
            continue
        for kk, vv in row.items():
            if kk.startswith("k") and kk.endswith("_us") and vv is not None:
                sums[kk] = sums.get(kk, 0.0) + vv
    print("sum over the 27B shapes (not lm_head) and M = 1/2/4/8: "
          + ", ".join(f"{kk[1:-3]} {vv:.0f}" for kk, vv in sorted(sums.items(), key=lambda kv: kv[1])))
    if failed:
        print("PARITY FAILURES:", len(failed))
        for f in failed[:20]:
            print("  ", f)
        sys.exit(1)
    print("parity: all variants passed")


if __name__ == "__main__":
    main()
