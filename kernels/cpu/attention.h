// Causal attention of T queries over the first `len` positions of a KV cache's buffers, on the CPU
// (kernels/README.md, "Attention on the CPU"). Replaces MLX 0.32.4's CPU scaled_dot_product_attention, which
// has no CPU kernel: its fallback runs a bf16 gemm of its own (~2 GFLOP/s), a mask, a softmax and a second
// gemm; at a 2,048-token context that was over 60 % of tandem-tiny's decoding time, and an MTP verify there
// ran at a third of plain decoding's speed.
//
// Query t (of T) sees keys 0 .. len - T + t (bottom-right causal, as a decode step, a verify or a prefill
// chunk over a cache). For each query head h (key head h / (HQ / HKV)), in fp32: s_j = (q . k_j) * scale (the
// matmul kernels' fixed-order dot, matmul_core.h), p_j = exp(s_j - max s), o = (sum_j p_j v_j) / sum_j p_j, summed
// in key order, rounded once to the output dtype. A query's result depends only on its own row and the keys
// it sees, so a verify's query t gets the bits of a decode step over the same keys.
#pragma once

#include <cstdint>

#include "dense_matmul.h"

namespace tandem_kernels {

// q [HQ, T, D] and o [HQ, T, D]; k and v [HKV, CAP, D] (the cache's buffers, only the first `len` rows of each
// head read); one element type for all (f32, bf16 or f16), row-major; HQ a multiple of HKV, 1 <= T <= len <= CAP.
// Single-threaded; its scratch: len + 2 * D floats, and for f16 the key and value rows of one head in f32.
void attention(Elem e, const void* q, const void* k, const void* v, void* o, int64_t hq, int64_t hkv, int64_t t,
               int64_t d, int64_t cap, int64_t len, float scale);

} // namespace tandem_kernels
