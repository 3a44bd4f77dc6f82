// CPU emulation of kernels/cuda/conv_silu.cuh's `conv_window` through its body conv_window.cu, with and without
// the recorded input (run by tests/it/conv_kernel.rs): every thread of the launch run in turn, bf16 storage
// emulated as float. The window (packed) and the new rows (a slice of a wider array, as the in-projection gives
// them) are read through their own strides, the weight packed and transposed. Checks that y is bit-identical to
// the conv kernel's body (conv_silu.cu) over the packed concatenation, that the window and the input are exactly
// the concatenation's rows, and that every output element is written. Exits 1 on a failure.
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>
#include "cuda_serial.h"
#include CONV_CUH

using Shape = std::array<int32_t, 10>;
using Strides = std::array<int64_t, 10>;
constexpr int K = 4;

// Runs `body` as every thread of a (c, rows, b) launch in blocks of 256.
template <typename F>
void launch(int c, int rows, int b, F body) {
  blockDim = {256, 1, 1};
  for (int bz = 0; bz < b; ++bz)
    for (int by = 0; by < rows; ++by)
      for (int bx = 0; bx < (c + 255) / 256; ++bx)
        for (int tx = 0; tx < 256; ++tx) {
          blockIdx = {bx, by, bz};
          threadIdx = {tx, 0, 0};
          body();
        }
}

struct Out {
  std::vector<float> y;
  std::vector<__nv_bfloat16> window, input;
};

// The window kernel over prev [b, K-1, c] (packed) and next = wide[:, :, off:off+c] of wide [b, t, cw] (another
// row stride than the window's), the weight read through `w_strides` (packed [c, K, 1], or transposed: held as
// [K, c]).
Out run_window(const std::vector<__nv_bfloat16>& pv, const std::vector<__nv_bfloat16>& wide, int b, int t, int cw,
               int off, int c, const std::vector<float>& wv, bool w_transposed, bool record) {
  Out o;
  o.y.assign((size_t)b * t * c, NAN);
  o.window.assign((size_t)b * (K - 1) * c, {NAN});
  o.input.assign((size_t)b * (K - 1 + t) * c, {NAN});
  Strides prev_strides{(int64_t)(K - 1) * c, c, 1}, next_strides{(int64_t)t * cw, cw, 1};
  Strides w_strides = w_transposed ? Strides{1, c, 1} : Strides{K, 1, 1};
  Shape next_shape{b, t, c};
  const int rows = t + (record ? K - 1 + t : K - 1);
  launch(c, rows, b, [&] {
    const __nv_bfloat16* prev = pv.data();
    const __nv_bfloat16* next = wide.data() + off;
    const float* w = wv.data();
    float* y = o.y.data();
    __nv_bfloat16* window = o.window.data();
    __nv_bfloat16* input = o.input.data();
    if (record) {
#define TANDEM_RECORD 1
#include CONV_WINDOW_BODY
#undef TANDEM_RECORD
    } else {
#define TANDEM_RECORD 0
#include CONV_WINDOW_BODY
#undef TANDEM_RECORD
    }
  });
  return o;
}

int main() {
  std::mt19937 g(7);
  std::normal_distribution<float> n(0, 1);
  for (auto [b, t, c] : {std::array{1, 1, 300}, std::array{2, 4, 300}, std::array{3, 16, 40}}) {
    const int off = 5, cw = c + 9, l = K - 1 + t;
    std::vector<__nv_bfloat16> pv((size_t)b * (K - 1) * c), wide((size_t)b * t * cw);
    std::vector<float> w((size_t)c * K), wt((size_t)c * K);
    for (auto& v : pv) v.f = n(g);
    for (auto& v : wide) v.f = n(g);
    for (auto& v : w) v = 0.5f * n(g);
    for (int ch = 0; ch < c; ++ch)
      for (int i = 0; i < K; ++i) wt[(size_t)i * c + ch] = w[(size_t)ch * K + i];
    // The concatenation, packed, and the conv kernel's body over it.
    std::vector<__nv_bfloat16> x((size_t)b * l * c);
    for (int bb = 0; bb < b; ++bb)
      for (int r = 0; r < l; ++r)
        for (int ch = 0; ch < c; ++ch)
          x[((size_t)bb * l + r) * c + ch] = r < K - 1 ? pv[((size_t)bb * (K - 1) + r) * c + ch]
                                                       : wide[((size_t)bb * t + r - (K - 1)) * cw + off + ch];
    std::vector<float> want_y((size_t)b * t * c, NAN);
    int x_shape[3] = {b, l, c};
    launch(c, t, b, [&] {
      const __nv_bfloat16* xp = x.data();
      const float* wp = w.data();
      float* yp = want_y.data();
      {
        const __nv_bfloat16* x = xp;
        const float* w = wp;
        float* y = yp;
#include CONV_BODY
      }
    });
    for (bool transposed : {false, true})
      for (bool record : {false, true}) {
        Out o = run_window(pv, wide, b, t, cw, off, c, transposed ? wt : w, transposed, record);
        if (std::memcmp(o.y.data(), want_y.data(), want_y.size() * 4) != 0) {
          printf("[%d, %d, %d] record %d, w transposed %d: y differs from the conv kernel's\n", b, t, c, record,
                 transposed);
          return 1;
        }
        for (int bb = 0; bb < b; ++bb)
          for (int r = 0; r < l; ++r)
            for (int ch = 0; ch < c; ++ch) {
              const float want = x[((size_t)bb * l + r) * c + ch].f;
              if (record && std::memcmp(&o.input[((size_t)bb * l + r) * c + ch].f, &want, 4) != 0) {
                printf("[%d, %d, %d]: input row %d channel %d wrong\n", b, t, c, r, ch);
                return 1;
              }
              if (r >= t && std::memcmp(&o.window[((size_t)bb * (K - 1) + r - t) * c + ch].f, &want, 4) != 0) {
                printf("[%d, %d, %d] record %d: window row %d channel %d wrong\n", b, t, c, record, r - t, ch);
                return 1;
              }
            }
      }
    printf("[%d, %d, %d]: y bit-identical to the conv kernel's, window and input the concatenation's rows\n", b, t, c);
  }
  return 0;
}
