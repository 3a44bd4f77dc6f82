// The gated-delta recurrence of a Gated DeltaNet layer on the CPU, with the state after every token
// (kernels/README.md, "Gated delta on the CPU"). Replaces MLX 0.32.4's CPU gated_delta_update, which has no
// CPU kernel and runs as a loop of MLX operations, about seven a token and layer (a two-stream MTP verify of
// tandem-tiny paid ~1,100 extra operations for it), and whose rollback to an accepted prefix ran it again.
//
// For each batch b, value head h (key head h / (HV / HK)) and token t, on the state row S[dv] (DK floats):
//   S = S * g[t];  kv = S . k[t];  delta = (v[t][dv] - kv) * beta[t];  S = S + k[t] * delta;  y = S . q[t]
// Each product and sum rounded as MLX's ops round them (no fused multiply-adds); the two dot products in the
// matmul kernels' fixed order (matmul_core.h). Nothing depends on T or on another row, so a token's output
// and state are the same bits whether it is a call's only token (a decode step) or one of a verify's.
#pragma once

#include <cstdint>

namespace tandem_kernels {

// q, k [B, T, HK, DK]; v [B, T, HV, DV]; g, beta [B, T, HV]; state [B, HV, DV, DK]; all f32, row-major,
// HV a multiple of HK. Writes y [B, T, HV, DV] and, with all_steps, states [T, B, HV, DV, DK] (the state
// after each token), else states [1, B, HV, DV, DK] (after the last; the input state when T is 0).
// Single-threaded, no scratch.
void gated_delta(const float* q, const float* k, const float* v, const float* g, const float* beta,
                 const float* state, float* y, float* states, int64_t B, int64_t T, int64_t HK, int64_t HV,
                 int64_t DK, int64_t DV, bool all_steps);

// The same from a Gated DeltaNet layer's conv output qkv [B, T, 2 HK DK + HV DV] (f32, row-major): q and k are
// its first two blocks of channels by heads, each row normalised as rms_norm (elementwise.h) computes it with
// the scales qs, ks [DK], eps and inv_d = 1 / DK; v the last block. The bits of those norms followed by
// gated_delta, without the layer's split, reshapes and norms as operations of their own; every step's state
// (decode and verify widths: all_steps). Scratch: q, k and v.
void gated_delta_qkv(const float* qkv, const float* qs, const float* ks, float eps, float inv_d, const float* g,
                     const float* beta, const float* state, float* y, float* states, int64_t B, int64_t T, int64_t HK,
                     int64_t HV, int64_t DK, int64_t DV);

} // namespace tandem_kernels
