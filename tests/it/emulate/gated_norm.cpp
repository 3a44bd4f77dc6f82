// CPU emulation of kernels/cuda/rms_norm.cuh's `gated_norm` through its body gated_norm.cu (run by
// tests/it/norm_kernel.rs; threads and shuffles from cuda_threads.h, bf16 storage emulated as float). z is
// read through its strides as a slice of a wider array, o through transposed strides, as MLX passes a strided
// kernel's inputs. Checks the output against a double-precision reference, and that every token of a
// many-token call is bit-identical to that token alone (a verify's or a batch's gated norm is decoding's).
// Exits 1 on a failure.
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include "cuda_threads.h"
#include NORM_CUH

using Shape = std::array<int32_t, 10>;
using Strides = std::array<int64_t, 10>;
constexpr int HEADS = tandem_norm::GATED_HEADS;

// One call over o [b, t, h, d] (held as [b, h, t, d], read through strides), z a slice at column `off` of a
// [b, t, wide] array (wide >= off + h·d), w [d]: y [b, t, h·d].
std::vector<float> run(const std::vector<float>& o_bhtd, const std::vector<__nv_bfloat16>& zw, int wide, int off,
                       const std::vector<float>& wv, int b, int t, int h, int d, float eps_value) {
  std::vector<__nv_bfloat16> yb((size_t)b * t * h * d, {NAN});  // an element left unwritten shows
  Shape o_shape{b, t, h, d};
  Strides o_strides{(int64_t)h * t * d, d, (int64_t)t * d, 1};
  Strides z_strides{(int64_t)t * wide, wide, 1};
  Strides w_strides{1};
  int EPS;
  std::memcpy(&EPS, &eps_value, 4);
  const int warps = b * t * h, blocks = (warps + HEADS - 1) / HEADS;
  for (int blk = 0; blk < blocks; ++blk) {
    run_block({blk, 0, 0}, 32 * HEADS, [&] {
      const float* o = o_bhtd.data();
      const __nv_bfloat16* z = zw.data() + off;
      const float* w = wv.data();
      __nv_bfloat16* y = yb.data();
#include GATED_NORM_BODY
    });
  }
  std::vector<float> out;
  for (auto& v : yb) {
    if (std::isnan(v.f)) {
      printf("[%d, %d, %d, %d]: an output element was not written\n", b, t, h, d);
      std::exit(1);
    }
    out.push_back(v.f);
  }
  return out;
}

int main() {
  std::mt19937 g(11);
  std::normal_distribution<float> n(0, 1);
  const float eps = 1e-6f;
  for (auto [b, t, h, d] : {std::array{1, 1, 4, 128}, std::array{2, 3, 6, 128}, std::array{1, 5, 3, 20},
                            std::array{1, 2, 5, 33}}) {
    const int off = 3, wide = h * d + 7;
    std::vector<float> o((size_t)b * h * t * d), w(d);
    std::vector<__nv_bfloat16> z((size_t)b * t * wide);
    for (auto& v : o) v = n(g);
    for (auto& v : z) v.f = 3 * n(g);
    for (auto& v : w) v = 1 + 0.1f * n(g);
    std::vector<float> all = run(o, z, wide, off, w, b, t, h, d, eps);
    double worst = 0;
    for (int bi = 0; bi < b; ++bi)
      for (int ti = 0; ti < t; ++ti) {
        // This token alone: its o rows and its z row, as a call of one token.
        std::vector<float> o1((size_t)h * d);
        for (int hi = 0; hi < h; ++hi)
          for (int j = 0; j < d; ++j) o1[(size_t)hi * d + j] = o[(((size_t)bi * h + hi) * t + ti) * d + j];
        std::vector<__nv_bfloat16> z1(z.begin() + ((size_t)bi * t + ti) * wide, z.begin() + ((size_t)bi * t + ti + 1) * wide);
        std::vector<float> alone = run(o1, z1, wide, off, w, 1, 1, h, d, eps);
        const float* got = all.data() + ((size_t)bi * t + ti) * h * d;
        if (std::memcmp(alone.data(), got, (size_t)h * d * 4) != 0) {
          printf("[%d, %d, %d, %d] token (%d, %d): differs from the token alone\n", b, t, h, d, bi, ti);
          return 1;
        }
        for (int hi = 0; hi < h; ++hi) {
          double ss = 0;
          for (int j = 0; j < d; ++j) ss += (double)o1[(size_t)hi * d + j] * o1[(size_t)hi * d + j];
          const double inv = 1 / std::sqrt(ss / d + eps);
          for (int j = 0; j < d; ++j) {
            const double zz = z1[off + (size_t)hi * d + j].f;
            const double want = w[j] * o1[(size_t)hi * d + j] * inv * zz / (1 + std::exp(-zz));
            worst = std::max(worst, std::abs(want - got[(size_t)hi * d + j]) / std::max(1e-3, std::abs(want)));
          }
        }
      }
    printf("[%d, %d, %d, %d]: worst relative error %.2e against double, every token identical alone\n", b, t, h, d,
           worst);
    if (!(worst < 1e-5)) return 1;
  }
  return 0;
}
