// The host kernels of the repository's kernels/cpu/ as MLX primitives of the bridge's own: MLX has no
// custom-kernel API for its CPU backend, so each is a primitive that joins the lazy graph like any op and runs
// on MLX's CPU stream (its scheduler thread), in graph order. Declared in bridge.h with the rest of the bridge.
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

#include "mlx-bridge/cxx/bridge.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/primitives.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/dense_matmul.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/gated_delta.h"
#include "kernels/cpu/quantized_matmul.h"

namespace mx = mlx::core;

namespace mlxb {
namespace {

ArrayPtr wrap(Array a) { return std::make_unique<Array>(std::move(a)); }

// The elements of `a` in row-major order, for an input MLX has left strided (a slice, a transpose).
std::vector<uint8_t> packed(const Array& a) {
  const size_t es = a.itemsize();
  std::vector<uint8_t> buf(a.size() * es);
  if (a.size() == 0) return buf;
  const auto* base = a.data<uint8_t>();
  const int nd = a.ndim();
  // A last axis of stride one (a slice of it, heads split from a projection) is copied a run at a time.
  const bool runs = nd > 0 && a.strides()[nd - 1] == 1;
  const int64_t run = runs ? a.shape(nd - 1) : 1;
  const int outer = runs ? nd - 1 : nd;
  std::vector<int64_t> idx(nd, 0);
  for (size_t t = 0; t < a.size(); t += run) {
    int64_t off = 0;
    for (int d = 0; d < outer; ++d) off += idx[d] * a.strides()[d];
    std::memcpy(&buf[t * es], base + off * static_cast<int64_t>(es), run * es);
    for (int d = outer - 1; d >= 0 && ++idx[d] == a.shape(d); --d) idx[d] = 0;
  }
  return buf;
}

// The data of `a` in row-major order: its own buffer, or `a` packed into `buf`.
const void* row_major(const Array& a, std::vector<uint8_t>& buf) {
  if (a.flags().row_contiguous) return a.data<void>();
  buf = packed(a);
  return buf.data();
}

tandem_kernels::Elem elem(mx::Dtype d) {
  return d == mx::float32 ? tandem_kernels::Elem::F32
         : d == mx::bfloat16 ? tandem_kernels::Elem::BF16
                             : tandem_kernels::Elem::F16;
}

bool is_float(mx::Dtype d) { return d == mx::float32 || d == mx::bfloat16 || d == mx::float16; }

// The CPU stream's encoder with `out` allocated and every input and output registered: MLX keeps them alive
// until the task dispatched on it has run.
mx::cpu::CommandEncoder& encoder_for(mx::Stream s, const std::vector<Array>& in, std::vector<Array*> out,
                                     const Array* donor = nullptr) {
  auto& enc = mx::cpu::get_command_encoder(s);
  for (const auto& a : in) enc.set_input_array(a);
  for (Array* o : out) {
    if (donor != nullptr && o == out.front()) {
      o->copy_shared_buffer(*donor);
    } else {
      o->set_data(mx::allocator::malloc(o->nbytes()));
    }
    enc.set_output_array(*o);
  }
  return enc;
}

// An input whose buffer an elementwise output may take, as MLX's own elementwise ops do: nothing else holds
// it, it is laid out row by row, and its elements are the output's size. The kernels read each element before
// writing that index, so computing in place gives the same values.
bool can_donate(const Array& a, const Array& out) {
  return a.is_donatable() && a.flags().row_contiguous && a.itemsize() == out.itemsize() && a.size() == out.size();
}

const Array* donor_for(const std::vector<Array>& in, const Array& out) {
  for (const auto& a : in) {
    if (can_donate(a, out)) return &a;
  }
  return nullptr;
}

// `[d0, d1, ...]`, for error messages.
std::string shape_text(const Array& a) {
  std::string s = "[";
  for (size_t d = 0; d < a.ndim(); ++d) s += (d ? ", " : "") + std::to_string(a.shape(d));
  return s + "]";
}

// y = x @ w^T by tandem_kernels::dense_matmul_nt, as an MLX primitive on the CPU stream: it joins the lazy
// graph like any op, and runs on MLX's CPU scheduler thread in graph order.
class DenseMatmulNT : public mx::UnaryPrimitive {
 public:
  explicit DenseMatmulNT(mx::Stream s) : mx::UnaryPrimitive(s) {}
  const char* name() const override { return "TandemDenseMatmulNT"; }
  bool is_equivalent(const mx::Primitive&) const override { return true; }
  void eval_gpu(const std::vector<Array>&, Array&) override {
    throw std::runtime_error("TandemDenseMatmulNT runs on the CPU only");
  }
  void eval_cpu(const std::vector<Array>& in, Array& out) override {
    const Array& x = in[0];
    const Array& w = in[1];
    auto& enc = encoder_for(stream(), in, {&out});
    const int64_t k = w.shape(1), n = w.shape(0), m = k == 0 ? 0 : static_cast<int64_t>(x.size()) / k;
    const auto e = elem(x.dtype());
    if (k == 0) {
      std::memset(out.data<uint8_t>(), 0, out.nbytes());
      return;
    }
    // The input buffers outlive the task (MLX's CPU eval holds them until it has run); strided inputs are
    // packed inside the task, once their data exist.
    enc.dispatch([e, m, n, k, x = Array::unsafe_weak_copy(x), w = Array::unsafe_weak_copy(w),
                  o = out.data<void>()]() {
      std::vector<uint8_t> xp, wp;
      tandem_kernels::dense_matmul_nt(e, row_major(x, xp), row_major(w, wp), o, m, n, k);
    });
  }
};

// y = x @ dequantize(wq, scales, biases)^T by tandem_kernels::quantized_matmul_nt, as DenseMatmulNT is.
class QuantizedMatmulNT : public mx::UnaryPrimitive {
 public:
  QuantizedMatmulNT(mx::Stream s, int group, int bits) : mx::UnaryPrimitive(s), group_(group), bits_(bits) {}
  const char* name() const override { return "TandemQuantizedMatmulNT"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const QuantizedMatmulNT&>(other);
    return o.group_ == group_ && o.bits_ == bits_;
  }
  void eval_gpu(const std::vector<Array>&, Array&) override {
    throw std::runtime_error("TandemQuantizedMatmulNT runs on the CPU only");
  }
  void eval_cpu(const std::vector<Array>& in, Array& out) override {
    auto& enc = encoder_for(stream(), in, {&out});
    const int64_t n = in[1].shape(0), k = in[0].shape(-1), m = k == 0 ? 0 : static_cast<int64_t>(in[0].size()) / k;
    if (k == 0) {
      std::memset(out.data<uint8_t>(), 0, out.nbytes());
      return;
    }
    enc.dispatch([m, n, k, g = group_, b = bits_, x = Array::unsafe_weak_copy(in[0]),
                  w = Array::unsafe_weak_copy(in[1]), s = Array::unsafe_weak_copy(in[2]),
                  z = Array::unsafe_weak_copy(in[3]), o = out.data<void>()]() {
      std::vector<uint8_t> xp, wp, sp, zp;
      const auto* wd = static_cast<const uint32_t*>(row_major(w, wp));
      tandem_kernels::quantized_matmul_nt(elem(x.dtype()), row_major(x, xp), wd, elem(s.dtype()), row_major(s, sp),
                                          row_major(z, zp), o, m, n, k, g, b);
    });
  }

 private:
  int group_, bits_;
};

// tandem_kernels::gated_delta as a primitive of two outputs: y, and the state after every token (or after
// the last only: `all_steps` false, for prefill lengths).
class GatedDeltaSteps : public mx::Primitive {
 public:
  GatedDeltaSteps(mx::Stream s, bool all_steps) : mx::Primitive(s), all_steps_(all_steps) {}
  const char* name() const override { return "TandemGatedDeltaSteps"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    return static_cast<const GatedDeltaSteps&>(other).all_steps_ == all_steps_;
  }
  void eval_gpu(const std::vector<Array>&, std::vector<Array>&) override {
    throw std::runtime_error("TandemGatedDeltaSteps runs on the CPU only");
  }
  void eval_cpu(const std::vector<Array>& in, std::vector<Array>& out) override {
    auto& enc = encoder_for(stream(), in, {&out[0], &out[1]});
    const int64_t b = in[0].shape(0), t = in[0].shape(1), hk = in[0].shape(2), dk = in[0].shape(3);
    const int64_t hv = in[2].shape(2), dv = in[2].shape(3);
    enc.dispatch([b, t, hk, hv, dk, dv, all = all_steps_, q = Array::unsafe_weak_copy(in[0]),
                  k = Array::unsafe_weak_copy(in[1]), v = Array::unsafe_weak_copy(in[2]),
                  g = Array::unsafe_weak_copy(in[3]), beta = Array::unsafe_weak_copy(in[4]),
                  s = Array::unsafe_weak_copy(in[5]), y = out[0].data<float>(), st = out[1].data<float>()]() {
      std::vector<uint8_t> p[6];
      const auto f = [](const void* d) { return static_cast<const float*>(d); };
      tandem_kernels::gated_delta(f(row_major(q, p[0])), f(row_major(k, p[1])), f(row_major(v, p[2])),
                                  f(row_major(g, p[3])), f(row_major(beta, p[4])), f(row_major(s, p[5])), y, st, b,
                                  t, hk, hv, dk, dv, all);
    });
  }

 private:
  bool all_steps_;
};

// tandem_kernels::gated_delta_qkv as a primitive of two outputs, as GatedDeltaSteps with every step's state:
// the recurrence from a layer's conv output, q and k normalised on the way.
class GatedDeltaQkv : public mx::Primitive {
 public:
  GatedDeltaQkv(mx::Stream s, int hk, float eps) : mx::Primitive(s), hk_(hk), eps_(eps) {}
  const char* name() const override { return "TandemGatedDeltaQkv"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const GatedDeltaQkv&>(other);
    return o.hk_ == hk_ && o.eps_ == eps_;
  }
  void eval_gpu(const std::vector<Array>&, std::vector<Array>&) override {
    throw std::runtime_error("TandemGatedDeltaQkv runs on the CPU only");
  }
  void eval_cpu(const std::vector<Array>& in, std::vector<Array>& out) override {
    auto& enc = encoder_for(stream(), in, {&out[0], &out[1]});
    const int64_t b = in[0].shape(0), t = in[0].shape(1), dk = in[1].shape(0);
    const int64_t hv = in[5].shape(1), dv = in[5].shape(2);
    enc.dispatch([b, t, hk = int64_t(hk_), hv, dk, dv, eps = eps_,
                  qkv = Array::unsafe_weak_copy(in[0]), qs = Array::unsafe_weak_copy(in[1]),
                  ks = Array::unsafe_weak_copy(in[2]), g = Array::unsafe_weak_copy(in[3]),
                  beta = Array::unsafe_weak_copy(in[4]), s = Array::unsafe_weak_copy(in[5]),
                  y = out[0].data<float>(), st = out[1].data<float>()]() {
      std::vector<uint8_t> p[6];
      const auto f = [](const void* d) { return static_cast<const float*>(d); };
      tandem_kernels::gated_delta_qkv(f(row_major(qkv, p[0])), f(row_major(qs, p[1])), f(row_major(ks, p[2])), eps,
                                      1.0f / static_cast<float>(dk), f(row_major(g, p[3])), f(row_major(beta, p[4])),
                                      f(row_major(s, p[5])), y, st, b, t, hk, hv, dk, dv);
    });
  }

 private:
  int hk_;
  float eps_;
};

// tandem_kernels::attention as DenseMatmulNT is: T queries over the first `len` rows of a cache's buffers.
class AttentionHost : public mx::UnaryPrimitive {
 public:
  AttentionHost(mx::Stream s, int len, float scale) : mx::UnaryPrimitive(s), len_(len), scale_(scale) {}
  const char* name() const override { return "TandemAttention"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const AttentionHost&>(other);
    return o.len_ == len_ && o.scale_ == scale_;
  }
  void eval_gpu(const std::vector<Array>&, Array&) override {
    throw std::runtime_error("TandemAttention runs on the CPU only");
  }
  void eval_cpu(const std::vector<Array>& in, Array& out) override {
    auto& enc = encoder_for(stream(), in, {&out});
    const int64_t hq = in[0].shape(1), t = in[0].shape(2), d = in[0].shape(3);
    const int64_t hkv = in[1].shape(1), cap = in[1].shape(2);
    enc.dispatch([hq, t, d, hkv, cap, len = len_, scale = scale_, q = Array::unsafe_weak_copy(in[0]),
                  k = Array::unsafe_weak_copy(in[1]), v = Array::unsafe_weak_copy(in[2]), o = out.data<void>()]() {
      std::vector<uint8_t> qp, kp, vp;
      tandem_kernels::attention(elem(q.dtype()), row_major(q, qp), row_major(k, kp), row_major(v, vp), o, hq, hkv, t,
                                d, cap, len, scale);
    });
  }

 private:
  int len_;
  float scale_;
};

// The row stride (in elements) under which `a` is `rows` rows of its last axis laid out contiguously, or -1
// where it is not (then it is packed): a slice along the last axis (SwiGLU's gate and up) keeps its stride.
int64_t row_stride(const Array& a) {
  if (a.flags().row_contiguous) return a.ndim() == 0 ? 1 : a.shape(-1);
  const int nd = a.ndim();
  if (nd < 2 || a.strides()[nd - 1] != 1) return -1;
  for (int d = 0; d + 2 < nd; ++d) {
    if (a.shape(d) != 1 && a.strides()[d] != a.strides()[d + 1] * a.shape(d + 1)) return -1;
  }
  return a.strides()[nd - 2];
}

// `a`'s data as rows of `cols` elements and their stride: in place where row_stride() finds one, else packed
// into `buf` (stride `cols`).
std::pair<const void*, int64_t> rows_of(const Array& a, int64_t cols, std::vector<uint8_t>& buf) {
  const int64_t stride = row_stride(a);
  if (stride < 0) return {row_major(a, buf), cols};
  return {a.data<void>(), stride};
}

// tandem_kernels::elementwise as a primitive: one chain over one or two inputs of one shape.
class ElementwiseHost : public mx::UnaryPrimitive {
 public:
  ElementwiseHost(mx::Stream s, tandem_kernels::Chain chain) : mx::UnaryPrimitive(s), chain_(chain) {}
  const char* name() const override { return "TandemElementwise"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    return static_cast<const ElementwiseHost&>(other).chain_ == chain_;
  }
  void eval_gpu(const std::vector<Array>&, Array&) override {
    throw std::runtime_error("TandemElementwise runs on the CPU only");
  }
  void eval_cpu(const std::vector<Array>& in, Array& out) override {
    auto& enc = encoder_for(stream(), in, {&out}, donor_for(in, out));
    const int64_t cols = out.ndim() == 0 ? 1 : out.shape(-1), rows = cols == 0 ? 0 : out.size() / cols;
    enc.dispatch([chain = chain_, rows, cols, t = elem(out.dtype()), a = Array::unsafe_weak_copy(in[0]),
                  b = Array::unsafe_weak_copy(in.back()), o = out.data<void>()]() {
      std::vector<uint8_t> ap, bp;
      const auto [ad, sa] = rows_of(a, cols, ap);
      const auto [bd, sb] = rows_of(b, cols, bp);
      tandem_kernels::elementwise(chain, t, ad, sa, bd, sb, o, rows, cols);
    });
  }

 private:
  tandem_kernels::Chain chain_;
};

// tandem_kernels::rms_norm as a primitive: x [..., D] (a last-axis slice read in place), w [D] f32.
class RmsNormHost : public mx::UnaryPrimitive {
 public:
  RmsNormHost(mx::Stream s, float eps, float inv_d) : mx::UnaryPrimitive(s), eps_(eps), inv_d_(inv_d) {}
  const char* name() const override { return "TandemRmsNorm"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const RmsNormHost&>(other);
    return o.eps_ == eps_ && o.inv_d_ == inv_d_;
  }
  void eval_gpu(const std::vector<Array>&, Array&) override {
    throw std::runtime_error("TandemRmsNorm runs on the CPU only");
  }
  void eval_cpu(const std::vector<Array>& in, Array& out) override {
    // Only x may give its buffer (w is the layer's weight).
    auto& enc = encoder_for(stream(), in, {&out}, can_donate(in[0], out) ? &in[0] : nullptr);
    const int64_t cols = out.shape(-1), rows = cols == 0 ? 0 : out.size() / cols;
    enc.dispatch([rows, cols, eps = eps_, inv_d = inv_d_, t = elem(out.dtype()), x = Array::unsafe_weak_copy(in[0]),
                  w = Array::unsafe_weak_copy(in[1]), o = out.data<void>()]() {
      std::vector<uint8_t> xp, wp;
      const auto [xd, sx] = rows_of(x, cols, xp);
      const auto* wd = static_cast<const float*>(row_major(w, wp));
      tandem_kernels::rms_norm(t, xd, sx, wd, o, rows, cols, eps, inv_d);
    });
  }

 private:
  float eps_, inv_d_;
};

// tandem_kernels::gated_norm as a primitive: o [R..., H, D] f32, z [R..., H * D] (a last-axis slice read in
// place), w [D] f32; out like z.
class GatedNormHost : public mx::UnaryPrimitive {
 public:
  GatedNormHost(mx::Stream s, float eps, float inv_d) : mx::UnaryPrimitive(s), eps_(eps), inv_d_(inv_d) {}
  const char* name() const override { return "TandemGatedNorm"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const GatedNormHost&>(other);
    return o.eps_ == eps_ && o.inv_d_ == inv_d_;
  }
  void eval_gpu(const std::vector<Array>&, Array&) override {
    throw std::runtime_error("TandemGatedNorm runs on the CPU only");
  }
  void eval_cpu(const std::vector<Array>& in, Array& out) override {
    auto& enc = encoder_for(stream(), in, {&out});
    const int64_t cols = in[0].shape(-1), heads = in[0].shape(-2), width = out.shape(-1);
    const int64_t rows = width == 0 ? 0 : out.size() / width;
    enc.dispatch([rows, heads, cols, width, eps = eps_, inv_d = inv_d_, t = elem(out.dtype()),
                  o = Array::unsafe_weak_copy(in[0]), z = Array::unsafe_weak_copy(in[1]),
                  w = Array::unsafe_weak_copy(in[2]), out = out.data<void>()]() {
      std::vector<uint8_t> op, zp, wp;
      const auto [zd, sz] = rows_of(z, width, zp);
      tandem_kernels::gated_norm(t, static_cast<const float*>(row_major(o, op)), zd, sz,
                                 static_cast<const float*>(row_major(w, wp)), out, rows, heads, cols, eps, inv_d);
    });
  }

 private:
  float eps_, inv_d_;
};

// tandem_kernels::rope as a primitive: x [B, N, T, D] f32 or bf16 (any strides, read in place), offsets int32
// [1] or [B]; out like x, contiguous.
class RopeHost : public mx::UnaryPrimitive {
 public:
  RopeHost(mx::Stream s, int dims, float base, float scale)
      : mx::UnaryPrimitive(s), dims_(dims), base_(base), scale_(scale) {}
  const char* name() const override { return "TandemRope"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const RopeHost&>(other);
    return o.dims_ == dims_ && o.base_ == base_ && o.scale_ == scale_;
  }
  void eval_gpu(const std::vector<Array>&, Array&) override {
    throw std::runtime_error("TandemRope runs on the CPU only");
  }
  void eval_cpu(const std::vector<Array>& in, Array& out) override {
    auto& enc = encoder_for(stream(), in, {&out});
    enc.dispatch([dims = dims_, base = base_, scale = scale_, t = elem(out.dtype()), x = Array::unsafe_weak_copy(in[0]),
                  off = Array::unsafe_weak_copy(in[1]), o = out.data<void>()]() {
      std::vector<uint8_t> offp;
      const int64_t strides[4] = {x.strides()[0], x.strides()[1], x.strides()[2], x.strides()[3]};
      tandem_kernels::rope(t, x.data<void>(), strides, static_cast<const int32_t*>(row_major(off, offp)),
                           static_cast<int64_t>(off.size()), o, x.shape(0), x.shape(1), x.shape(2), x.shape(3), dims,
                           base, scale);
    });
  }

 private:
  int dims_;
  float base_, scale_;
};

} // namespace

ArrayPtr host_quantized_matmul(const Array& x, const Array& w, const Array& scales, const Array& biases,
                               int32_t group_size, int32_t bits) {
  if (!is_float(x.dtype()) || !is_float(scales.dtype()) || biases.dtype() != scales.dtype()) {
    throw std::invalid_argument("host quantized matmul: x, scales and biases must be f32, bf16 or f16");
  }
  if (bits != 2 && bits != 4 && bits != 8) {
    throw std::invalid_argument("host quantized matmul: " + std::to_string(bits) + " bits (2, 4 or 8 only)");
  }
  if (w.dtype() != mx::uint32 || w.ndim() != 2 || x.ndim() < 1) {
    throw std::invalid_argument("host quantized matmul: x [..., K] and uint32 w [N, K * bits / 32] needed");
  }
  const int k = x.shape(-1), n = w.shape(0);
  if (group_size <= 0 || group_size % 8 != 0 || k % group_size != 0 ||
      static_cast<int64_t>(w.shape(1)) * 32 != static_cast<int64_t>(k) * bits) {
    throw std::invalid_argument("host quantized matmul: K " + std::to_string(k) + ", group " +
                                std::to_string(group_size) + ", w of " + std::to_string(w.shape(1)) + " words a row");
  }
  const mx::Shape sb = {n, k / group_size};
  if (scales.shape() != sb || biases.shape() != sb) {
    throw std::invalid_argument("host quantized matmul: scales and biases must be [N, K / group]");
  }
  auto shape = x.shape();
  shape.back() = n;
  auto s = mx::default_stream(mx::Device::cpu);
  return wrap(Array(std::move(shape), x.dtype(), std::make_shared<QuantizedMatmulNT>(s, group_size, bits),
                    {x, w, scales, biases}));
}

ArrayPtr host_dense_matmul(const Array& x, const Array& w) {
  const auto dt = x.dtype();
  if (!is_float(dt) || w.dtype() != dt) {
    throw std::invalid_argument("host dense matmul: x and w must both be f32, bf16 or f16");
  }
  if (w.ndim() != 2 || x.ndim() < 1 || x.shape(-1) != w.shape(1)) {
    throw std::invalid_argument("host dense matmul: x [..., K] and w [N, K] needed");
  }
  auto shape = x.shape();
  shape.back() = w.shape(0);
  auto s = mx::default_stream(mx::Device::cpu);
  return wrap(Array(std::move(shape), dt, std::make_shared<DenseMatmulNT>(s), {x, w}));
}

ArrayPtr host_attention(const Array& q, const Array& keys, const Array& values, int32_t len, float scale) {
  const auto dt = q.dtype();
  if (!is_float(dt) || keys.dtype() != dt || values.dtype() != dt) {
    throw std::invalid_argument("host attention: q, keys and values must all be f32, bf16 or f16");
  }
  const bool ranks = q.ndim() == 4 && keys.ndim() == 4 && keys.shape() == values.shape();
  if (!ranks || q.shape(0) != 1 || keys.shape(0) != 1 || keys.shape(3) != q.shape(3) || q.shape(1) % keys.shape(1) != 0) {
    throw std::invalid_argument("host attention: q [1, Hq, T, D] and buffers [1, Hkv, CAP, D] with Hq a multiple of Hkv "
                                "needed; got q " + shape_text(q) + ", keys " + shape_text(keys) + ", values " +
                                shape_text(values));
  }
  if (q.shape(2) < 1 || len < q.shape(2) || len > keys.shape(2)) {
    throw std::invalid_argument("host attention: " + std::to_string(q.shape(2)) + " queries over " +
                                std::to_string(len) + " keys of buffers holding " + std::to_string(keys.shape(2)));
  }
  auto s = mx::default_stream(mx::Device::cpu);
  return wrap(Array(q.shape(), dt, std::make_shared<AttentionHost>(s, len, scale), {q, keys, values}));
}

std::unique_ptr<ArrayVec> host_gated_delta(const Array& q, const Array& k, const Array& v, const Array& g,
                                           const Array& beta, const Array& state, bool all_steps) {
  for (const Array* a : {&q, &k, &v, &g, &beta, &state}) {
    if (a->dtype() != mx::float32) throw std::invalid_argument("host gated delta: q, k, v, g, beta and state must be f32");
  }
  const bool ranks = q.ndim() == 4 && v.ndim() == 4 && g.ndim() == 3 && state.ndim() == 4;
  const int b = ranks ? q.shape(0) : 0, t = ranks ? q.shape(1) : 0, hk = ranks ? q.shape(2) : 0;
  const int dk = ranks ? q.shape(3) : 0, hv = ranks ? v.shape(2) : 0, dv = ranks ? v.shape(3) : 0;
  const bool ok = ranks && k.shape() == q.shape() && v.shape() == mx::Shape{b, t, hv, dv} &&
                  g.shape() == mx::Shape{b, t, hv} && beta.shape() == g.shape() &&
                  state.shape() == mx::Shape{b, hv, dv, dk} && hk > 0 && hv % hk == 0 && (t > 0 || !all_steps);
  if (!ok) {
    throw std::invalid_argument("host gated delta: q, k [B, T, Hk, Dk], v [B, T, Hv, Dv], g, beta [B, T, Hv], state "
                                "[B, Hv, Dv, Dk] with Hv a multiple of Hk needed; got q " + shape_text(q) + ", k " +
                                shape_text(k) + ", v " + shape_text(v) + ", g " + shape_text(g) + ", beta " +
                                shape_text(beta) + ", state " + shape_text(state));
  }
  auto s = mx::default_stream(mx::Device::cpu);
  auto outs = Array::make_arrays({{b, t, hv, dv}, {all_steps ? t : 1, b, hv, dv, dk}}, {mx::float32, mx::float32},
                                 std::make_shared<GatedDeltaSteps>(s, all_steps), {q, k, v, g, beta, state});
  auto out = std::make_unique<ArrayVec>();
  out->items = std::move(outs);
  return out;
}

ArrayPtr host_elementwise(int32_t chain, const Array& a, const Array& b) {
  using tandem_kernels::Chain;
  if (chain < 0 || chain > static_cast<int32_t>(Chain::SiluGate)) {
    throw std::invalid_argument("host elementwise: no chain " + std::to_string(chain));
  }
  const auto c = static_cast<Chain>(chain);
  const auto t = b.dtype();  // the chain's storage type (for Silu, a is b)
  const auto ta = c == Chain::SiluGate ? mx::float32 : t;
  if ((t != mx::float32 && t != mx::bfloat16) || a.dtype() != ta) {
    throw std::invalid_argument("host elementwise: chain " + std::to_string(chain) +
                                " needs b f32 or bf16 and a of b's dtype (f32 for the silu gate)");
  }
  if (a.shape() != b.shape()) {
    throw std::invalid_argument("host elementwise: inputs of one shape needed; got " + shape_text(a) + " and " +
                                shape_text(b));
  }
  auto s = mx::default_stream(mx::Device::cpu);
  const std::vector<Array> in = c == Chain::Silu ? std::vector<Array>{a} : std::vector<Array>{a, b};
  return wrap(Array(a.shape(), t, std::make_shared<ElementwiseHost>(s, c), in));
}

std::unique_ptr<ArrayVec> host_gated_delta_qkv(const Array& qkv, const Array& qs, const Array& ks, const Array& g,
                                               const Array& beta, const Array& state, int hk, float eps) {
  for (const Array* a : {&qkv, &qs, &ks, &g, &beta, &state}) {
    if (a->dtype() != mx::float32) throw std::invalid_argument("host gated delta qkv: every input must be f32");
  }
  const bool ranks = qkv.ndim() == 3 && qs.ndim() == 1 && g.ndim() == 3 && state.ndim() == 4;
  const int b = ranks ? qkv.shape(0) : 0, t = ranks ? qkv.shape(1) : 0, dk = ranks ? qs.shape(0) : 0;
  const int hv = ranks ? state.shape(1) : 0, dv = ranks ? state.shape(2) : 0;
  const bool ok = ranks && hk > 0 && hv % hk == 0 && dk > 0 && ks.shape() == qs.shape() &&
                  qkv.shape(2) == 2 * hk * dk + hv * dv && g.shape() == mx::Shape{b, t, hv} &&
                  beta.shape() == g.shape() && state.shape() == mx::Shape{b, hv, dv, dk} && t > 0;
  if (!ok) {
    throw std::invalid_argument("host gated delta qkv: qkv [B, T, 2 Hk Dk + Hv Dv] (T > 0), qs, ks [Dk], g, beta "
                                "[B, T, Hv], state [B, Hv, Dv, Dk] with Hv a multiple of Hk = " + std::to_string(hk) +
                                " needed; got qkv " + shape_text(qkv) + ", qs " + shape_text(qs) + ", ks " +
                                shape_text(ks) + ", g " + shape_text(g) + ", beta " + shape_text(beta) + ", state " +
                                shape_text(state));
  }
  auto s = mx::default_stream(mx::Device::cpu);
  auto outs = Array::make_arrays({{b, t, hv, dv}, {t, b, hv, dv, dk}}, {mx::float32, mx::float32},
                                 std::make_shared<GatedDeltaQkv>(s, hk, eps), {qkv, qs, ks, g, beta, state});
  auto out = std::make_unique<ArrayVec>();
  out->items = std::move(outs);
  return out;
}

ArrayPtr host_gated_norm(const Array& o, const Array& z, const Array& w, float eps, float inv_d) {
  const auto t = z.dtype();
  if (o.dtype() != mx::float32 || (t != mx::float32 && t != mx::bfloat16) || w.dtype() != mx::float32) {
    throw std::invalid_argument("host gated norm: o f32, z f32 or bf16 and w f32 needed");
  }
  bool ok = o.ndim() >= 2 && w.ndim() == 1 && w.shape(0) == o.shape(-1) && z.ndim() == o.ndim() - 1;
  for (int d = 0; ok && d + 2 < static_cast<int>(o.ndim()); ++d) ok = z.shape(d) == o.shape(d);
  if (!ok || z.shape(-1) != o.shape(-1) * o.shape(-2)) {
    throw std::invalid_argument("host gated norm: o [..., H, D], z [..., H * D] and w [D] needed; got o " +
                                shape_text(o) + ", z " + shape_text(z) + ", w " + shape_text(w));
  }
  auto s = mx::default_stream(mx::Device::cpu);
  return wrap(Array(z.shape(), t, std::make_shared<GatedNormHost>(s, eps, inv_d), {o, z, w}));
}

ArrayPtr host_rope(const Array& x, const Array& offsets, int32_t dims, float base, float scale) {
  const auto t = x.dtype();
  if ((t != mx::float32 && t != mx::bfloat16) || offsets.dtype() != mx::int32) {
    throw std::invalid_argument("host rope: x f32 or bf16 and int32 offsets needed");
  }
  const bool offsets_ok = offsets.ndim() == 1 && (offsets.size() == 1 || offsets.size() == size_t(x.shape(0)));
  if (x.ndim() != 4 || !offsets_ok || dims < 2 || dims % 2 != 0 || dims > x.shape(3)) {
    throw std::invalid_argument("host rope: x [B, N, T, D], offsets [1] or [B] and an even dims in 2..=D needed; "
                                "got x " + shape_text(x) + ", offsets " + shape_text(offsets) + ", dims " +
                                std::to_string(dims));
  }
  auto s = mx::default_stream(mx::Device::cpu);
  return wrap(Array(x.shape(), t, std::make_shared<RopeHost>(s, dims, base, scale), {x, offsets}));
}

ArrayPtr host_rms_norm(const Array& x, const Array& w, float eps, float inv_d) {
  const auto t = x.dtype();
  if ((t != mx::float32 && t != mx::bfloat16) || w.dtype() != mx::float32) {
    throw std::invalid_argument("host rms norm: x f32 or bf16 and w f32 needed");
  }
  if (x.ndim() < 1 || w.ndim() != 1 || w.shape(0) != x.shape(-1)) {
    throw std::invalid_argument("host rms norm: x [..., D] and w [D] needed; got x " + shape_text(x) + ", w " +
                                shape_text(w));
  }
  auto s = mx::default_stream(mx::Device::cpu);
  return wrap(Array(x.shape(), t, std::make_shared<RmsNormHost>(s, eps, inv_d), {x, w}));
}

}  // namespace mlxb
