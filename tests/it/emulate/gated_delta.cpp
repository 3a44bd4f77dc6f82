// CPU emulation of kernels/cuda/gated_delta.cuh (run by tests/it/gated_delta_kernel.rs, which compiles it with
// the machine's C++ compiler): every CUDA thread of a block is a std::thread, with barriers for the warp
// shuffles. Both entries, the recurrence over q, k, v and the one over the conv's output that normalises q and
// k itself, against double-precision references of the states and outputs; and each token of a T-token call
// bit-identical to a one-token call from the state before it (a verify's recurrence is decoding's). Exits 1
// on a failure.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>
#include "cuda_threads.h"
static dim3 blockDim = {32, 1, 1};
#include GDN_CUH

constexpr int B = 2, HK = 2, HV = 4, DK = 64, DV = 4, TMAX = 4;
constexpr int C = 2 * HK * DK + HV * DV;
static int EPS;  // eps's fp32 bits, as the launch passes them
using Vec = std::vector<float>;
struct Out {
  Vec y, states;
};

// The kernel over q, k, v (`fused` false) or over the conv output qkv (true), T tokens.
Out launch(bool fused, const Vec& a, const Vec& k_in, const Vec& v_in, const Vec& scales, const Vec& g_in,
           const Vec& beta_in, const Vec& state_in, int T) {
  Out o{Vec((size_t)B * T * HV * DV, NAN), Vec((size_t)T * B * HV * DV * DK, NAN)};
  for (int z = 0; z < B * HV; ++z)
    for (int row = 0; row < DV; ++row)
      run_block({0, row, z}, 32, [&] {
        const float *g = g_in.data(), *beta = beta_in.data(), *state = state_in.data();
        float *y = o.y.data(), *states = o.states.data();
        if (fused) {
          const float *qkv = a.data(), *qs = scales.data(), *ks = scales.data() + DK;
          int qkv_shape[3] = {B, T, C}, g_shape[3] = {B, T, HV};
#include GDN_QKV_BODY
        } else {
          const float *q = a.data(), *k = k_in.data(), *v = v_in.data();
          int q_shape[4] = {B, T, HK, DK}, v_shape[4] = {B, T, HV, DV};
#include GDN_BODY
        }
      });
  return o;
}

// Token t of an array [B, T, X].
Vec token(const Vec& x, int T, int t) {
  size_t n = x.size() / ((size_t)B * T);
  Vec out;
  for (int b = 0; b < B; ++b) out.insert(out.end(), x.begin() + ((size_t)b * T + t) * n, x.begin() + ((size_t)b * T + t + 1) * n);
  return out;
}

// The recurrence in double from q, k (normalised here when `scales` is given) and v at each token.
void reference(const Vec& q, const Vec& k, const Vec& v, size_t qk_stride, size_t v_stride, size_t k_off,
               size_t v_off, const Vec* scales, const Vec& g, const Vec& beta, const Vec& state, int T,
               std::vector<double>& y, std::vector<double>& states) {
  double eps;
  float e;
  std::memcpy(&e, &EPS, 4);
  eps = e;
  y.assign((size_t)B * T * HV * DV, 0), states.assign((size_t)T * B * HV * DV * DK, 0);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < HV; ++h) {
      int hk = h / (HV / HK);
      std::vector<double> s((size_t)DV * DK);
      for (size_t i = 0; i < s.size(); ++i) s[i] = state[(((size_t)b * HV + h) * DV) * DK + i];
      for (int t = 0; t < T; ++t) {
        size_t bt = (size_t)b * T + t;
        std::vector<double> qq(DK), kk(DK);
        for (int i = 0; i < DK; ++i) qq[i] = q[bt * qk_stride + hk * DK + i], kk[i] = k[bt * qk_stride + k_off + hk * DK + i];
        if (scales) {
          for (int which = 0; which < 2; ++which) {
            auto& x = which ? kk : qq;
            double ss = 0;
            for (double e2 : x) ss += e2 * e2;
            double r = 1 / std::sqrt(ss / DK + eps);
            for (int i = 0; i < DK; ++i) x[i] = x[i] * r * (*scales)[which * DK + i];
          }
        }
        double gt = g[bt * HV + h], bet = beta[bt * HV + h];
        for (int dv = 0; dv < DV; ++dv) {
          double* row = &s[(size_t)dv * DK];
          double kv = 0, out = 0;
          for (int i = 0; i < DK; ++i) row[i] *= gt, kv += row[i] * kk[i];
          double delta = (v[bt * v_stride + v_off + h * DV + dv] - kv) * bet;
          for (int i = 0; i < DK; ++i) row[i] += kk[i] * delta, out += row[i] * qq[i];
          y[(bt * HV + h) * DV + dv] = out;
        }
        for (size_t i = 0; i < s.size(); ++i) states[((size_t)t * B * HV + b * HV + h) * DV * DK + i] = s[i];
      }
    }
}

double rel(const Vec& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) num += (got[i] - want[i]) * (got[i] - want[i]), den += want[i] * want[i];
  return std::sqrt(num / std::max(den, 1e-30));
}

int main() {
  std::mt19937 gen(7);
  std::normal_distribution<float> n(0, 1);
  std::uniform_real_distribution<float> u(0, 1);
  float eps = 1e-6f / DK;
  std::memcpy(&EPS, &eps, 4);
  auto normal = [&](size_t len, float scale) {
    Vec x(len);
    for (auto& e : x) e = n(gen) * scale;
    return x;
  };
  Vec qkv = normal((size_t)B * TMAX * C, 1), state = normal((size_t)B * HV * DV * DK, 0.1f);
  Vec g((size_t)B * TMAX * HV), beta(g.size());
  for (auto& e : g) e = 0.5f + 0.5f * u(gen);
  for (auto& e : beta) e = u(gen);
  Vec scales(2 * DK);
  for (int i = 0; i < DK; ++i) scales[i] = 1.0f / DK, scales[DK + i] = 1.0f / std::sqrt((float)DK);
  // The separate entry's q, k: the conv output's channels, normalised in float; v its last channels.
  Vec q((size_t)B * TMAX * HK * DK), k(q.size()), v((size_t)B * TMAX * HV * DV);
  for (size_t bt = 0; bt < (size_t)B * TMAX; ++bt) {
    for (int hk = 0; hk < HK; ++hk)
      for (int which = 0; which < 2; ++which) {
        const float* x = &qkv[bt * C + (which * HK + hk) * DK];
        float ss = 0;
        for (int i = 0; i < DK; ++i) ss += x[i] * x[i];
        float r = 1.0f / std::sqrt(ss / DK + eps);
        for (int i = 0; i < DK; ++i) (which ? k : q)[(bt * HK + hk) * DK + i] = x[i] * r * scales[which * DK + i];
      }
    std::copy(&qkv[bt * C + 2 * HK * DK], &qkv[bt * C + C], &v[bt * HV * DV]);
  }
  for (int fused = 0; fused < 2; ++fused) {
    const char* name = fused ? "recurrence_qkv" : "recurrence";
    double worst = 0;
    for (int T = 1; T <= TMAX; ++T) {
      auto first = [&](const Vec& x) {
        size_t per = x.size() / ((size_t)B * TMAX);
        Vec out;
        for (int b = 0; b < B; ++b) out.insert(out.end(), x.begin() + (size_t)b * TMAX * per, x.begin() + ((size_t)b * TMAX + T) * per);
        return out;
      };
      Vec a = fused ? first(qkv) : first(q), kt = first(k), vt = first(v), gt = first(g), bt = first(beta);
      Out o = launch(fused, a, kt, vt, scales, gt, bt, state, T);
      std::vector<double> ry, rs;
      if (fused)
        reference(a, a, a, C, C, HK * DK, 2 * HK * DK, &scales, gt, bt, state, T, ry, rs);
      else
        reference(a, kt, vt, HK * DK, HV * DV, 0, 0, nullptr, gt, bt, state, T, ry, rs);
      worst = std::max({worst, rel(o.y, ry), rel(o.states, rs)});
      if (T < TMAX) continue;
      // Token by token from the state before it: the same bits as the TMAX-token call's.
      Vec s = state;
      for (int t = 0; t < T; ++t) {
        auto tok = [&](const Vec& x) { return token(x, T, t); };
        Out one = launch(fused, tok(a), tok(kt), tok(vt), scales, tok(gt), tok(bt), s, 1);
        Vec y_t = token(o.y, T, t);
        size_t per = (size_t)B * HV * DV * DK;
        if (std::memcmp(one.y.data(), y_t.data(), y_t.size() * 4) != 0 ||
            std::memcmp(one.states.data(), &o.states[t * per], per * 4) != 0) {
          printf("%s: T = %d, token %d differs from its one-token call\n", name, T, t);
          return 1;
        }
        s.assign(o.states.begin() + t * per, o.states.begin() + (t + 1) * per);
      }
    }
    printf("%s: worst relative error %.2e against double over T = 1..%d, every token of T = %d identical alone\n", name,
           worst, TMAX, TMAX);
    if (!(worst < 1e-5)) return 1;
  }
  return 0;
}
