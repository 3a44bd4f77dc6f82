// y = x @ dequantize(w)^T on the CPU for MLX's affine quantized weights (kernels/README.md, "Quantized
// matmul on the CPU"): 2, 4 or 8 bits packed in uint32 words (element e in bits [e * bits % 32, ...) of word
// e * bits / 32), a scale and a bias per group of `group` elements along K. Replaces MLX's CPU
// `quantized_matmul` (~1 GFLOP/s, and in bf16 an accumulation in bf16). Each weight row is dequantized to
// fp32 (scale * q + bias) and goes through the dense kernel's dot products: each output one fp32 dot
// product in a fixed order, rounded once, a row of x the same bits whatever M.
#pragma once

#include <cstdint>

#include "dense_matmul.h"

namespace tandem_kernels {

// x: m rows of k elements (ex), wq: n rows of k * bits / 32 words, scales and biases: n rows of k / group
// elements (es), out: m rows of n elements (ex). k a multiple of group, group a multiple of 8, bits 2, 4
// or 8.
void quantized_matmul_nt(Elem ex, const void* x, const uint32_t* wq, Elem es, const void* scales,
                         const void* biases, void* out, int64_t m, int64_t n, int64_t k, int64_t group, int bits);

} // namespace tandem_kernels
