"""MLX's host cost per operation on CUDA, outside Tandem: chains of N operations on a [1, 5120] bf16 row, each
timed as building the chain (Python and MLX's graph), launching it (`async_eval` until it returns) and waiting
for the device. Kinds: `add` (an elementwise op), `reshape` (no kernel), and a custom kernel (`y = x + 1`)
with a tiny header and with a 16 KB one (MLX pastes the header into the source at every call and hashes the
whole source at every launch). Run once with MLX_USE_CUDA_GRAPHS=0 as well to see the graphs' part.
Prints microseconds per operation, medians of REPS chains after a warm-up."""
import os
import statistics
import sys
import time

import mlx.core as mx

N = int(os.environ.get("CHAIN", "400"))
REPS = int(os.environ.get("REPS", "7"))

x = mx.zeros((1, 5120), dtype=mx.bfloat16)
mx.eval(x)
SRC = "unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < x_size) y[i] = T(static_cast<float>(x[i]) + 1.0f);"
BIG = "".join(f"// header line {i:05d} padding padding padding padding padding padding\n" for i in range(230))


def kernel(header, name):
    k = mx.fast.cuda_kernel(name=name, input_names=["x"], output_names=["y"], source=SRC.replace("x_size", "5120"), header=header)

    def call(y):
        return k(inputs=[y], output_shapes=[y.shape], output_dtypes=[y.dtype], grid=(5120, 1, 1), threadgroup=(256, 1, 1),
                 template=[("T", y.dtype)])[0]

    return call


KINDS = {"add": lambda y: y + 1, "reshape": lambda y: y.reshape(1, 1, 5120).reshape(1, 5120)}
try:
    KINDS["kernel_tiny_header"] = kernel("", "cost_tiny")
    KINDS[f"kernel_{len(BIG) // 1024}k_header"] = kernel(BIG, "cost_big")
except RuntimeError as e:  # no CUDA here
    print(f"custom kernels left out: {e}")


def once(op):
    t0 = time.perf_counter()
    y = x
    for _ in range(N):
        y = op(y)
    t1 = time.perf_counter()
    mx.async_eval(y)
    t2 = time.perf_counter()
    mx.eval(y)
    t3 = time.perf_counter()
    return t1 - t0, t2 - t1, t3 - t2


graphs = os.environ.get("MLX_USE_CUDA_GRAPHS", "1")
for name, op in KINDS.items():
    try:
        once(op)
    except RuntimeError as e:  # a kernel that does not compile here: say so, time the rest
        print(f"mlx host cost, {name}: failed: {str(e).splitlines()[0]}")
        continue
    runs = [once(op) for _ in range(REPS)]
    build, launch, wait = (statistics.median(r[i] for r in runs) * 1e6 / N for i in range(3))
    print(f"mlx host cost, graphs={graphs}, {name}: build {build:.2f} launch {launch:.2f} wait {wait:.2f} us/op ({N} ops)")
sys.stdout.flush()
