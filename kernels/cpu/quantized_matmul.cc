// y = x @ dequantize(w)^T on the CPU (quantized_matmul.h). Four weight rows at a time are dequantized to
// fp32 (eight elements a vector; scale * q, then + bias, unfused) into a
// scratch of 4 * k floats, which matmul_core.h's passes then take over every row of x in the block.
#include "quantized_matmul.h"

#include "matmul_core.h"

namespace tandem_kernels {
namespace {

using namespace core;

typedef int32_t i32x8 __attribute__((vector_size(32)));

// Elements e .. e + 7 of a packed row as integers (e a multiple of 8).
template <int BITS>
TANDEM_INLINE u32x8 unpack8(const uint32_t* row, int64_t e) {
  if constexpr (BITS == 4) {
    const uint32_t w = row[e / 8];
    const u32x8 v = {w, w, w, w, w, w, w, w};
    return (v >> u32x8{0, 4, 8, 12, 16, 20, 24, 28}) & 15u;
  } else if constexpr (BITS == 8) {
    const uint32_t a = row[e / 4], b = row[e / 4 + 1];
    const u32x8 v = {a, a, a, a, b, b, b, b};
    return (v >> u32x8{0, 8, 16, 24, 0, 8, 16, 24}) & 255u;
  } else {
    static_assert(BITS == 2);
    const uint32_t w = row[e / 16] >> ((e / 8 % 2) * 16);
    const u32x8 v = {w, w, w, w, w, w, w, w};
    return (v >> u32x8{0, 2, 4, 6, 8, 10, 12, 14}) & 3u;
  }
}

TANDEM_INLINE float scalar(Elem e, const void* p, int64_t i) {
  switch (e) {
    case Elem::F32: return static_cast<const float*>(p)[i];
    case Elem::BF16: return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    default: return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
  }
}

// rr weight rows from row j, dequantized into wf (rr * k floats).
template <int BITS>
TANDEM_INLINE void dequantize_rows(const uint32_t* wq, Elem es, const void* scales, const void* biases, int64_t k,
                                   int64_t group, int64_t j, int64_t rr, float* wf) {
  const int64_t words = k * BITS / 32, groups = k / group;
  for (int64_t r = 0; r < rr; ++r) {
    const uint32_t* row = wq + (j + r) * words;
    float* out = wf + r * k;
    for (int64_t g = 0; g < groups; ++g) {
      const float s = scalar(es, scales, (j + r) * groups + g), b = scalar(es, biases, (j + r) * groups + g);
      const f8 sv = {s, s, s, s, s, s, s, s}, bv = {b, b, b, b, b, b, b, b};
      for (int64_t c = g * group; c < (g + 1) * group; c += kLanes) {
        const f8 q = __builtin_convertvector((i32x8)unpack8<BITS>(row, c), f8);
        const f8 v = q * sv + bv;
        std::memcpy(out + c, &v, sizeof v);
      }
    }
  }
}

template <int BITS>
TANDEM_INLINE void rows(const float* xf, const uint32_t* wq, Elem es, const void* scales, const void* biases, float* y,
                        int64_t m, int64_t n, int64_t k, int64_t group, float* wf) {
  constexpr int64_t kBlock = 16;
  for (int64_t i0 = 0; i0 < m; i0 += kBlock) {
    const int64_t i1 = std::min(m, i0 + kBlock);
    for (int64_t j = 0; j < n; j += kRows) {
      const int64_t rr = std::min<int64_t>(kRows, n - j);
      dequantize_rows<BITS>(wq, es, scales, biases, k, group, j, rr, wf);
      group_pass(xf, static_cast<const float*>(wf), y, i0, i1, n, k, j, rr);
    }
  }
}

TANDEM_CLONES void rows_q(const float* xf, const uint32_t* wq, Elem es, const void* scales, const void* biases, float* y,
                          int64_t m, int64_t n, int64_t k, int64_t group, int bits, float* wf) {
  switch (bits) {
    case 2: rows<2>(xf, wq, es, scales, biases, y, m, n, k, group, wf); break;
    case 4: rows<4>(xf, wq, es, scales, biases, y, m, n, k, group, wf); break;
    default: rows<8>(xf, wq, es, scales, biases, y, m, n, k, group, wf); break;
  }
}

} // namespace

void quantized_matmul_nt(Elem ex, const void* x, const uint32_t* wq, Elem es, const void* scales,
                         const void* biases, void* out, int64_t m, int64_t n, int64_t k, int64_t group, int bits) {
  if (m <= 0 || n <= 0) return;
  std::vector<float> xs, ys, wf(kRows * k);
  const float* xf = widen_rows(ex, x, m * k, xs);
  float* y = f32_results(ex, out, m * n, ys);
  rows_q(xf, wq, es, scales, biases, y, m, n, k, group, bits, wf.data());
  store_rows(ex, y, out, m * n);
}

} // namespace tandem_kernels
