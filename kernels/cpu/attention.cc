// Causal attention over a KV cache on the CPU (attention.h).
#include "attention.h"

#include <cmath>
#include <type_traits>
#include <vector>

#include "matmul_core.h"

namespace tandem_kernels {
namespace {

using namespace core;

// out[0 .. U * 8) = the sum over keys j < n of s[j] * vr[j * d + column], over sum: U vectors of columns held
// in registers across all keys.
template <int U, class W>
TANDEM_INLINE void value_columns(const float* s, const W* vr, int64_t n, int64_t d, float sum, float* out) {
  f8 acc[U];
  zero<U>(acc);
  for (int64_t j = 0; j < n; ++j) {
    const f8 pv = {s[j], s[j], s[j], s[j], s[j], s[j], s[j], s[j]};
    for (int u = 0; u < U; ++u) acc[u] += pv * load8(vr + j * d + u * kLanes);
  }
  for (int u = 0; u < U; ++u) {
    for (int l = 0; l < kLanes; ++l) out[u * kLanes + l] = acc[u][l] / sum;
  }
}

// value_columns() for two queries over the same keys and values: each value vector loaded serves both, each
// query's columns summed in key order as alone.
template <int U, class W>
TANDEM_INLINE void value_columns2(const float* s0, const float* s1, const W* vr, int64_t n, int64_t d, float sum0,
                                  float sum1, float* out0, float* out1) {
  f8 a0[U], a1[U];
  zero<U>(a0);
  zero<U>(a1);
  for (int64_t j = 0; j < n; ++j) {
    const f8 p0 = {s0[j], s0[j], s0[j], s0[j], s0[j], s0[j], s0[j], s0[j]};
    const f8 p1 = {s1[j], s1[j], s1[j], s1[j], s1[j], s1[j], s1[j], s1[j]};
    for (int u = 0; u < U; ++u) {
      const f8 v = load8(vr + j * d + u * kLanes);
      a0[u] += p0 * v;
      a1[u] += p1 * v;
    }
  }
  for (int u = 0; u < U; ++u) {
    for (int l = 0; l < kLanes; ++l) {
      out0[u * kLanes + l] = a0[u][l] / sum0;
      out1[u * kLanes + l] = a1[u][l] / sum1;
    }
  }
}

// The softmax of one query's n scores in place (scaled, less their maximum, exp, summed in key order); returns
// the sum.
TANDEM_INLINE float softmax(float* s, int64_t n, float scale) {
  float m = -INFINITY;
  for (int64_t j = 0; j < n; ++j) {
    s[j] *= scale;
    m = std::max(m, s[j]);
  }
  float sum = 0.0f;
  for (int64_t j = 0; j < n; ++j) {
    s[j] = std::exp(s[j] - m);
    sum += s[j];
  }
  return sum;
}

// Value columns c0.. of one query past the vector part (d not a multiple of eight): summed in key order.
template <class W>
TANDEM_INLINE void value_tail(const float* s, const W* vr, int64_t n, int64_t d, float sum, float* out) {
  for (int64_t c = d - d % kLanes; c < d; ++c) {
    float a = 0.0f;
    for (int64_t j = 0; j < n; ++j) a += s[j] * load(vr + j * d, c);
    out[c] = a / sum;
  }
}

// One query (qf: D floats, already f32) over keys and values rows kr, vr (stride d elements, of type W: f32
// or bf16 bits) 0..n; writes the f32 result to out. `s` holds n scores. Scores go four keys a pass (each
// key's dot product dots<1>'s own arithmetic, so the same bits), and the weighted sum of values runs over
// 64 columns at a time held in registers across every key: each column sums its keys in order, as one
// accumulator in memory did, without a store and a reload a key.
template <class W>
TANDEM_INLINE void one_query(const float* qf, const W* kr, const W* vr, int64_t n, int64_t d, float scale, float* s,
                             float* out) {
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) dots<4>(qf, kr + j * d, d, s + j);
  for (; j < n; ++j) dots<1>(qf, kr + j * d, d, s + j);
  const float sum = softmax(s, n, scale);
  const int64_t dv = d - d % kLanes;
  int64_t c0 = 0;
  for (; c0 + 8 * kLanes <= dv; c0 += 8 * kLanes) value_columns<8>(s, vr + c0, n, d, sum, out + c0);
  for (; c0 < dv; c0 += kLanes) value_columns<1>(s, vr + c0, n, d, sum, out + c0);
  value_tail(s, vr, n, d, sum, out);
}

// one_query() for two queries of one key head that see the same n keys (two query heads sharing it, at the same
// position): each key and value vector loaded serves both (dots2, value_columns2), each query's arithmetic its own,
// so each gets the bits it gets alone.
template <class W>
TANDEM_INLINE void two_queries(const float* q0, const float* q1, const W* kr, const W* vr, int64_t n, int64_t d,
                               float scale, float* s0, float* s1, float* out0, float* out1) {
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) dots2<4>(q0, q1, kr + j * d, d, s0 + j, s1 + j);
  for (; j < n; ++j) dots2<1>(q0, q1, kr + j * d, d, s0 + j, s1 + j);
  const float sum0 = softmax(s0, n, scale), sum1 = softmax(s1, n, scale);
  const int64_t dv = d - d % kLanes;
  int64_t c0 = 0;
  for (; c0 + 4 * kLanes <= dv; c0 += 4 * kLanes)
    value_columns2<4>(s0, s1, vr + c0, n, d, sum0, sum1, out0 + c0, out1 + c0);
  for (; c0 < dv; c0 += kLanes) value_columns2<1>(s0, s1, vr + c0, n, d, sum0, sum1, out0 + c0, out1 + c0);
  value_tail(s0, vr, n, d, sum0, out0);
  value_tail(s1, vr, n, d, sum1, out1);
}

template <class W>
TANDEM_INLINE void heads(Elem e, const float* qf, const W* k, const W* v, float* of, int64_t hq, int64_t hkv,
                         int64_t t, int64_t d, int64_t cap, int64_t len, float scale, const void* k16,
                         const void* v16) {
  std::vector<float> s(len), s2(len), kw, vw;
  const int64_t rep = hq / hkv;
  for (int64_t g = 0; g < hkv; ++g) {
    const W* kr = nullptr;
    const W* vr = nullptr;
    if constexpr (std::is_same_v<W, float>) {
      if (e == Elem::F16) {
        // f16 has no cheap vector conversion everywhere: this head's rows go to f32 once for all its queries.
        const auto* kh = static_cast<const uint16_t*>(k16) + g * cap * d;
        const auto* vh = static_cast<const uint16_t*>(v16) + g * cap * d;
        kw.resize(len * d);
        vw.resize(len * d);
        for (int64_t i = 0; i < len * d; ++i) {
          kw[i] = f16_to_f32(kh[i]);
          vw[i] = f16_to_f32(vh[i]);
        }
        kr = kw.data();
        vr = vw.data();
      }
    }
    if (kr == nullptr) {
      kr = k + g * cap * d;
      vr = v + g * cap * d;
    }
    // Query heads of this key head in pairs, position by position (a pair sees the same keys).
    for (int64_t i = 0; i < t; ++i) {
      const int64_t n = len - t + i + 1;
      int64_t h = g * rep;
      for (; h + 1 < (g + 1) * rep; h += 2) {
        const int64_t r0 = (h * t + i) * d, r1 = ((h + 1) * t + i) * d;
        two_queries(qf + r0, qf + r1, kr, vr, n, d, scale, s.data(), s2.data(), of + r0, of + r1);
      }
      if (h < (g + 1) * rep) {
        const int64_t row = (h * t + i) * d;
        one_query(qf + row, kr, vr, n, d, scale, s.data(), of + row);
      }
    }
  }
}

TANDEM_CLONES void run_f32(Elem e, const float* qf, const float* k, const float* v, float* of, int64_t hq,
                           int64_t hkv, int64_t t, int64_t d, int64_t cap, int64_t len, float scale,
                           const void* k16, const void* v16) {
  heads(e, qf, k, v, of, hq, hkv, t, d, cap, len, scale, k16, v16);
}

TANDEM_CLONES void run_bf16(const float* qf, const uint16_t* k, const uint16_t* v, float* of, int64_t hq,
                            int64_t hkv, int64_t t, int64_t d, int64_t cap, int64_t len, float scale) {
  heads(Elem::BF16, qf, k, v, of, hq, hkv, t, d, cap, len, scale, nullptr, nullptr);
}

} // namespace

void attention(Elem e, const void* q, const void* k, const void* v, void* o, int64_t hq, int64_t hkv, int64_t t,
               int64_t d, int64_t cap, int64_t len, float scale) {
  if (hq <= 0 || hkv <= 0 || t <= 0 || d <= 0 || len < t || len > cap || hq % hkv != 0) return;
  std::vector<float> qs, os;
  const float* qf = widen_rows(e, q, hq * t * d, qs);
  float* of = f32_results(e, o, hq * t * d, os);
  switch (e) {
    case Elem::BF16:
      run_bf16(qf, static_cast<const uint16_t*>(k), static_cast<const uint16_t*>(v), of, hq, hkv, t, d, cap, len,
               scale);
      break;
    case Elem::F32:
      run_f32(e, qf, static_cast<const float*>(k), static_cast<const float*>(v), of, hq, hkv, t, d, cap, len, scale,
              nullptr, nullptr);
      break;
    case Elem::F16:
      // k and v are widened per head inside (run_f32 reads them through k16 / v16).
      run_f32(e, qf, nullptr, nullptr, of, hq, hkv, t, d, cap, len, scale, k, v);
      break;
  }
  store_rows(e, of, o, hq * t * d);
}

} // namespace tandem_kernels
