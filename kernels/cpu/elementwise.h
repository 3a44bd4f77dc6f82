// The forward pass's elementwise chains, and the RMSNorm beside them, on the CPU (kernels/README.md, "Elementwise chains on the CPU"), with the
// bits of MLX's own CPU ops. MLX 0.32.4's Linux wheels build their CPU backend without AVX, so the chains it
// compiles (src/kernels/fused.rs) run one element at a time, each exp a scalar polynomial whose fused
// multiply-adds are libm calls: ~20 % of MLX's CPU thread in a two-stream MTP run of tandem-tiny. These loops
// compute the same operations in the same order and precision (MLX's exp polynomial, its sigmoid form, a bf16
// result rounded wherever MLX's op rounds), so a compiler can put eight elements in a vector: the same
// outputs, bit for bit (tests/it/elementwise_kernel.rs checks every bf16 input against MLX).
#pragma once

#include <cstdint>

#include "dense_matmul.h"

namespace tandem_kernels {

// T is the chain's storage type (bf16 or f32): each MLX op of the chain rounds its result to T.
enum class Chain : uint8_t {
  Swiglu,       // a * sigmoid(a) * b: gate a, up b (both T), out T
  SigmoidGate,  // a * sigmoid(b): a and b T, out T
  Silu,         // a * sigmoid(a): a T, out T (b unused)
  SiluGate,     // a * (z * sigmoid(z)) with z = b in f32: a f32, b T, out T; the product in f32, rounded once
};

// out[r * cols + c] = chain(a[r * sa + c], b[r * sb + c]) for r < rows, c < cols (sa, sb: row strides in
// elements). T is `t` (F32 or BF16); a is f32 for SiluGate. Single-threaded; no scratch.
void elementwise(Chain chain, Elem t, const void* a, int64_t sa, const void* b, int64_t sb, void* out, int64_t rows,
                 int64_t cols);

// RMSNorm as MLX's op-by-op norm computes it on its CPU (src/kernels/norm.rs): per row of x (T, f32 or bf16;
// row stride sx), ss = x_0^2 + x_1^2 + ... summed in order in f32 (MLX's CPU sum reduction), r = 1 / sqrt(ss *
// inv_d + eps), out_c = round_T((x_c * r) * w_c) with w f32. out is contiguous.
void rms_norm(Elem t, const void* x, int64_t sx, const float* w, void* out, int64_t rows, int64_t cols, float eps,
              float inv_d);

// A Gated DeltaNet layer's gated norm, out = SiluGate(rms_norm(o), z) per head: o f32 [R, H, D] (contiguous),
// z T [R, H * D] with row stride sz, w f32 [D]; each head's D values normalised as rms_norm does (f32 out), then
// the SiluGate chain with z rounding to T once. The bits of those two, without the reshapes and the normalised
// array between them. out is T [R, H * D], contiguous. Scratch: the normalised o.
void gated_norm(Elem t, const float* o, const void* z, int64_t sz, const float* w, void* out, int64_t rows,
                int64_t heads, int64_t cols, float eps, float inv_d);

// RoPE in its rotate-half form as MLX's fast::rope computes it on its CPU (its op-by-op fallback, about 28
// operations a call): x T [B, N, T, D] (element strides `strides[0..4]`), positions offsets[b] + t (one offset
// for every row where n_offsets is 1) times `scale`, the first `dims` features rotated by angles position *
// exp(-i * log(base) / (dims / 2)) (MLX's exp), the angles in f32, their cos and sin by MLX's polynomials and
// rounded to T, each product, difference and sum rounded to T; features past `dims` copied. out is T [B, N, T,
// D], contiguous.
// Scratch: the frequencies and one position's cos and sin.
void rope(Elem t, const void* x, const int64_t* strides, const int32_t* offsets, int64_t n_offsets, void* out,
          int64_t b, int64_t n, int64_t tokens, int64_t d, int64_t dims, float base, float scale);

} // namespace tandem_kernels
