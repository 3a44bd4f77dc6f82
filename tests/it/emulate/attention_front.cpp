// CPU emulation of kernels/cuda/attention_front.cuh through its bodies attention_front.cu and attention_gate.cu
// (run by tests/it/attention_kernel.rs; threads and shuffles from cuda_threads.h, bf16 storage emulated as
// float). The projection's parts are read through their strides as slices of one wider row, o through transposed
// strides, as MLX passes a strided kernel's inputs. Checks, for the front: q and k against a double-precision
// norm and rotation (the angle formed in fp32 as MLX forms it), v moved unchanged, every output written, every
// token bit-identical to that token alone at its position (errors relative to values of at least 1: a normed
// head's elements are of order 1, and a rotation's difference of two products may be near 0), and with no
// rotation the normed heads bit-identical to the norm kernel's (rms_norm.cuh, run the same way); for the gate:
// o · sigmoid(gate) against double.
// Exits 1 on a failure.
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include "cuda_threads.h"
static dim3 blockDim;
#include NORM_CUH
#include FRONT_CUH

using Shape = std::array<int32_t, 10>;
using Strides = std::array<int64_t, 10>;
using bf16 = __nv_bfloat16;

struct Case {
  int b, t, hq, hkv, d, rope_dims;
};

// A projection row [b, t, wide]: qg at column OFF, then k, then v, then 5 spare columns.
constexpr int OFF = 2;
int wide_of(const Case& c) { return OFF + 2 * c.hq * c.d + 2 * c.hkv * c.d + 5; }

struct Out {
  std::vector<float> q, k, v;
};

std::vector<float> unpack(const std::vector<bf16>& x, const char* what, const Case& c) {
  std::vector<float> out;
  for (auto& e : x) {
    if (std::isnan(e.f)) {
      printf("[%d, %d, %d, %d, %d]: an element of %s was not written\n", c.b, c.t, c.hq, c.hkv, c.d, what);
      std::exit(1);
    }
    out.push_back(e.f);
  }
  return out;
}

Out run_front(const Case& c, const std::vector<bf16>& proj, const std::vector<float>& qwv,
              const std::vector<float>& kwv, const std::vector<int>& posv, float eps_value, float base) {
  const int wide = wide_of(c);
  std::vector<bf16> qo((size_t)c.b * c.hq * c.t * c.d, {NAN}), ko((size_t)c.b * c.hkv * c.t * c.d, {NAN}),
      vo(ko.size(), {NAN});
  Shape qg_shape{c.b, c.t, 2 * c.hq * c.d}, k_shape{c.b, c.t, c.hkv * c.d}, qw_shape{c.d};
  Strides row{(int64_t)c.t * wide, wide, 1}, unit{1};
  int EPS, BASE, ROPE_DIMS = c.rope_dims;
  const float base_log2 = std::log2(base);
  std::memcpy(&EPS, &eps_value, 4);
  std::memcpy(&BASE, &base_log2, 4);
  const int warps = c.b * c.t * (c.hq + 2 * c.hkv), blocks = (warps + tandem_front::HEADS - 1) / tandem_front::HEADS;
  for (int blk = 0; blk < blocks; ++blk) {
    run_block({blk, 0, 0}, 32 * tandem_front::HEADS, [&] {
      const bf16* qg = proj.data() + OFF;
      const bf16* k = qg + 2 * c.hq * c.d;
      const bf16* v = k + c.hkv * c.d;
      const Strides &qg_strides = row, &k_strides = row, &v_strides = row;
      const float *qw = qwv.data(), *kw = kwv.data();
      const Strides &qw_strides = unit, &kw_strides = unit, &pos_strides = unit;
      const int* pos = posv.data();
      bf16 *q = qo.data(), *k_rot = ko.data(), *v_heads = vo.data();
#include FRONT_BODY
    });
  }
  return {unpack(qo, "q", c), unpack(ko, "k", c), unpack(vo, "v", c)};
}

// The norm kernel (rms_norm.cuh) over `rows` rows of d, one block of THREADS each.
std::vector<float> norm_kernel(const std::vector<bf16>& x, const std::vector<float>& w, int rows, int d, float eps) {
  std::vector<bf16> y(x.size(), {NAN});
  for (int r = 0; r < rows; ++r) {
    run_block({r, 0, 0}, tandem_norm::THREADS, [&] {
      tandem_norm::rms_norm<false, bf16>(x.data(), nullptr, w.data(), nullptr, y.data(), d, eps);
    });
  }
  std::vector<float> out;
  for (auto& e : y) out.push_back(e.f);
  return out;
}

// The rotated, normed head x (d elements) at `position`, in double, the angle formed in fp32 as MLX forms it.
std::vector<double> reference_head(const float* x, const std::vector<float>& w, int d, int rope_dims, int position,
                                   float eps, float base) {
  double ss = 0;
  for (int j = 0; j < d; ++j) ss += (double)x[j] * x[j];
  const double inv = 1 / std::sqrt(ss / d + eps);
  std::vector<double> n(d), out(d);
  for (int j = 0; j < d; ++j) n[j] = w[j] * x[j] * inv;
  const int half = rope_dims / 2;
  for (int j = 0; j < d; ++j) {
    if (j >= rope_dims) {
      out[j] = n[j];
      continue;
    }
    const int i = j < half ? j : j - half;
    const float theta = (float)position * exp2f(-((float)i / (float)half) * std::log2(base));
    const double cs = std::cos((double)theta), sn = std::sin((double)theta);
    out[j] = j < half ? n[j] * cs - n[j + half] * sn : n[j - half] * sn + n[j] * cs;
  }
  return out;
}

int check_front(const Case& c, std::mt19937& g) {
  std::normal_distribution<float> nd(0, 1);
  const float eps = 1e-6f, base = 1e7f;
  const int wide = wide_of(c);
  std::vector<bf16> proj((size_t)c.b * c.t * wide);
  for (auto& e : proj) e.f = 2 * nd(g);
  std::vector<float> qw(c.d), kw(c.d);
  for (auto& e : qw) e = 1 + 0.1f * nd(g);
  for (auto& e : kw) e = 1 + 0.1f * nd(g);
  std::vector<int> pos(c.b);
  for (int i = 0; i < c.b; ++i) pos[i] = 1000 + 7 * i;
  const Out all = run_front(c, proj, qw, kw, pos, eps, base);
  double worst = 0;
  for (int bi = 0; bi < c.b; ++bi)
    for (int ti = 0; ti < c.t; ++ti) {
      const bf16* r = proj.data() + ((size_t)bi * c.t + ti) * wide + OFF;
      // This token alone, at its own position.
      const Case one{1, 1, c.hq, c.hkv, c.d, c.rope_dims};
      std::vector<bf16> row1(r - OFF, r - OFF + wide);
      const Out alone = run_front(one, row1, qw, kw, {pos[bi] + ti}, eps, base);
      auto check = [&](const std::vector<float>& got_all, const std::vector<float>& got_one, int heads, int h,
                       const bf16* x, const std::vector<float>* w, const char* what) {
        const float* got = got_all.data() + (((size_t)bi * heads + h) * c.t + ti) * c.d;
        if (std::memcmp(got, got_one.data() + (size_t)h * c.d, (size_t)c.d * 4) != 0) {
          printf("[%d, %d, %d, %d, %d] %s head %d token (%d, %d): differs from the token alone\n", c.b, c.t, c.hq,
                 c.hkv, c.d, what, h, bi, ti);
          std::exit(1);
        }
        std::vector<float> xf(c.d);
        for (int j = 0; j < c.d; ++j) xf[j] = x[j].f;
        for (int j = 0; j < c.d; ++j) {
          const double want = w ? reference_head(xf.data(), *w, c.d, c.rope_dims, pos[bi] + ti, eps, base)[j] : xf[j];
          worst = std::max(worst, std::abs(want - got[j]) / std::max(1.0, std::abs(want)));
        }
      };
      for (int h = 0; h < c.hq; ++h) check(all.q, alone.q, c.hq, h, r + 2 * h * c.d, &qw, "q");
      for (int h = 0; h < c.hkv; ++h) {
        check(all.k, alone.k, c.hkv, h, r + 2 * c.hq * c.d + h * c.d, &kw, "k");
        check(all.v, alone.v, c.hkv, h, r + 2 * c.hq * c.d + (c.hkv + h) * c.d, nullptr, "v");
      }
    }
  printf("front [%d, %d, %d, %d, %d] rope %d: worst relative error %.2e against double, every token identical alone\n",
         c.b, c.t, c.hq, c.hkv, c.d, c.rope_dims, worst);
  if (!(worst < 1e-5)) return 1;
  if (c.rope_dims == 0) {  // the normed query heads against the norm kernel's bits
    std::vector<bf16> heads;
    for (int bi = 0; bi < c.b; ++bi)
      for (int ti = 0; ti < c.t; ++ti)
        for (int h = 0; h < c.hq; ++h) {
          const bf16* x = proj.data() + ((size_t)bi * c.t + ti) * wide + OFF + 2 * h * c.d;
          heads.insert(heads.end(), x, x + c.d);
        }
    const std::vector<float> want = norm_kernel(heads, qw, c.b * c.t * c.hq, c.d, eps);
    for (int bi = 0; bi < c.b; ++bi)
      for (int ti = 0; ti < c.t; ++ti)
        for (int h = 0; h < c.hq; ++h) {
          const float* got = all.q.data() + (((size_t)bi * c.hq + h) * c.t + ti) * c.d;
          const float* ref = want.data() + (((size_t)bi * c.t + ti) * c.hq + h) * c.d;
          if (std::memcmp(got, ref, (size_t)c.d * 4) != 0) {
            printf("front [%d, %d, %d, %d, %d]: normed head %d differs from the norm kernel's bits\n", c.b, c.t,
                   c.hq, c.hkv, c.d, h);
            return 1;
          }
        }
    printf("front [%d, %d, %d, %d, %d]: normed heads bit-identical to the norm kernel\n", c.b, c.t, c.hq, c.hkv, c.d);
  }
  return 0;
}

int check_gate(int b, int t, int hq, int d, std::mt19937& g) {
  std::normal_distribution<float> nd(0, 1);
  const Case c{b, t, hq, 1, d, 0};
  const int wide = wide_of(c);
  std::vector<bf16> proj((size_t)b * t * wide), o_bthd((size_t)b * t * hq * d);
  for (auto& e : proj) e.f = 3 * nd(g);
  for (auto& e : o_bthd) e.f = nd(g);
  std::vector<bf16> yv((size_t)b * t * hq * d, {NAN});
  Shape o_shape{b, hq, t, d};
  Strides o_strides{(int64_t)t * hq * d, d, (int64_t)hq * d, 1}, qg_strides{(int64_t)t * wide, wide, 1};
  const int n = b * t * hq * d, threads = 256;
  blockDim = {threads, 1, 1};
  for (int blk = 0; blk < (n + threads - 1) / threads; ++blk) {
    run_block({blk, 0, 0}, threads, [&] {
      const bf16* o = o_bthd.data();
      const bf16* qg = proj.data() + OFF;
      bf16* y = yv.data();
#include GATE_BODY
    });
  }
  const std::vector<float> got = unpack(yv, "y", c);
  double worst = 0;
  for (int bi = 0; bi < b; ++bi)
    for (int ti = 0; ti < t; ++ti)
      for (int h = 0; h < hq; ++h)
        for (int j = 0; j < d; ++j) {
          const double gv = proj[((size_t)bi * t + ti) * wide + OFF + 2 * h * d + d + j].f;
          const double ov = o_bthd[(((size_t)bi * t + ti) * hq + h) * d + j].f;
          const double want = ov / (1 + std::exp(-gv));
          const double y = got[((size_t)bi * t + ti) * hq * d + (size_t)h * d + j];
          worst = std::max(worst, std::abs(want - y) / std::max(1e-3, std::abs(want)));
        }
  printf("gate [%d, %d, %d, %d]: worst relative error %.2e against double\n", b, t, hq, d, worst);
  return worst < 1e-6 ? 0 : 1;
}

int main() {
  std::mt19937 g(5);
  // The 27B slice's layer (24 query and 4 key heads of 256, RoPE on 64), a batch of a verify's width, a head past
  // the norm kernel's THREADS with RoPE on a count that is no multiple of 32, whole-head RoPE, and no RoPE.
  for (const Case& c : {Case{1, 1, 24, 4, 256, 64}, Case{2, 3, 3, 1, 64, 16}, Case{1, 2, 2, 2, 300, 20},
                        Case{1, 2, 2, 1, 32, 32}, Case{2, 2, 3, 1, 256, 0}, Case{1, 3, 2, 1, 33, 0}}) {
    if (check_front(c, g)) return 1;
  }
  for (auto [b, t, hq, d] : {std::array{1, 1, 24, 256}, std::array{2, 3, 3, 64}, std::array{1, 2, 2, 33}}) {
    if (check_gate(b, t, hq, d, g)) return 1;
  }
  return 0;
}
