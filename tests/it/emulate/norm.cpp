// CPU emulation of kernels/cuda/rms_norm.cuh through its two bodies (run by tests/it/norm_kernel.rs, which
// compiles it with the machine's C++ compiler; threads, barriers and shuffles from cuda_threads.h, bf16 storage
// emulated as float). Checks both kernels against a double-precision reference, the residual output against
// the sum, and that each row of a many-row call is bit-identical to that row normalised alone (a verify's or a
// batch's norm is decoding's). Exits 1 on a failure.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include "cuda_threads.h"
#include NORM_CUH

constexpr int THREADS = tandem_norm::THREADS;

// Both kernels over `rows` rows of `d`: y from the plain body on h, and (hs, y) from the residual body.
struct Out {
  std::vector<float> y, hs, y_add;
};
Out run(const std::vector<__nv_bfloat16>& hv, const std::vector<__nv_bfloat16>& mv, const std::vector<float>& wv,
        int rows, int d, float eps_value) {
  std::vector<__nv_bfloat16> yb(hv.size()), hsb(hv.size()), yab(hv.size());
  int w_shape[1] = {d};
  int EPS;
  std::memcpy(&EPS, &eps_value, 4);
  for (int r = 0; r < rows; ++r) {
    run_block({r, 0, 0}, THREADS, [&] {
      const __nv_bfloat16* x = hv.data();
      const float* w = wv.data();
      __nv_bfloat16* y = yb.data();
#include NORM_BODY
    });
    run_block({r, 0, 0}, THREADS, [&] {
      const __nv_bfloat16* h = hv.data();
      const __nv_bfloat16* m = mv.data();
      const float* w = wv.data();
      __nv_bfloat16* hs = hsb.data();
      __nv_bfloat16* y = yab.data();
#include ADD_NORM_BODY
    });
  }
  Out out;
  for (size_t i = 0; i < hv.size(); ++i) {
    out.y.push_back(yb[i].f), out.hs.push_back(hsb[i].f), out.y_add.push_back(yab[i].f);
  }
  return out;
}

int main() {
  std::mt19937 g(5);
  std::normal_distribution<float> n(0, 1);
  const float eps = 1e-6f;
  for (int d : {1, 33, 300, 2048}) {
    int rows = 3;
    std::vector<__nv_bfloat16> h((size_t)rows * d), m((size_t)rows * d);
    std::vector<float> w(d);
    for (auto& v : h) v.f = n(g);
    for (auto& v : m) v.f = 0.3f * n(g);
    for (auto& v : w) v = 1.0f + 0.1f * n(g);
    Out all = run(h, m, w, rows, d, eps);
    double worst = 0;
    for (int r = 0; r < rows; ++r) {
      std::vector<__nv_bfloat16> hr(h.begin() + (size_t)r * d, h.begin() + (size_t)(r + 1) * d);
      std::vector<__nv_bfloat16> mr(m.begin() + (size_t)r * d, m.begin() + (size_t)(r + 1) * d);
      Out alone = run(hr, mr, w, 1, d, eps);
      for (auto [a, b, what] : {std::tuple{&alone.y, &all.y, "norm"}, std::tuple{&alone.y_add, &all.y_add, "add+norm"}})
        if (std::memcmp(a->data(), b->data() + (size_t)r * d, d * 4) != 0) {
          printf("d %d row %d: the %s differs from the row alone\n", d, r, what);
          return 1;
        }
      for (int add = 0; add < 2; ++add) {
        double ss = 0;
        std::vector<double> v(d);
        for (int j = 0; j < d; ++j) {
          size_t i = (size_t)r * d + j;
          v[j] = add ? (double)h[i].f + m[i].f : h[i].f;
          if (add && all.hs[i] != h[i].f + m[i].f) {
            printf("d %d row %d: h + m wrong at %d\n", d, r, j);
            return 1;
          }
          ss += v[j] * v[j];
        }
        double inv = 1 / std::sqrt(ss / d + eps);
        for (int j = 0; j < d; ++j) {
          double want = w[j] * v[j] * inv;
          float got = (add ? all.y_add : all.y)[(size_t)r * d + j];
          worst = std::max(worst, std::abs(want - got) / std::max(1e-3, std::abs(want)));
        }
      }
    }
    printf("d %d: worst relative error %.2e against double, every row identical alone\n", d, worst);
    if (!(worst < 1e-5)) return 1;
  }
  return 0;
}
