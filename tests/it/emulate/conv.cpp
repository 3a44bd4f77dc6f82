// CPU emulation of kernels/cuda/conv_silu.cuh (run by tests/it/conv_kernel.rs, which compiles it with the
// machine's C++ compiler): every thread of the launch run in turn, bf16 storage emulated as float. Checks
// the output against a double-precision reference, and that each position of a T-position call is
// bit-identical to a one-position call over its own window (a verify's conv is decoding's). Exits 1 on a
// failure.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>
#include "cuda_serial.h"
#include CONV_CUH

constexpr int K = 4;
std::vector<float> run(const std::vector<__nv_bfloat16>& x, const std::vector<float>& w, int b, int l, int c) {
  int steps = l - K + 1;
  std::vector<float> y((size_t)b * steps * c, NAN);
  int x_shape[3] = {b, l, c};
  blockDim = {256, 1, 1};
  for (int bz = 0; bz < b; ++bz)
    for (int by = 0; by < steps; ++by)
      for (int bx = 0; bx < (c + 255) / 256; ++bx)
        for (int tx = 0; tx < 256; ++tx) {
          blockIdx = {bx, by, bz};
          threadIdx = {tx, 0, 0};
          const __nv_bfloat16* xp = x.data();
          const float* wp = w.data();
          float* yp = y.data();
          {
            const __nv_bfloat16* x = xp;
            const float* w = wp;
            float* y = yp;
#include CONV_BODY
          }
        }
  return y;
}

int main() {
  std::mt19937 g(3);
  std::normal_distribution<float> n(0, 1);
  int b = 2, c = 300, t = 4, l = K - 1 + t;
  std::vector<__nv_bfloat16> x((size_t)b * l * c);
  std::vector<float> w((size_t)c * K);
  for (auto& v : x) v.f = n(g);
  for (auto& v : w) v = 0.5f * n(g);
  auto y = run(x, w, b, l, c);
  double worst = 0;
  for (int bb = 0; bb < b; ++bb)
    for (int s = 0; s < t; ++s) {
      // This position alone: its window as a one-position call.
      std::vector<__nv_bfloat16> xs(x.begin() + ((size_t)bb * l + s) * c, x.begin() + ((size_t)bb * l + s + K) * c);
      auto alone = run(xs, w, 1, K, c);
      if (std::memcmp(alone.data(), &y[((size_t)bb * t + s) * c], c * 4) != 0) {
        printf("sequence %d position %d differs from its one-position call\n", bb, s);
        return 1;
      }
      for (int ch = 0; ch < c; ++ch) {
        double acc = 0;
        for (int i = 0; i < K; ++i) acc += (double)w[ch * K + i] * x[((size_t)bb * l + s + i) * c + ch].f;
        double want = acc / (1 + std::exp(-acc));
        worst = std::max(worst, std::abs(want - y[((size_t)bb * t + s) * c + ch]));
      }
    }
  printf("conv: worst abs error %.2e against double, every position identical alone\n", worst);
  return worst < 1e-5 ? 0 : 1;
}
