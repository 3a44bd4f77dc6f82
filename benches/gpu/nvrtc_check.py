"""Compiles a matmul kernel of kernels/cuda (the quantized one, `qmm`, or the dense one, `dmm`) for sm_90 on a
machine without a GPU (NVRTC from PyPI) and prints each launch shape's registers, spills and shared memory, so a
kernel change is known to compile, and what it costs in registers, before device time is spent on it.

  python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
      -d /tmp/nvrtc "nvidia-cuda-nvrtc==13.*" "nvidia-cuda-runtime==13.*"
  for w in /tmp/nvrtc/*.whl; do python3 -m zipfile -e $w /tmp/nvrtc/ex; done
  python3 benches/gpu/nvrtc_check.py /tmp/nvrtc/ex/nvidia/cu13 "4,2,4,2,0,1;4,2,4,1,0,4"
  python3 benches/gpu/nvrtc_check.py /tmp/nvrtc/ex/nvidia/cu13 "2,4,2,1;2,4,1,4" dmm

Variants are the kernel's template integers (XD is 2), bf16 x: BITS,R,KS,U,P,S for qmm, R,KS,U,S for dmm. The
wrapper stands in for the __global__ function MLX's cuda_kernel generates around the body (.cu): the same inputs
and `*_shape` names.
"""
import ctypes
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


KERNELS = {  # name: (file stem, template integers, the generated function's parameters)
    "qmm": ("quantized_matmul", "BITS R KS U P S",
            "const __nv_bfloat16* x, const int* x_shape, const uint32_t* w, const int* w_shape, "
            "const __nv_bfloat16* scales, const __nv_bfloat16* biases, __nv_bfloat16* y"),
    "dmm": ("dense_matmul", "R KS U S",
            "const __nv_bfloat16* x, const int* x_shape, const __nv_bfloat16* w, const int* w_shape, "
            "__nv_bfloat16* y"),
}


def main():
    cuda, variants = Path(sys.argv[1]), sys.argv[2]
    stem, names, params = KERNELS[sys.argv[3] if len(sys.argv) > 3 else "qmm"]
    names = names.split()
    lib = ctypes.CDLL(str(cuda / "lib/libnvrtc.so.13"))
    header = (ROOT / f"kernels/cuda/{stem}.cuh").read_text()
    body = (ROOT / f"kernels/cuda/{stem}.cu").read_text()
    shapes = [tuple(int(v) for v in s.split(",")) for s in variants.split(";")]
    src = "#include <cuda_bf16.h>\n#include <cuda_fp16.h>\ntypedef unsigned int uint32_t;\n"
    src += "typedef unsigned long long uintptr_t;\n" + header + "\n"
    for i, shape in enumerate(shapes):
        if len(shape) != len(names):
            sys.exit(f"variant {shape}: {len(names)} integers needed ({','.join(names)})")
        consts = ", ".join(f"{n} = {v}" for n, v in zip(names, shape))
        src += f'extern "C" __global__ void k{i}({params}) {{\n  constexpr int {consts}, XD = 2;\n{body}\n}}\n'
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"qmm.cu", 0, None, None) == 0
    opts = [o.encode() for o in ["--gpu-architecture=sm_90", f"-I{cuda / 'include'}", "--std=c++17", "-Xptxas=-v"]]
    rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    log = log.value.decode()
    if rc != 0:
        sys.exit(f"NVRTC failed ({rc}):\n{log}")
    entry = None
    for line in log.splitlines():  # ptxas reports entries one after another: name, then its figures
        if "Compiling entry function" in line:
            entry = int(line.split("'k")[1].split("'")[0])
        elif entry is not None and ("registers" in line or "spill" in line):
            print(f"{','.join(names)}={','.join(map(str, shapes[entry]))}: {line.split(':', 1)[-1].strip()}")


if __name__ == "__main__":
    main()
