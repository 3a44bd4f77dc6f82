// y = x @ w^T on the CPU for dense f32, bf16 or f16 operands (kernels/README.md, "Dense matmul on the CPU").
// Replaces MLX's CPU matmul (its own bf16/f16 gemm, reference BLAS for f32 in the Linux wheels), which
// runs a 1 x 256 by 4096 x 256 product at ~2 GFLOP/s. Each output is one fp32 dot product in a fixed
// order, rounded once to the output dtype: a row of x gets the same bits whatever M is and whatever
// the other rows hold, so an MTP verify's logits are plain decoding's own.
#pragma once

#include <cstdint>

namespace tandem_kernels {

enum class Elem : uint8_t { F32, BF16, F16 };

// x: m rows of k elements, w: n rows of k elements, out: m rows of n elements, all row-major and of one
// element type. Single-threaded; its scratch: x and the products in f32 (m * k and m * n floats, for bf16
// and f16), a group of weight rows in f32 (4 * k floats for bf16, 64 * k for f16).
void dense_matmul_nt(Elem e, const void* x, const void* w, void* out, int64_t m, int64_t n, int64_t k);

} // namespace tandem_kernels
