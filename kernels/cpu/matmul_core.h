// The matmul kernels' common core (dense_matmul.cc, quantized_matmul.cc): fp32 dot products in eight
// lanes (lane l sums elements l, l + 8, ... in order; GCC/Clang vector extensions), one fixed tree over the
// lanes, then the K tail; four weight rows share each pass over two rows of x. No fused multiply-adds
// (-ffp-contract=off in the build), so every code path gives an output the same bits, on every machine:
// which rows share a pass never changes a row's result, and a row's bits never depend on M.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "dense_matmul.h"
#include "mlx/types/half_types.h"

#if defined(__x86_64__) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__))
#define TANDEM_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define TANDEM_CLONES
#endif
#define TANDEM_INLINE inline __attribute__((always_inline))

namespace tandem_kernels::core {

constexpr int kLanes = 8;
constexpr int kRows = 4;

TANDEM_INLINE float bf16_to_f32(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even, as MLX's bfloat16 does; a NaN stays a NaN.
TANDEM_INLINE uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

inline float f16_to_f32(uint16_t b) {
  mlx::core::float16_t h;
  std::memcpy(&h, &b, 2);
  return static_cast<float>(h);
}

inline uint16_t f32_to_f16(float f) {
  mlx::core::float16_t h(f);
  uint16_t b;
  std::memcpy(&b, &h, 2);
  return b;
}

TANDEM_INLINE float load(const float* p, int64_t i) {
  return p[i];
}
TANDEM_INLINE float load(const uint16_t* p, int64_t i) {
  return bf16_to_f32(p[i]);
}

// Eight fp32 lanes (GCC/Clang vector extensions: AVX on x86-64-v3, two SSE or NEON registers elsewhere).
typedef float f8 __attribute__((vector_size(32)));
typedef uint32_t u32x8 __attribute__((vector_size(32)));

TANDEM_INLINE f8 load8(const float* p) {
  f8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
TANDEM_INLINE f8 load8(const uint16_t* p) {
  // Built from the eight elements, not by __builtin_convertvector of a loaded u16x8: GCC 12 widens that in two
  // halves and joins them (five instructions where this form gives the one `vpmovzxwd ymm, m128`); a third
  // of the attention kernel's time and half of a one-row bf16 matmul's went there.
  const u32x8 u = u32x8{p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7]} << 16;
  f8 v;
  std::memcpy(&v, &u, sizeof v);
  return v;
}

// n bf16 elements to f32, eight at a time.
TANDEM_INLINE void widen(const uint16_t* p, int64_t n, float* out) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const f8 v = load8(p + i);
    std::memcpy(out + i, &v, sizeof v);
  }
  for (; i < n; ++i) out[i] = bf16_to_f32(p[i]);
}

// The eight lanes in one fixed tree, then the K tail: an output's last steps.
template <class W>
TANDEM_INLINE float finish(f8 a, const float* xr, const W* wr, int64_t kv, int64_t k) {
  float s = ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
  for (int64_t c = kv; c < k; ++c) s += xr[c] * load(wr, c);
  return s;
}

typedef float f4 __attribute__((vector_size(16)));

// finish() for four outputs at once where K has no tail: the same tree, each output's pairs added in the
// same order (lanes l and l + 4, then the pairs' sums, then the halves), four outputs a vector add. The
// scalar tree, which stores the lanes and adds them one by one, was ~10 % of a call at K = 256.
TANDEM_INLINE void finish4(const f8* a, float* out) {
  f4 b[4];
  for (int r = 0; r < 4; ++r)
    b[r] = __builtin_shufflevector(a[r], a[r], 0, 1, 2, 3) + __builtin_shufflevector(a[r], a[r], 4, 5, 6, 7);
  const f4 c01 = __builtin_shufflevector(b[0], b[1], 0, 1, 4, 5) + __builtin_shufflevector(b[0], b[1], 2, 3, 6, 7);
  const f4 c23 = __builtin_shufflevector(b[2], b[3], 0, 1, 4, 5) + __builtin_shufflevector(b[2], b[3], 2, 3, 6, 7);
  const f4 s = __builtin_shufflevector(c01, c23, 0, 2, 4, 6) + __builtin_shufflevector(c01, c23, 1, 3, 5, 7);
  std::memcpy(out, &s, sizeof s);
}

// RR accumulators at zero. Assigned one by one: `f8 acc[RR] = {}` compiled to a `rep stosq` of the array on
// the stack before every dot product (GCC 12, x86-64), a third of a call's time at K = 256.
template <int RR>
TANDEM_INLINE void zero(f8* acc) {
  for (int r = 0; r < RR; ++r) acc[r] = f8{0, 0, 0, 0, 0, 0, 0, 0};
}

// out[r] for the RR accumulators of one row of x: finish4() where it applies, else finish() per output.
template <int RR, class W>
TANDEM_INLINE void finish_all(const f8* acc, const float* xr, const W* w, int64_t kv, int64_t k, float* out) {
  if constexpr (RR == 4) {
    if (kv == k) return finish4(acc, out);
  }
  for (int r = 0; r < RR; ++r) out[r] = finish(acc[r], xr, w + r * k, kv, k);
}

// out[r] = xr . w[r] for RR consecutive weight rows of k elements (f32, or bf16 bits): lane l sums the
// products of elements l, l + 8, ... in order.
template <int RR, class W>
TANDEM_INLINE void dots(const float* xr, const W* w, int64_t k, float* out) {
  f8 acc[RR];
  zero<RR>(acc);
  const int64_t kv = k - k % kLanes;
  for (int64_t c = 0; c < kv; c += kLanes) {
    const f8 xv = load8(xr + c);
    for (int r = 0; r < RR; ++r) acc[r] += xv * load8(w + r * k + c);
  }
  finish_all<RR>(acc, xr, w, kv, k, out);
}

// dots() for two rows of x at once: each weight vector loaded serves two products. Each output's
// arithmetic is dots()'s own (no fused multiply-add: the build passes -ffp-contract=off), so a row's bits
// do not change with its partner.
template <int RR, class W>
TANDEM_INLINE void dots2(const float* x0, const float* x1, const W* w, int64_t k, float* out0, float* out1) {
  f8 a0[RR], a1[RR];
  zero<RR>(a0);
  zero<RR>(a1);
  const int64_t kv = k - k % kLanes;
  for (int64_t c = 0; c < kv; c += kLanes) {
    const f8 xv0 = load8(x0 + c), xv1 = load8(x1 + c);
    for (int r = 0; r < RR; ++r) {
      const f8 wv = load8(w + r * k + c);
      a0[r] += xv0 * wv;
      a1[r] += xv1 * wv;
    }
  }
  finish_all<RR>(a0, x0, w, kv, k, out0);
  finish_all<RR>(a1, x1, w, kv, k, out1);
}

template <int RR, class W>
TANDEM_INLINE void pass(const float* xf, const W* wj, float* y, int64_t i0, int64_t i1, int64_t n, int64_t k,
                        int64_t j) {
  float d0[RR], d1[RR];
  int64_t i = i0;
  for (; i + 1 < i1; i += 2) {
    dots2<RR>(xf + i * k, xf + (i + 1) * k, wj, k, d0, d1);
    for (int r = 0; r < RR; ++r) {
      y[i * n + j + r] = d0[r];
      y[(i + 1) * n + j + r] = d1[r];
    }
  }
  if (i < i1) {
    dots<RR>(xf + i * k, wj, k, d0);
    for (int r = 0; r < RR; ++r) y[i * n + j + r] = d0[r];
  }
}

template <class W>
TANDEM_INLINE void group_pass(const float* xf, const W* wj, float* y, int64_t i0, int64_t i1, int64_t n, int64_t k,
                         int64_t j, int64_t rr) {
  switch (rr) {
    case 4: pass<4>(xf, wj, y, i0, i1, n, k, j); break;
    case 3: pass<3>(xf, wj, y, i0, i1, n, k, j); break;
    case 2: pass<2>(xf, wj, y, i0, i1, n, k, j); break;
    default: pass<1>(xf, wj, y, i0, i1, n, k, j); break;
  }
}

// x (count elements of e) as f32: x itself when it is f32, else widened into buf.
inline const float* widen_rows(Elem e, const void* x, int64_t count, std::vector<float>& buf) {
  if (e == Elem::F32) return static_cast<const float*>(x);
  buf.resize(count);
  const auto* xb = static_cast<const uint16_t*>(x);
  if (e == Elem::BF16) {
    widen(xb, count, buf.data());
  } else {
    for (int64_t i = 0; i < count; ++i) buf[i] = f16_to_f32(xb[i]);
  }
  return buf.data();
}

// Where the f32 results go: out itself when it is f32, else buf, which store_rows then rounds into out.
inline float* f32_results(Elem e, void* out, int64_t count, std::vector<float>& buf) {
  if (e == Elem::F32) return static_cast<float*>(out);
  buf.resize(count);
  return buf.data();
}

// The f32 results y rounded once into out (nothing to do when out is f32: y is out).
inline void store_rows(Elem e, const float* y, void* out, int64_t count) {
  if (e == Elem::F32) return;
  auto* o = static_cast<uint16_t*>(out);
  for (int64_t t = 0; t < count; ++t) o[t] = e == Elem::BF16 ? f32_to_bf16(y[t]) : f32_to_f16(y[t]);
}

} // namespace tandem_kernels::core
