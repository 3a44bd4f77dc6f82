"""The gated-delta kernel (kernels/cuda/gated_delta.cu{,h}) against MLX's `mx.fast.gated_delta_update` on
CUDA: parity for T = 1..9 (outputs, and each step's state against the op over that prefix), bit-identity
across T, then microseconds per call at the Qwen3.5-27B shape (Hk 16, Hv 48, Dk = Dv = 128) for the
kernel, MLX's op, and what a verify plus its rollback cost each way (the op runs again over the kept
prefix; the kernel's rollback is a slice). Run on the GPU machine (benches/gpu/kernels_bench.sh).
"""
import argparse
import statistics
import time
from pathlib import Path

import mlx.core as mx

ROOT = Path(__file__).resolve().parents[2]
HEADER = (ROOT / "kernels/cuda/gated_delta.cuh").read_text()
SOURCE = (ROOT / "kernels/cuda/gated_delta.cu").read_text()
TOL = 1e-5
KERNEL = mx.fast.cuda_kernel(
    name="tandem_gated_delta",
    input_names=["q", "k", "v", "g", "beta", "state"],
    output_names=["y", "states"],
    source=SOURCE,
    header=HEADER,
)


def kernel(q, k, v, g, beta, state, rows=4):
    b, t, hk, dk = q.shape
    hv, dv = v.shape[2], v.shape[3]
    y, states = KERNEL(
        inputs=[q, k, v, g, beta, state],
        template=[("DK", dk), ("DV", dv)],
        grid=(32, dv, b * hv),
        threadgroup=(32, min(rows, dv), 1),
        output_shapes=[(b, t, hv, dv), (t, b, hv, dv, dk)],
        output_dtypes=[mx.float32, mx.float32],
    )
    return y, states


def inputs(b, t, hk, hv, dk, dv, seed):
    keys = mx.random.split(mx.random.key(seed), 6)
    unit = lambda a: a / mx.sqrt(mx.sum(a * a, axis=-1, keepdims=True))  # noqa: E731
    q = unit(mx.random.normal((b, t, hk, dk), key=keys[0])) / dk**0.5
    k = unit(mx.random.normal((b, t, hk, dk), key=keys[1]))
    v = mx.random.normal((b, t, hv, dv), key=keys[2])
    g = mx.sigmoid(mx.random.normal((b, t, hv), key=keys[3])) * 0.5 + 0.5
    beta = mx.sigmoid(mx.random.normal((b, t, hv), key=keys[4]))
    s0 = mx.random.normal((b, hv, dv, dk), key=keys[5]) * 0.1
    mx.eval(q, k, v, g, beta, s0)
    return q, k, v, g, beta, s0


def rel(a, b):
    a, b = a.astype(mx.float32), b.astype(mx.float32)
    return (mx.sqrt(mx.sum((a - b) ** 2)) / mx.sqrt(mx.sum(b * b))).item()


def parity(configs, tmax=9):
    ok = True
    for i, (b, hk, hv, dk, dv) in enumerate(configs):
        q, k, v, g, beta, s0 = inputs(b, tmax, hk, hv, dk, dv, 40 + i)
        yf, sf = kernel(q, k, v, g, beta, s0)
        worst_y = worst_s = 0.0
        same = True
        for t in range(1, tmax + 1):
            sl = lambda a: a[:, :t]  # noqa: E731
            y, st = kernel(sl(q), sl(k), sl(v), sl(g), sl(beta), s0)
            yo, so = mx.fast.gated_delta_update(sl(q), sl(k), sl(v), sl(g), sl(beta), s0)
            worst_y = max(worst_y, rel(y, yo))
            worst_s = max(worst_s, rel(st[t - 1], so), rel(sf[t - 1], so))
            same &= mx.array_equal(y, yf[:, :t]).item() and mx.array_equal(st, sf[:t]).item()
        good = worst_y <= TOL and worst_s <= TOL and same
        ok &= good
        print(f"parity B={b} Hk={hk} Hv={hv} Dk={dk} Dv={dv}: outputs {worst_y:.2e}, states {worst_s:.2e} "
              f"from MLX's op (T = 1..{tmax}, tolerance {TOL:.0e}); bit-identical across T {same}"
              f"{'' if good else '  FAILED'}", flush=True)
    return ok


def timed(fn, reps=7, iters=200):
    mx.eval(fn())
    times = []
    for _ in range(reps):
        mx.synchronize()
        t0 = time.perf_counter()
        outs = [fn() for _ in range(iters)]
        mx.eval(outs)
        mx.synchronize()
        times.append((time.perf_counter() - t0) / iters * 1e6)
    return statistics.median(times)


def timing():
    hk, hv, dk, dv = 16, 48, 128, 128
    print("µs per call, one 27B linear-attention layer (Hk 16, Hv 48, Dk = Dv = 128); a verify of T tokens "
          "then a rollback keeping T - 1", flush=True)
    print("T | MLX op | kernel | MLX op + rollback re-run | kernel + rollback slice", flush=True)
    for t in range(1, 10):
        q, k, v, g, beta, s0 = inputs(1, t, hk, hv, dk, dv, 7)
        op = lambda: mx.fast.gated_delta_update(q, k, v, g, beta, s0)  # noqa: E731
        kn = lambda: kernel(q, k, v, g, beta, s0)  # noqa: E731
        keep = max(t - 1, 1)
        sl = lambda a: a[:, :keep]  # noqa: E731

        def op_rb():
            y, s = mx.fast.gated_delta_update(q, k, v, g, beta, s0)
            _, s2 = mx.fast.gated_delta_update(sl(q), sl(k), sl(v), sl(g), sl(beta), s0)
            return y, s, s2

        def kn_rb():
            y, st = kernel(q, k, v, g, beta, s0)
            return y, st, st[keep - 1] + 0  # the slice, materialised as the next step would read it

        print(f"{t} | {timed(op):.1f} | {timed(kn):.1f} | {timed(op_rb):.1f} | {timed(kn_rb):.1f}", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--no-timing", action="store_true")
    a = p.parse_args()
    print("mlx", mx.__version__, mx.default_device(), flush=True)
    ok = parity([(1, 16, 48, 128, 128), (1, 2, 4, 64, 64), (2, 2, 6, 128, 128), (1, 4, 8, 128, 64)])
    if not a.no_timing:
        timing()
    print("gdn parity", "PASSED" if ok else "FAILED")


if __name__ == "__main__":
    main()
