// CPU emulation of kernels/cuda/attention.cuh (run by tests/it/attention_kernel.rs, which compiles it with
// the machine's C++ compiler): every CUDA thread of a block is a std::thread, with barriers for
// __syncthreads and for warp shuffles, and bf16 storage emulated as float. Checks the kernels' output
// against a double-precision reference, and that each query of a T-query call is bit-identical to a
// one-query call over its own prefix (a verify's attention is decoding's). Exits 1 on a failure.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <cstdint>
#include <algorithm>
#include <random>
#include <vector>
#include <functional>
using std::min;
#include "cuda_threads.h"
#include ATTENTION_CUH

template <int D, int ROWS>
void run_partial(const float* q, const float* k, const float* v, const float* params, float* parts, float* stats,
                 const int* q_shape, const int* k_shape, int nc, int hkv) {
  gridDim = {nc, hkv, 1};
  for (int by = 0; by < hkv; ++by)
    for (int bx = 0; bx < nc; ++bx) {
      run_block({bx, by, 0}, 256, [&] {
#include ATTENTION_PARTIAL
      });
    }
}
void run_combine(const float* parts, const float* stats, float* o, const int* parts_shape, int rows) {
  for (int r = 0; r < rows; ++r) {
    blockIdx = {0, r, 0};
    for (int d = 0; d < parts_shape[3]; ++d) {
      threadIdx = {d, 0, 0};
      tandem_attn::combine(parts, stats, o, parts_shape[2], parts_shape[3]);
    }
  }
}

constexpr int D = 64;
std::vector<float> attend(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                          int hq, int hkv, int t, int cap, int len, float scale) {
  int nc = (len + 63) / 64;
  std::vector<float> parts((size_t)hq * t * nc * D), stats((size_t)hq * t * nc * 2), o((size_t)hq * t * D);
  float params[2] = {(float)len, scale};
  int q_shape[4] = {1, hq, t, D}, k_shape[4] = {1, hkv, cap, D}, p_shape[4] = {hq, t, nc, D};
  run_partial<D, 16>(q.data(), k.data(), v.data(), params, parts.data(), stats.data(), q_shape, k_shape, nc, hkv);
  run_combine(parts.data(), stats.data(), o.data(), p_shape, hq * t);
  return o;
}
int main() {
  int hq = 6, hkv = 2, cap = 200, rep = hq / hkv;
  std::mt19937 g(1);
  std::normal_distribution<float> n(0, 1);
  for (int len : {1, 5, 65, 190}) {
    int t = std::min(len, 5);
    std::vector<float> q(hq * t * D), k(hkv * cap * D), v(hkv * cap * D);
    for (auto& x : q) x = n(g);
    for (auto& x : k) x = n(g);
    for (auto& x : v) x = n(g);
    float scale = 0.125f;
    auto o = attend(q, k, v, hq, hkv, t, cap, len, scale);
    double worst = 0;
    for (int i = 0; i < t; ++i) {
      int seen = len - t + i + 1;
      // This query alone over its prefix: the same bits for every head.
      std::vector<float> qi(hq * D);
      for (int h = 0; h < hq; ++h) std::memcpy(&qi[h * D], &q[(h * t + i) * D], D * 4);
      auto alone = attend(qi, k, v, hq, hkv, 1, cap, seen, scale);
      for (int h = 0; h < hq; ++h) {
        if (std::memcmp(&alone[h * D], &o[(h * t + i) * D], D * 4) != 0) {
          printf("len %d: head %d query %d differs from its one-query call\n", len, h, i);
          return 1;
        }
        int kh = h / rep;
        std::vector<double> s(seen);
        double m = -1e300, l = 0;
        for (int j = 0; j < seen; ++j) {
          double acc = 0;
          for (int d = 0; d < D; ++d) acc += (double)q[(h * t + i) * D + d] * k[(kh * cap + j) * D + d];
          s[j] = acc * scale, m = std::max(m, s[j]);
        }
        for (auto& x : s) x = std::exp(x - m), l += x;
        for (int d = 0; d < D; ++d) {
          double acc = 0;
          for (int j = 0; j < seen; ++j) acc += s[j] * v[(kh * cap + j) * D + d];
          worst = std::max(worst, std::abs(acc / l - o[(h * t + i) * D + d]));
        }
      }
    }
    printf("len %d T %d: worst abs error %.2e against double, every query identical alone\n", len, t, worst);
    if (!(worst < 1e-5)) return 1;
  }
  return 0;
}
