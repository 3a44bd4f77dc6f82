// The elementwise chains on the CPU (elementwise.h). Each function below restates one MLX 0.32.4 CPU op on a
// float holding a T value: MLX computes a bf16 op in f32 and rounds its result to bf16 (mlx/types/bf16.h), so
// `round_to<T>` stands wherever an MLX op of storage type T returns. Written as branch-free element loops that
// GCC and Clang vectorize (x86-64-v3 clone, NEON); no fused multiply-adds but MLX's own explicit ones.
#include "elementwise.h"

#include <bit>
#include <cmath>
#include <vector>

#include "matmul_core.h"

namespace tandem_kernels {
namespace {

using namespace core;

// MLX's bf16 rounding (to nearest even; any NaN to 0x7FC0) seen as the f32 it stands for.
TANDEM_INLINE float bf16_round(float f) {
  return bf16_to_f32(f32_to_bf16(f));
}

template <Elem T>
TANDEM_INLINE float round_to(float f) {
  if constexpr (T == Elem::BF16) return bf16_round(f);
  return f;
}

template <Elem T>
TANDEM_INLINE float load_as_f32(const void* p, int64_t i) {
  if constexpr (T == Elem::BF16) return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
  return static_cast<const float*>(p)[i];
}

template <Elem T>
TANDEM_INLINE void store_from_f32(void* p, int64_t i, float f) {
  if constexpr (T == Elem::BF16) {
    static_cast<uint16_t*>(p)[i] = uint16_t(std::bit_cast<uint32_t>(f) >> 16);  // f is already a bf16 value
  } else {
    static_cast<float*>(p)[i] = f;
  }
}

// MLX's simd::exp (mlx/backend/cpu/simd/math.h): 2^i * p(f) for x * log2(e) = i + f, i = floor(x * log2(e) +
// 0.5) (MLX adds 0.5 in double; floor, then one more where the fraction reaches one half, is the same integer
// without the widening), p a degree-6 polynomial in explicit fused multiply-adds; NaN stays, above 88 is inf,
// below -88 is 0. The input is clamped before the integer part so that no lane converts an out-of-range float
// (those lanes take the selects at the end).
TANDEM_INLINE float mlx_exp(float x_init) {
  float xc = x_init > 88.0f ? 88.0f : x_init;
  xc = xc < -88.0f ? -88.0f : xc;
  xc = x_init != x_init ? 0.0f : xc;
  const float x = xc * 1.442695f;
  const float fl = std::floor(x);
  const float ipart = x - fl >= 0.5f ? fl + 1.0f : fl;
  const float fpart = x - ipart;
  float p = 1.535336188319500e-4f;
  p = std::fma(p, fpart, 1.339887440266574e-3f);
  p = std::fma(p, fpart, 9.618437357674640e-3f);
  p = std::fma(p, fpart, 5.550332471162809e-2f);
  p = std::fma(p, fpart, 2.402264791363012e-1f);
  p = std::fma(p, fpart, 6.931472028550421e-1f);
  p = std::fma(p, fpart, 1.000000000000000f);
  const float two_i = std::bit_cast<float>(uint32_t(int32_t(ipart) + 127) << 23);
  float r = two_i * p;
  r = x_init != x_init ? x_init : r;
  r = x_init > 88.0f ? INFINITY : r;
  return x_init < -88.0f ? 0.0f : r;
}

// MLX's simd::sin and simd::cos (mlx/backend/cpu/simd/math.h, Cephes' single-precision sincos): |x| reduced by
// the multiple j of pi/4 (j = trunc(|x| * 4/pi) rounded up to even) in three fused steps, then one of two
// polynomials in z = x^2 by j's bit 2, the sign by j's bit 4 (and x's sign for the sine). The same operations in
// the same order, MLX's fused multiply-adds explicit, so the same bits.
template <bool Sine>
TANDEM_INLINE float mlx_sincos(float v) {
  bool negative = v < 0.0f;
  float x = std::fabs(v);
  uint32_t j = static_cast<uint32_t>(x * 1.27323954473516f);
  j = (j + 1) & ~uint32_t(1);
  const float y = static_cast<float>(j);
  const bool other = (j & 2) != 0;
  x = std::fma(y, -0.78515625f, x);
  x = std::fma(y, -2.4187564849853515625e-4f, x);
  x = std::fma(y, -3.77489497744594108e-8f, x);
  negative = negative != ((j & 4) != 0);
  const bool cos_positive = ((j - 2) & 4) != 0;
  const float z = x * x;
  float c = std::fma(z, 2.443315711809948e-5f, -1.388731625493765e-3f);
  float s = std::fma(z, -1.9515295891e-4f, 8.3321608736e-3f);
  c = std::fma(c, z, 4.166664568298827e-2f);
  s = std::fma(s, z, -1.6666654611e-1f);
  c = c * z;
  s = s * z;
  c = c * z;
  s = std::fma(x, s, x);
  c = std::fma(z, -0.5f, c);
  c = c + 1.0f;
  if constexpr (Sine) {
    const float r = other ? c : s;
    return negative ? -r : r;
  } else {
    const float r = other ? s : c;
    return cos_positive ? r : -r;
  }
}

// MLX's Sigmoid (mlx/backend/cpu/unary_ops.h) on a T value x: y = 1 / (1 + exp(|x|)) with the exp rounded
// to T, the rest in f32, then y or 1 - y by x's sign, rounded to T.
template <Elem T>
TANDEM_INLINE float sigmoid(float x) {
  const float e = round_to<T>(mlx_exp(std::fabs(x)));
  const float y = 1.0f / (1.0f + e);
  return round_to<T>(x < 0.0f ? y : 1.0f - y);
}

// silu(x) = x * sigmoid(x), MLX's Multiply of two T values.
template <Elem T>
TANDEM_INLINE float silu(float x) {
  return round_to<T>(x * sigmoid<T>(x));
}

template <Chain C, Elem T>
TANDEM_INLINE float one(float a, float b) {
  if constexpr (C == Chain::Swiglu) return round_to<T>(silu<T>(a) * b);
  if constexpr (C == Chain::SigmoidGate) return round_to<T>(a * sigmoid<T>(b));
  if constexpr (C == Chain::Silu) return silu<T>(a);
  // SiluGate: z = b cast to f32 (exact), silu in f32, the product with the f32 a, rounded to T once.
  return round_to<T>(a * silu<Elem::F32>(b));
}

template <Chain C, Elem T>
TANDEM_INLINE void run(const void* a, int64_t sa, const void* b, int64_t sb, void* out, int64_t rows,
                       int64_t cols) {
  constexpr Elem TA = C == Chain::SiluGate ? Elem::F32 : T;
  constexpr size_t ea = TA == Elem::BF16 ? 2 : 4, et = T == Elem::BF16 ? 2 : 4;
  for (int64_t r = 0; r < rows; ++r) {
    const void* ar = static_cast<const uint8_t*>(a) + r * sa * static_cast<int64_t>(ea);
    const void* br = C == Chain::Silu ? ar : static_cast<const uint8_t*>(b) + r * sb * static_cast<int64_t>(et);
    void* o = static_cast<uint8_t*>(out) + r * cols * static_cast<int64_t>(et);
    for (int64_t c = 0; c < cols; ++c) {
      const float x = load_as_f32<TA>(ar, c);
      const float y = C == Chain::Silu ? 0.0f : load_as_f32<T>(br, c);
      store_from_f32<T>(o, c, one<C, T>(x, y));
    }
  }
}

template <Elem T>
TANDEM_INLINE void run_chain(Chain chain, const void* a, int64_t sa, const void* b, int64_t sb, void* out,
                             int64_t rows, int64_t cols) {
  switch (chain) {
    case Chain::Swiglu: return run<Chain::Swiglu, T>(a, sa, b, sb, out, rows, cols);
    case Chain::SigmoidGate: return run<Chain::SigmoidGate, T>(a, sa, b, sb, out, rows, cols);
    case Chain::Silu: return run<Chain::Silu, T>(a, sa, b, sb, out, rows, cols);
    case Chain::SiluGate: return run<Chain::SiluGate, T>(a, sa, b, sb, out, rows, cols);
  }
}

// Not templates: GCC builds target_clones only for plain functions.
TANDEM_CLONES void chain_bf16(Chain chain, const void* a, int64_t sa, const void* b, int64_t sb, void* out,
                            int64_t rows, int64_t cols) {
  run_chain<Elem::BF16>(chain, a, sa, b, sb, out, rows, cols);
}

TANDEM_CLONES void chain_f32(Chain chain, const void* a, int64_t sa, const void* b, int64_t sb, void* out,
                           int64_t rows, int64_t cols) {
  run_chain<Elem::F32>(chain, a, sa, b, sb, out, rows, cols);
}

template <Elem T>
TANDEM_INLINE void norm_rows(const void* x, int64_t sx, const float* w, void* out, int64_t rows, int64_t cols,
                             float eps, float inv_d) {
  constexpr int64_t et = T == Elem::BF16 ? 2 : 4;
  for (int64_t r = 0; r < rows; ++r) {
    const void* xr = static_cast<const uint8_t*>(x) + r * sx * et;
    void* o = static_cast<uint8_t*>(out) + r * cols * et;
    float ss = 0.0f;  // one chain of adds in element order, as MLX's reduction (no vector lanes)
    for (int64_t c = 0; c < cols; ++c) {
      const float v = load_as_f32<T>(xr, c);
      ss += v * v;
    }
    const float inv = 1.0f / std::sqrt(ss * inv_d + eps);
    for (int64_t c = 0; c < cols; ++c) store_from_f32<T>(o, c, round_to<T>((load_as_f32<T>(xr, c) * inv) * w[c]));
  }
}

TANDEM_CLONES void norm_bf16(const void* x, int64_t sx, const float* w, void* out, int64_t rows, int64_t cols,
                             float eps, float inv_d) {
  norm_rows<Elem::BF16>(x, sx, w, out, rows, cols, eps, inv_d);
}

TANDEM_CLONES void norm_f32(const void* x, int64_t sx, const float* w, void* out, int64_t rows, int64_t cols,
                            float eps, float inv_d) {
  norm_rows<Elem::F32>(x, sx, w, out, rows, cols, eps, inv_d);
}

// One head row of RoPE: x (its elements `sd` apart), cos and sin already rounded to T, out contiguous.
template <Elem T>
TANDEM_INLINE void rope_row(const void* x, int64_t sd, const float* cs, const float* sn, void* out, int64_t d,
                            int64_t dims) {
  const int64_t half = dims / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float x1 = load_as_f32<T>(x, i * sd), x2 = load_as_f32<T>(x, (i + half) * sd);
    // MLX's four Multiplies, then its Subtract and Add, each rounded to T.
    store_from_f32<T>(out, i, round_to<T>(round_to<T>(x1 * cs[i]) - round_to<T>(x2 * sn[i])));
    store_from_f32<T>(out, i + half, round_to<T>(round_to<T>(x1 * sn[i]) + round_to<T>(x2 * cs[i])));
  }
  for (int64_t j = dims; j < d; ++j) store_from_f32<T>(out, j, load_as_f32<T>(x, j * sd));
}

template <Elem T>
void rope_all(const void* x, const int64_t* s, const int32_t* offsets, int64_t n_offsets, void* out, int64_t b,
              int64_t n, int64_t t, int64_t d, int64_t dims, float base, float scale) {
  constexpr int64_t et = T == Elem::BF16 ? 2 : 4;
  const int64_t half = dims / 2;
  // The inverse frequencies: exp(arange(0, -half, -1) * (log(base) / half)), all f32 (std::log of a float and
  // a float over an int, as MLX's fallback writes them).
  const float c = std::log(base) / static_cast<float>(static_cast<int>(half));
  std::vector<float> inv(half), cs(half), sn(half);
  for (int64_t i = 0; i < half; ++i) inv[i] = mlx_exp(static_cast<float>(-i) * c);
  for (int64_t bi = 0; bi < b; ++bi) {
    const float off = static_cast<float>(offsets[n_offsets == 1 ? 0 : bi]);
    for (int64_t ti = 0; ti < t; ++ti) {
      // (arange(T) + offset) * scale in f32, its angles, their cos and sin rounded to T (MLX's AsType).
      const float position = (static_cast<float>(ti) + off) * scale;
      for (int64_t i = 0; i < half; ++i) {
        const float theta = position * inv[i];
        cs[i] = round_to<T>(mlx_sincos<false>(theta));
        sn[i] = round_to<T>(mlx_sincos<true>(theta));
      }
      for (int64_t ni = 0; ni < n; ++ni) {
        const auto* xr = static_cast<const uint8_t*>(x) + (bi * s[0] + ni * s[1] + ti * s[2]) * et;
        auto* o = static_cast<uint8_t*>(out) + (((bi * n + ni) * t + ti) * d) * et;
        rope_row<T>(xr, s[3], cs.data(), sn.data(), o, d, dims);
      }
    }
  }
}

} // namespace

void rope(Elem t, const void* x, const int64_t* strides, const int32_t* offsets, int64_t n_offsets, void* out,
          int64_t b, int64_t n, int64_t tokens, int64_t d, int64_t dims, float base, float scale) {
  if (b <= 0 || n <= 0 || tokens <= 0 || d <= 0 || dims < 2 || dims > d || dims % 2 != 0 || n_offsets <= 0) return;
  if (t == Elem::BF16) {
    rope_all<Elem::BF16>(x, strides, offsets, n_offsets, out, b, n, tokens, d, dims, base, scale);
  } else if (t == Elem::F32) {
    rope_all<Elem::F32>(x, strides, offsets, n_offsets, out, b, n, tokens, d, dims, base, scale);
  }
}

void rms_norm(Elem t, const void* x, int64_t sx, const float* w, void* out, int64_t rows, int64_t cols, float eps,
              float inv_d) {
  if (rows <= 0 || cols <= 0) return;
  if (t == Elem::BF16) {
    norm_bf16(x, sx, w, out, rows, cols, eps, inv_d);
  } else if (t == Elem::F32) {
    norm_f32(x, sx, w, out, rows, cols, eps, inv_d);
  }
}

void elementwise(Chain chain, Elem t, const void* a, int64_t sa, const void* b, int64_t sb, void* out, int64_t rows,
                 int64_t cols) {
  if (rows <= 0 || cols <= 0) return;
  if (t == Elem::BF16) {
    chain_bf16(chain, a, sa, b, sb, out, rows, cols);
  } else if (t == Elem::F32) {
    chain_f32(chain, a, sa, b, sb, out, rows, cols);
  }
}

void gated_norm(Elem t, const float* o, const void* z, int64_t sz, const float* w, void* out, int64_t rows,
                int64_t heads, int64_t cols, float eps, float inv_d) {
  if (rows <= 0 || heads <= 0 || cols <= 0 || (t != Elem::F32 && t != Elem::BF16)) return;
  const int64_t width = heads * cols;
  std::vector<float> n(rows * width);
  rms_norm(Elem::F32, o, cols, w, n.data(), rows * heads, cols, eps, inv_d);
  elementwise(Chain::SiluGate, t, n.data(), width, z, sz, out, rows, width);
}

} // namespace tandem_kernels
