"""Device time of kernels/cuda/quantized_matmul per launch shape, measured by Nsight Compute (not by the host
clock, whose ~20 us of MLX host work per call hides the GPU at these sizes: kernels/README.md).

  ncu --clock-control none --kernel-name regex:tandem_qmm --metrics gpu__time_duration.sum,... --csv \
      python3 benches/gpu/qmm_device.py run --manifest M.json > K.csv
  python3 benches/gpu/qmm_device.py summarize K.csv M.json

`run` launches, for each shape of the 27B slice as the engine calls it (gate and up fused, q/k/v fused, the
linear attention's in_proj fused), each bit width, each M and each launch shape (R tiles per warp, KS warps per
block, U groups per round), CALLS launches, each evaluated alone, and writes the label of every launch in
order. Nsight Compute flushes the caches before each profiled kernel, so every call reads its weights from HBM.
A fifth field S sets the 8-row slabs of x one block takes (1: a block per slab, as for M <= 8; 0: all of them).
`summarize` matches the profiled kernels to the labels (launch order) and prints, per shape, bits and M, the
median device time and achieved bandwidth of each launch shape. Launch shapes with the same KS must give the same
bits whatever their R, U and P (only KS orders a row's sums): a difference prints SAME-BITS.
"""
import argparse
import csv
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GROUP = 64
SHAPES = [  # (name, N, K): the 27B slice's projections as the engine fuses them; its vocabulary is 4096
    ("mlp.gate_up", 34816, 5120),
    ("mlp.down", 5120, 17408),
    ("attn.qkv", 14336, 5120),
    ("linear.in_proj", 16480, 5120),
    ("o_proj/out_proj", 5120, 6144),
    ("lm_head", 4096, 5120),
]
VARIANTS = "2,4,2;2,8,2;2,16,2;1,8,2;1,16,2;2,8,4;1,8,4;4,8,2;2,4,4;1,4,2"


def run(a):
    import mlx.core as mx

    header = (ROOT / "kernels/cuda/quantized_matmul.cuh").read_text()
    source = (ROOT / "kernels/cuda/quantized_matmul.cu").read_text()
    kern = mx.fast.cuda_kernel(name="tandem_qmm_bf16", input_names=["x", "w", "scales", "biases"],
                               output_names=["y"], source=source, header=header)
    # R,KS,U[,P[,S]]: P (the load's L2 prefetch mode, kernels/cuda/quantized_matmul.cuh) defaults to 0; S (8-row
    # slabs of x a block takes) to 1, and 0 means every slab of M in one block.
    variants = [tuple(int(v) for v in (s + ",0,1").split(",")[:5]) for s in a.variants.split(";")]
    ms = [int(m) for m in a.ms.split(",")]
    labels = []
    for name, n, k in SHAPES:
        if a.shapes and name not in a.shapes.split(","):
            continue
        for bits in [int(b) for b in a.bits.split(",")]:
            mx.random.seed(n + k + bits)
            w, s, b = mx.quantize((mx.random.normal((n, k)) * 0.02).astype(mx.bfloat16), group_size=GROUP, bits=bits)
            x32 = mx.random.normal((max(ms), k)).astype(mx.bfloat16)
            mx.eval(w, s, b, x32)
            ref = None
            outs = {}  # (M, KS) -> the first output: a row's bits depend on KS alone, not on R, U or P
            for m in ms:
                x = x32[:m]
                for r, ks, u, pf, sv in variants:
                    slabs = (m + 7) // 8
                    sb = min(sv or slabs, slabs)
                    blocks = (n + 16 * r - 1) // (16 * r) * ((slabs + sb - 1) // sb)
                    for _ in range(a.calls):
                        y = kern(inputs=[x, w, s, b], template=[("BITS", bits), ("R", r), ("KS", ks), ("U", u), ("P", pf), ("S", sb), ("XD", 2)],
                                 grid=(blocks * 32 * ks, 1, 1), threadgroup=(32 * ks, 1, 1),
                                 output_shapes=[(m, n)], output_dtypes=[mx.bfloat16])[0]
                        mx.eval(y)
                        labels.append(dict(shape=name, n=n, k=k, bits=bits, m=m, variant=f"{r},{ks},{u},{pf},{sv}"))
                    first = outs.setdefault((m, ks), y)
                    if not mx.array_equal(first, y).item():
                        print(f"SAME-BITS {name} {bits}-bit M={m} {r},{ks},{u},{pf},{sv} differs from the first launch shape with KS {ks}",
                              file=sys.stderr, flush=True)
                    # Every launch shape must give the same rows within rounding (a wrong one shows here).
                    if ref is None or ref.shape[0] < m:
                        ref = (x.astype(mx.float32) @ mx.dequantize(w, s.astype(mx.float32), b.astype(mx.float32),
                                                                     group_size=GROUP, bits=bits).T)
                    err = (mx.sqrt(mx.sum((y.astype(mx.float32) - ref[:m]) ** 2)) / mx.sqrt(mx.sum(ref[:m] ** 2))).item()
                    if err > 2**-8:
                        print(f"PARITY {name} {bits}-bit M={m} {r},{ks},{u},{pf},{sv}: {err:.2e}", file=sys.stderr, flush=True)
    Path(a.manifest).write_text(json.dumps(labels))
    print(f"{len(labels)} launches", file=sys.stderr)


def summarize(a):
    labels = json.loads(Path(a.manifest).read_text())
    rows = [r for r in csv.reader(l for l in open(a.csv) if l.startswith('"'))]
    head, body = rows[0], rows[1:]
    col = {h: i for i, h in enumerate(head)}
    launches = defaultdict(dict)  # ncu's launch ID -> metric -> value
    order = []
    for r in body:
        if "tandem_qmm" not in r[col["Kernel Name"]]:
            continue
        lid = r[col["ID"]]
        if lid not in launches:
            order.append(lid)
        launches[lid][r[col["Metric Name"]]] = float(r[col["Metric Value"]].replace(",", ""))
    if len(order) != len(labels):
        sys.exit(f"{len(order)} profiled kernels, {len(labels)} labels: the run and the profile disagree")
    times = defaultdict(list)
    dram = defaultdict(list)
    for lid, lab in zip(order, labels):
        key = (lab["shape"], lab["n"], lab["k"], lab["bits"], lab["m"], lab["variant"])
        t = launches[lid].get("gpu__time_duration.sum")  # ns
        times[key].append(t / 1e3)
        if "dram__throughput.avg.pct_of_peak_sustained_elapsed" in launches[lid]:
            dram[key].append(launches[lid]["dram__throughput.avg.pct_of_peak_sustained_elapsed"])
    variants = list(dict.fromkeys(l["variant"] for l in labels))
    print(f"{'shape':16s} bits  M  " + "  ".join(f"{v:>8s}" for v in variants) + "   best  GB/s(best)")
    totals = defaultdict(lambda: defaultdict(float))  # (bits, m) -> variant -> sum us
    for key in dict.fromkeys((l["shape"], l["n"], l["k"], l["bits"], l["m"]) for l in labels):
        name, n, k, bits, m = key
        med = {v: statistics.median(times[key + (v,)]) for v in variants}
        best = min(med, key=med.get)
        nbytes = n * k * bits / 8 + 2 * n * (k // GROUP) * 2
        for v in variants:
            totals[(bits, m)][v] += med[v]
        pct = dram.get(key + (best,))
        print(f"{name:16s} {bits:4d} {m:2d}  " + "  ".join(f"{med[v]:8.1f}" for v in variants)
              + f"   {best}  {nbytes / med[best] / 1e3:.0f}" + (f" ({statistics.median(pct):.0f}% dram)" if pct else ""))
    print("\nsum over the shapes (us), per bits and M:")
    for (bits, m), per in totals.items():
        best = min(per, key=per.get)
        print(f"  {bits}-bit M={m:2d}: " + "  ".join(f"{v}={t:.1f}" for v, t in per.items()) + f"   best {best}")


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--manifest", required=True)
    r.add_argument("--variants", default=VARIANTS)
    r.add_argument("--bits", default="4,8")
    r.add_argument("--ms", default="1,4,8,32")
    r.add_argument("--calls", type=int, default=3)
    r.add_argument("--shapes", default="", help="only these shapes (names, comma-separated)")
    s = sub.add_parser("summarize")
    s.add_argument("csv")
    s.add_argument("manifest")
    a = p.parse_args()
    run(a) if a.cmd == "run" else summarize(a)


if __name__ == "__main__":
    main()
