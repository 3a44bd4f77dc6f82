// Implementation of bridge.h. Kept mechanical on purpose: each function forwards to MLX.
#include "mlx-bridge/cxx/bridge.h"

#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <unordered_set>

#include "mlx/primitives.h"

#include "mlx-bridge/src/ffi.rs.h"

namespace mx = mlx::core;

namespace mlxb {
namespace {

mx::Dtype to_dtype(DtypeCode code) {
  switch (code) {
    case DtypeCode::Bool: return mx::bool_;
    case DtypeCode::U8: return mx::uint8;
    case DtypeCode::U16: return mx::uint16;
    case DtypeCode::U32: return mx::uint32;
    case DtypeCode::U64: return mx::uint64;
    case DtypeCode::I8: return mx::int8;
    case DtypeCode::I16: return mx::int16;
    case DtypeCode::I32: return mx::int32;
    case DtypeCode::I64: return mx::int64;
    case DtypeCode::F16: return mx::float16;
    case DtypeCode::F32: return mx::float32;
    case DtypeCode::F64: return mx::float64;
    case DtypeCode::BF16: return mx::bfloat16;
    case DtypeCode::C64: return mx::complex64;
  }
  throw std::invalid_argument("unknown dtype code " + std::to_string(static_cast<int>(code)));
}

// Exhaustive over MLX's types (the build uses -Werror=switch), so a type added to MLX fails the build here
// instead of reaching Rust as another type.
DtypeCode from_dtype(mx::Dtype d) {
  switch (d.val()) {
    case mx::Dtype::Val::bool_: return DtypeCode::Bool;
    case mx::Dtype::Val::uint8: return DtypeCode::U8;
    case mx::Dtype::Val::uint16: return DtypeCode::U16;
    case mx::Dtype::Val::uint32: return DtypeCode::U32;
    case mx::Dtype::Val::uint64: return DtypeCode::U64;
    case mx::Dtype::Val::int8: return DtypeCode::I8;
    case mx::Dtype::Val::int16: return DtypeCode::I16;
    case mx::Dtype::Val::int32: return DtypeCode::I32;
    case mx::Dtype::Val::int64: return DtypeCode::I64;
    case mx::Dtype::Val::float16: return DtypeCode::F16;
    case mx::Dtype::Val::float32: return DtypeCode::F32;
    case mx::Dtype::Val::float64: return DtypeCode::F64;
    case mx::Dtype::Val::bfloat16: return DtypeCode::BF16;
    case mx::Dtype::Val::complex64: return DtypeCode::C64;
  }
  throw std::invalid_argument("unsupported MLX dtype");
}

mx::Shape to_shape(rust::Slice<const int32_t> s) { return mx::Shape(s.begin(), s.end()); }
std::vector<int> to_ints(rust::Slice<const int32_t> s) { return std::vector<int>(s.begin(), s.end()); }
ArrayPtr wrap(Array a) { return std::make_unique<Array>(std::move(a)); }
std::unique_ptr<ArrayVec> wrap_vec(std::vector<Array> v) {
  auto out = std::make_unique<ArrayVec>();
  out->items = std::move(v);
  return out;
}
std::optional<Array> opt(const Array& a, bool has) {
  return has ? std::optional<Array>(a) : std::nullopt;
}

}  // namespace

// --- construction and inspection ---
ArrayPtr array_from_bytes(rust::Slice<const uint8_t> data, rust::Slice<const int32_t> shape, DtypeCode dtype) {
  auto dt = to_dtype(dtype);
  auto shp = to_shape(shape);
  size_t n = 1;
  for (auto d : shp) n *= static_cast<size_t>(d);
  if (n * dt.size() != data.size()) {
    throw std::invalid_argument("array_from_bytes: " + std::to_string(data.size()) + " bytes for " +
                                std::to_string(n) + " elements of " + std::to_string(dt.size()) + " bytes");
  }
  auto buf = mx::allocator::malloc(data.size());
  if (data.size() > 0) std::memcpy(buf.buffer().raw_ptr(), data.data(), data.size());
  return wrap(Array(std::move(buf), std::move(shp), dt));
}

ArrayPtr array_from_external(const uint8_t* data, rust::Slice<const int32_t> shape, DtypeCode dtype, size_t owner) {
  // MLX calls the deleter once it no longer needs the memory; the Rust owner (e.g. a memory map) lives until then.
  return wrap(Array(const_cast<uint8_t*>(data), to_shape(shape), to_dtype(dtype),
                    [owner](void*) { release_owner(owner); }));
}

ArrayPtr array_scalar_f64(double v, DtypeCode dtype) { return wrap(Array(static_cast<float>(v), to_dtype(dtype))); }
ArrayPtr array_clone(const Array& a) { return std::make_unique<Array>(a); }
ArrayPtr array_zeros(rust::Slice<const int32_t> shape, DtypeCode dtype) { return wrap(mx::zeros(to_shape(shape), to_dtype(dtype))); }
ArrayPtr array_ones(rust::Slice<const int32_t> shape, DtypeCode dtype) { return wrap(mx::ones(to_shape(shape), to_dtype(dtype))); }
ArrayPtr array_full(rust::Slice<const int32_t> shape, double v, DtypeCode dtype) {
  return wrap(mx::full(to_shape(shape), Array(static_cast<float>(v), to_dtype(dtype)), to_dtype(dtype)));
}
ArrayPtr array_arange(double start, double stop, double step, DtypeCode dtype) { return wrap(mx::arange(start, stop, step, to_dtype(dtype))); }
ArrayPtr array_eye(int32_t n, DtypeCode dtype) { return wrap(mx::eye(n, n, 0, to_dtype(dtype))); }
ArrayPtr array_tri(int32_t n, int32_t m, int32_t k, DtypeCode dtype) { return wrap(mx::tri(n, m, k, to_dtype(dtype))); }
rust::Vec<int32_t> array_shape(const Array& a) {
  rust::Vec<int32_t> out;
  for (auto d : a.shape()) out.push_back(d);
  return out;
}
DtypeCode array_dtype(const Array& a) { return from_dtype(a.dtype()); }
size_t array_size(const Array& a) { return a.size(); }
size_t array_nbytes(const Array& a) { return a.nbytes(); }
void array_eval(const Array& a) { const_cast<Array&>(a).eval(); }
bool array_is_ready(const Array& a) { return a.is_available(); }

void array_copy_to(const Array& a, rust::Slice<uint8_t> out) {
  // An array already evaluated (or scheduled) into a dense row-major buffer is read where it lies after
  // waiting for it: making it contiguous first would be one more graph to evaluate, a launch and a device sync
  // on the GPU, for each token a batch reads. Lazy arrays and strided or broadcast views go through a copy.
  const bool dense = a.status() != Array::Status::unscheduled && a.flags().row_contiguous && a.data_size() == a.size();
  Array c = dense ? a : mx::contiguous(a);
  c.eval();
  if (c.nbytes() != out.size()) {
    throw std::invalid_argument("array_copy_to: array has " + std::to_string(c.nbytes()) + " bytes, buffer " +
                                std::to_string(out.size()));
  }
  if (out.size() > 0) std::memcpy(out.data(), c.data<uint8_t>(), out.size());
}

// --- lists ---
std::unique_ptr<ArrayVec> vec_new() { return std::make_unique<ArrayVec>(); }
void vec_push(ArrayVec& v, const Array& a) { v.items.push_back(a); }
size_t vec_len(const ArrayVec& v) { return v.items.size(); }
ArrayPtr vec_get(const ArrayVec& v, size_t i) { return std::make_unique<Array>(v.items.at(i)); }

// --- evaluation, devices, memory ---
void eval_all(const ArrayVec& v) { mx::eval(v.items); }
void async_eval_all(const ArrayVec& v) { mx::async_eval(v.items); }
void synchronize() { mx::synchronize(); }
void set_default_device(bool gpu) { mx::set_default_device(gpu ? mx::Device::gpu : mx::Device::cpu); }
bool default_device_is_gpu() { return mx::default_device().type == mx::Device::gpu; }
bool gpu_available() { return mx::is_available(mx::Device::gpu); }
bool cuda_available() { return mx::cu::is_available(); }
int32_t cuda_compute_capability() {
  if (!mx::cu::is_available()) return -1;
  try {
    const auto& info = mx::gpu::device_info(0);
    auto major = info.find("compute_capability_major"), minor = info.find("compute_capability_minor");
    if (major == info.end() || minor == info.end()) return -1;
    return static_cast<int32_t>(std::get<size_t>(major->second) * 10 + std::get<size_t>(minor->second));
  } catch (...) {
    return -1;
  }
}
int32_t new_stream(bool gpu) { return mx::new_stream(gpu ? mx::Device::gpu : mx::Device::cpu).index; }
void set_default_stream(int32_t index, bool gpu) {
  for (auto& s : mx::get_streams()) {
    if (s.index == index && (s.device.type == mx::Device::gpu) == gpu) {
      mx::set_default_stream(s);
      return;
    }
  }
  throw std::invalid_argument("no stream with index " + std::to_string(index));
}
size_t get_active_memory() { return mx::get_active_memory(); }
size_t get_peak_memory() { return mx::get_peak_memory(); }
size_t get_cache_memory() { return mx::get_cache_memory(); }
void reset_peak_memory() { mx::reset_peak_memory(); }
void clear_cache() { mx::clear_cache(); }
size_t set_memory_limit(size_t limit) { return mx::set_memory_limit(limit); }
size_t set_cache_limit(size_t limit) { return mx::set_cache_limit(limit); }
rust::String version() { return rust::String(mx::version()); }

// --- elementwise ---
ArrayPtr unary(UnaryOp op, const Array& a) {
  switch (op) {
    case UnaryOp::Negative: return wrap(mx::negative(a));
    case UnaryOp::Abs: return wrap(mx::abs(a));
    case UnaryOp::Exp: return wrap(mx::exp(a));
    case UnaryOp::Log: return wrap(mx::log(a));
    case UnaryOp::Log1p: return wrap(mx::log1p(a));
    case UnaryOp::Sqrt: return wrap(mx::sqrt(a));
    case UnaryOp::Rsqrt: return wrap(mx::rsqrt(a));
    case UnaryOp::Square: return wrap(mx::square(a));
    case UnaryOp::Sigmoid: return wrap(mx::sigmoid(a));
    case UnaryOp::Tanh: return wrap(mx::tanh(a));
    case UnaryOp::Erf: return wrap(mx::erf(a));
    case UnaryOp::Sin: return wrap(mx::sin(a));
    case UnaryOp::Cos: return wrap(mx::cos(a));
    case UnaryOp::Floor: return wrap(mx::floor(a));
    case UnaryOp::Ceil: return wrap(mx::ceil(a));
    case UnaryOp::Round: return wrap(mx::round(a));
    case UnaryOp::LogicalNot: return wrap(mx::logical_not(a));
    case UnaryOp::Reciprocal: return wrap(mx::reciprocal(a));
    case UnaryOp::Expm1: return wrap(mx::expm1(a));
    case UnaryOp::Sign: return wrap(mx::sign(a));
    case UnaryOp::Isnan: return wrap(mx::isnan(a));
    case UnaryOp::Isinf: return wrap(mx::isinf(a));
  }
  throw std::invalid_argument("unknown unary op " + std::to_string(static_cast<int>(op)));
}

ArrayPtr binary(BinaryOp op, const Array& a, const Array& b) {
  switch (op) {
    case BinaryOp::Add: return wrap(mx::add(a, b));
    case BinaryOp::Subtract: return wrap(mx::subtract(a, b));
    case BinaryOp::Multiply: return wrap(mx::multiply(a, b));
    case BinaryOp::Divide: return wrap(mx::divide(a, b));
    case BinaryOp::Power: return wrap(mx::power(a, b));
    case BinaryOp::Maximum: return wrap(mx::maximum(a, b));
    case BinaryOp::Minimum: return wrap(mx::minimum(a, b));
    case BinaryOp::Equal: return wrap(mx::equal(a, b));
    case BinaryOp::NotEqual: return wrap(mx::not_equal(a, b));
    case BinaryOp::Less: return wrap(mx::less(a, b));
    case BinaryOp::LessEqual: return wrap(mx::less_equal(a, b));
    case BinaryOp::Greater: return wrap(mx::greater(a, b));
    case BinaryOp::GreaterEqual: return wrap(mx::greater_equal(a, b));
    case BinaryOp::LogicalAnd: return wrap(mx::logical_and(a, b));
    case BinaryOp::LogicalOr: return wrap(mx::logical_or(a, b));
    case BinaryOp::Logaddexp: return wrap(mx::logaddexp(a, b));
    case BinaryOp::Remainder: return wrap(mx::remainder(a, b));
    case BinaryOp::FloorDivide: return wrap(mx::floor_divide(a, b));
    case BinaryOp::Arctan2: return wrap(mx::arctan2(a, b));
    case BinaryOp::BitwiseAnd: return wrap(mx::bitwise_and(a, b));
    case BinaryOp::BitwiseOr: return wrap(mx::bitwise_or(a, b));
    case BinaryOp::LeftShift: return wrap(mx::left_shift(a, b));
    case BinaryOp::RightShift: return wrap(mx::right_shift(a, b));
  }
  throw std::invalid_argument("unknown binary op " + std::to_string(static_cast<int>(op)));
}

ArrayPtr astype(const Array& a, DtypeCode dtype) { return wrap(mx::astype(a, to_dtype(dtype))); }
ArrayPtr where_(const Array& c, const Array& a, const Array& b) { return wrap(mx::where(c, a, b)); }
ArrayPtr clip(const Array& a, const Array& lo, const Array& hi) { return wrap(mx::clip(a, lo, hi)); }
ArrayPtr stop_gradient(const Array& a) { return wrap(mx::stop_gradient(a)); }
ArrayPtr contiguous(const Array& a) { return wrap(mx::contiguous(a)); }

// --- shape ---
ArrayPtr reshape(const Array& a, rust::Slice<const int32_t> shape) { return wrap(mx::reshape(a, to_shape(shape))); }
ArrayPtr transpose(const Array& a, rust::Slice<const int32_t> axes) { return wrap(mx::transpose(a, to_ints(axes))); }
ArrayPtr swapaxes(const Array& a, int32_t a1, int32_t a2) { return wrap(mx::swapaxes(a, a1, a2)); }
ArrayPtr slice(const Array& a, rust::Slice<const int32_t> start, rust::Slice<const int32_t> stop, rust::Slice<const int32_t> strides) {
  return wrap(mx::slice(a, to_shape(start), to_shape(stop), to_shape(strides)));
}
ArrayPtr slice_dynamic(const Array& a, const Array& start, rust::Slice<const int32_t> axes, rust::Slice<const int32_t> sizes) {
  return wrap(mx::slice(a, start, to_ints(axes), to_shape(sizes)));
}
ArrayPtr slice_update(const Array& src, const Array& upd, rust::Slice<const int32_t> start, rust::Slice<const int32_t> stop, rust::Slice<const int32_t> strides) {
  return wrap(mx::slice_update(src, upd, to_shape(start), to_shape(stop), to_shape(strides)));
}
ArrayPtr concatenate(const ArrayVec& v, int32_t axis) { return wrap(mx::concatenate(v.items, axis)); }
ArrayPtr stack(const ArrayVec& v, int32_t axis) { return wrap(mx::stack(v.items, axis)); }
std::unique_ptr<ArrayVec> split_sections(const Array& a, int32_t n, int32_t axis) { return wrap_vec(mx::split(a, n, axis)); }
std::unique_ptr<ArrayVec> split_indices(const Array& a, rust::Slice<const int32_t> indices, int32_t axis) {
  return wrap_vec(mx::split(a, to_shape(indices), axis));
}
ArrayPtr take(const Array& a, const Array& idx, int32_t axis) { return wrap(mx::take(a, idx, axis)); }
ArrayPtr take_along_axis(const Array& a, const Array& idx, int32_t axis) { return wrap(mx::take_along_axis(a, idx, axis)); }
ArrayPtr put_along_axis(const Array& a, const Array& idx, const Array& vals, int32_t axis) {
  return wrap(mx::put_along_axis(a, idx, vals, axis));
}
ArrayPtr broadcast_to(const Array& a, rust::Slice<const int32_t> shape) { return wrap(mx::broadcast_to(a, to_shape(shape))); }
ArrayPtr expand_dims(const Array& a, rust::Slice<const int32_t> axes) { return wrap(mx::expand_dims(a, to_ints(axes))); }
ArrayPtr squeeze(const Array& a, rust::Slice<const int32_t> axes) { return wrap(mx::squeeze(a, to_ints(axes))); }
ArrayPtr flatten(const Array& a, int32_t start, int32_t end) { return wrap(mx::flatten(a, start, end)); }
ArrayPtr repeat(const Array& a, int32_t repeats, int32_t axis) { return wrap(mx::repeat(a, repeats, axis)); }
ArrayPtr tile(const Array& a, rust::Slice<const int32_t> reps) { return wrap(mx::tile(a, to_ints(reps))); }
ArrayPtr pad(const Array& a, rust::Slice<const int32_t> axes, rust::Slice<const int32_t> low, rust::Slice<const int32_t> high, const Array& value) {
  return wrap(mx::pad(a, to_ints(axes), to_shape(low), to_shape(high), value));
}
ArrayPtr moveaxis(const Array& a, int32_t src, int32_t dst) { return wrap(mx::moveaxis(a, src, dst)); }

// --- reductions ---
ArrayPtr reduce(ReduceOp op, const Array& a, rust::Slice<const int32_t> axes, bool keepdims) {
  auto ax = to_ints(axes);
  switch (op) {
    case ReduceOp::Sum: return wrap(mx::sum(a, ax, keepdims));
    case ReduceOp::Mean: return wrap(mx::mean(a, ax, keepdims));
    case ReduceOp::Max: return wrap(mx::max(a, ax, keepdims));
    case ReduceOp::Min: return wrap(mx::min(a, ax, keepdims));
    case ReduceOp::Prod: return wrap(mx::prod(a, ax, keepdims));
    case ReduceOp::Logsumexp: return wrap(mx::logsumexp(a, ax, keepdims));
    case ReduceOp::All: return wrap(mx::all(a, ax, keepdims));
    case ReduceOp::Any: return wrap(mx::any(a, ax, keepdims));
    case ReduceOp::Var: return wrap(mx::var(a, ax, keepdims));
  }
  throw std::invalid_argument("unknown reduction " + std::to_string(static_cast<int>(op)));
}
ArrayPtr arg_reduce(ArgReduceOp op, const Array& a, int32_t axis, bool keepdims) {
  return wrap(op == ArgReduceOp::Argmax ? mx::argmax(a, axis, keepdims) : mx::argmin(a, axis, keepdims));
}
ArrayPtr softmax(const Array& a, rust::Slice<const int32_t> axes, bool precise) { return wrap(mx::softmax(a, to_ints(axes), precise)); }
ArrayPtr cumsum(const Array& a, int32_t axis, bool reverse, bool inclusive) { return wrap(mx::cumsum(a, axis, reverse, inclusive)); }
ArrayPtr sort(const Array& a, int32_t axis) { return wrap(mx::sort(a, axis)); }
ArrayPtr argsort(const Array& a, int32_t axis) { return wrap(mx::argsort(a, axis)); }
ArrayPtr topk(const Array& a, int32_t k, int32_t axis) { return wrap(mx::topk(a, k, axis)); }
ArrayPtr argpartition(const Array& a, int32_t kth, int32_t axis) { return wrap(mx::argpartition(a, kth, axis)); }

// --- linear algebra and convolution ---
ArrayPtr matmul(const Array& a, const Array& b) { return wrap(mx::matmul(a, b)); }
ArrayPtr addmm(const Array& c, const Array& a, const Array& b, float alpha, float beta) { return wrap(mx::addmm(c, a, b, alpha, beta)); }
ArrayPtr conv1d(const Array& x, const Array& w, int32_t stride, int32_t padding, int32_t dilation, int32_t groups) {
  return wrap(mx::conv1d(x, w, stride, padding, dilation, groups));
}
ArrayPtr conv2d(const Array& x, const Array& w, rust::Slice<const int32_t> stride, rust::Slice<const int32_t> padding, int32_t groups) {
  if (stride.size() != 2 || padding.size() != 2) throw std::invalid_argument("conv2d: stride and padding need 2 values");
  return wrap(mx::conv2d(x, w, {stride[0], stride[1]}, {padding[0], padding[1]}, {1, 1}, groups));
}
ArrayPtr conv3d(const Array& x, const Array& w, rust::Slice<const int32_t> stride, rust::Slice<const int32_t> padding, int32_t groups) {
  if (stride.size() != 3 || padding.size() != 3) throw std::invalid_argument("conv3d: stride and padding need 3 values");
  return wrap(mx::conv3d(x, w, {stride[0], stride[1], stride[2]}, {padding[0], padding[1], padding[2]}, {1, 1, 1}, groups));
}

// --- host kernels: host_kernels.cc ---

// --- quantization ---
std::unique_ptr<ArrayVec> quantize(const Array& w, int32_t group_size, int32_t bits, rust::Str mode) {
  return wrap_vec(mx::quantize(w, group_size, bits, std::string(mode)));
}
ArrayPtr dequantize(const Array& w, const Array& scales, const Array& biases, bool has_biases, int32_t group_size, int32_t bits, rust::Str mode) {
  return wrap(mx::dequantize(w, scales, opt(biases, has_biases), group_size, bits, std::string(mode)));
}
ArrayPtr quantized_matmul(const Array& x, const Array& w, const Array& scales, const Array& biases, bool has_biases, bool transpose, int32_t group_size, int32_t bits, rust::Str mode) {
  return wrap(mx::quantized_matmul(x, w, scales, opt(biases, has_biases), transpose, group_size, bits, std::string(mode)));
}

// --- fast ---
ArrayPtr rms_norm(const Array& x, const Array& w, bool has_w, float eps) { return wrap(mx::fast::rms_norm(x, opt(w, has_w), eps)); }
ArrayPtr layer_norm(const Array& x, const Array& w, bool has_w, const Array& b, bool has_b, float eps) {
  return wrap(mx::fast::layer_norm(x, opt(w, has_w), opt(b, has_b), eps));
}
ArrayPtr rope(const Array& x, int32_t dims, bool traditional, float base, float scale, int32_t offset) {
  return wrap(mx::fast::rope(x, dims, traditional, base, scale, offset));
}
ArrayPtr rope_dynamic(const Array& x, int32_t dims, bool traditional, float base, float scale, const Array& offset) {
  return wrap(mx::fast::rope(x, dims, traditional, base, scale, offset));
}
ArrayPtr rope_freqs(const Array& x, int32_t dims, bool traditional, float scale, int32_t offset, const Array& freqs) {
  return wrap(mx::fast::rope(x, dims, traditional, std::nullopt, scale, offset, freqs));
}
ArrayPtr sdpa(const Array& q, const Array& k, const Array& v, float scale, rust::Str mask_mode, const Array& mask, bool has_mask) {
  return wrap(mx::fast::scaled_dot_product_attention(q, k, v, scale, std::string(mask_mode), opt(mask, has_mask)));
}
std::unique_ptr<ArrayVec> gated_delta_update(const Array& q, const Array& k, const Array& v, const Array& g, const Array& beta, const Array& state, bool has_state) {
  return wrap_vec(mx::fast::gated_delta_update(q, k, v, g, beta, opt(state, has_state)));
}

// --- random ---
ArrayPtr random_key(uint64_t seed) { return wrap(mx::random::key(seed)); }
std::unique_ptr<ArrayVec> random_split(const Array& key, int32_t num) {
  auto keys = mx::random::split(key, num);
  std::vector<Array> out;
  for (int i = 0; i < num; ++i) out.push_back(mx::take(keys, i, 0));
  return wrap_vec(std::move(out));
}
ArrayPtr random_uniform(rust::Slice<const int32_t> shape, DtypeCode dtype, const Array& key) {
  return wrap(mx::random::uniform(to_shape(shape), to_dtype(dtype), key));
}
ArrayPtr random_normal(rust::Slice<const int32_t> shape, DtypeCode dtype, const Array& key) {
  return wrap(mx::random::normal(to_shape(shape), to_dtype(dtype), key));
}
ArrayPtr random_categorical(const Array& logits, int32_t axis, const Array& key) { return wrap(mx::random::categorical(logits, axis, key)); }
ArrayPtr random_gumbel(rust::Slice<const int32_t> shape, DtypeCode dtype, const Array& key) {
  return wrap(mx::random::gumbel(to_shape(shape), to_dtype(dtype), key));
}

// --- custom kernels ---
namespace {
std::vector<std::string> to_strings(rust::Slice<const rust::String> s) {
  std::vector<std::string> out;
  for (auto& x : s) out.emplace_back(std::string(x));
  return out;
}
}  // namespace

std::unique_ptr<Kernel> metal_kernel(rust::Str name, rust::Slice<const rust::String> inputs, rust::Slice<const rust::String> outputs, rust::Str source, rust::Str header, bool row_contiguous) {
  auto k = std::make_unique<Kernel>();
  k->fn = mx::fast::metal_kernel(std::string(name), to_strings(inputs), to_strings(outputs), std::string(source), std::string(header), row_contiguous);
  return k;
}
std::unique_ptr<Kernel> cuda_kernel(rust::Str name, rust::Slice<const rust::String> inputs, rust::Slice<const rust::String> outputs, rust::Str source, rust::Str header, bool row_contiguous) {
  auto k = std::make_unique<Kernel>();
  k->fn = mx::fast::cuda_kernel(std::string(name), to_strings(inputs), to_strings(outputs), std::string(source), std::string(header), row_contiguous);
  return k;
}
std::unique_ptr<ArrayVec> kernel_call(const Kernel& k, const ArrayVec& inputs, rust::Slice<const int32_t> out_shapes_flat, rust::Slice<const int32_t> out_ndims, rust::Slice<const DtypeCode> out_dtypes, rust::Slice<const int32_t> grid, rust::Slice<const int32_t> threadgroup, rust::Slice<const rust::String> tmpl_names, rust::Slice<const int32_t> tmpl_ints) {
  if (grid.size() != 3 || threadgroup.size() != 3) throw std::invalid_argument("kernel_call: grid and threadgroup need 3 values");
  if (tmpl_names.size() != tmpl_ints.size()) throw std::invalid_argument("kernel_call: template names and values differ in count");
  std::vector<mx::Shape> shapes;
  size_t pos = 0;
  for (auto nd : out_ndims) {
    if (pos + nd > out_shapes_flat.size()) throw std::invalid_argument("kernel_call: output shapes too short");
    shapes.emplace_back(out_shapes_flat.begin() + pos, out_shapes_flat.begin() + pos + nd);
    pos += nd;
  }
  std::vector<mx::Dtype> dtypes;
  for (auto d : out_dtypes) dtypes.push_back(to_dtype(d));
  std::vector<std::pair<std::string, mx::fast::TemplateArg>> tmpl;
  for (size_t i = 0; i < tmpl_names.size(); ++i) tmpl.emplace_back(std::string(tmpl_names[i]), static_cast<int>(tmpl_ints[i]));
  return wrap_vec(k.fn(inputs.items, shapes, dtypes, {grid[0], grid[1], grid[2]}, {threadgroup[0], threadgroup[1], threadgroup[2]},
                       tmpl, std::nullopt, false, {}));
}

// --- graph compilation ---
std::unique_ptr<Compiled> compile(rust::Fn<std::unique_ptr<ArrayVec>(size_t, const ArrayVec&)> body, size_t context, bool shapeless) {
  auto traced = [body, context](const std::vector<mx::array>& inputs) {
    ArrayVec in{inputs};
    auto out = body(context, in);
    if (!out) throw std::runtime_error(std::string(compile_take_error()));
    return std::move(out->items);
  };
  // A lambda has no function address, so MLX keys its cache by a pointer it owns and erases the
  // entry when the returned function (held by `Compiled`) is destroyed.
  auto c = std::make_unique<Compiled>();
  c->fn = mx::compile(std::function<std::vector<mx::array>(const std::vector<mx::array>&)>(traced), shapeless);
  return c;
}

std::unique_ptr<ArrayVec> compiled_call(const Compiled& c, const ArrayVec& inputs) {
  auto out = std::make_unique<ArrayVec>();
  out->items = c.fn(inputs.items);
  return out;
}

// One name per operation: an unevaluated array, its sibling outputs (of a multi-output op) counted
// with it. Not per primitive object: a compiled function's replays share theirs.
rust::Vec<rust::String> graph_op_names(const ArrayVec& outputs) {
  rust::Vec<rust::String> names;
  std::unordered_set<std::uintptr_t> seen;
  std::vector<mx::array> stack(outputs.items.begin(), outputs.items.end());
  while (!stack.empty()) {
    mx::array a = std::move(stack.back());
    stack.pop_back();
    if (!seen.insert(a.id()).second || !a.has_primitive()) continue;
    bool counted = false;
    for (auto& s : a.siblings()) counted |= !seen.insert(s.id()).second;
    if (!counted) names.push_back(rust::String(a.primitive().name()));
    for (auto& in : a.inputs()) stack.push_back(in);
  }
  return names;
}

// --- distributed ---
namespace {
mx::StreamOrDevice comm_stream(bool cpu) {
  if (cpu) return mx::Device(mx::Device::cpu);
  return {};
}
}  // namespace

bool dist_is_available(rust::Str backend) { return mx::distributed::is_available(std::string(backend)); }
std::unique_ptr<DistGroup> dist_init(bool strict, rust::Str backend) {
  return std::make_unique<DistGroup>(DistGroup{mx::distributed::init(strict, std::string(backend))});
}
int32_t dist_rank(const DistGroup& g) { return g.group.rank(); }
int32_t dist_size(const DistGroup& g) { return g.group.size(); }
ArrayPtr dist_all_sum(const Array& a, const DistGroup& g, bool cpu) {
  return wrap(mx::distributed::all_sum(a, g.group, comm_stream(cpu)));
}
ArrayPtr dist_all_gather(const Array& a, const DistGroup& g, bool cpu) {
  return wrap(mx::distributed::all_gather(a, g.group, comm_stream(cpu)));
}
ArrayPtr dist_send(const Array& a, int32_t dst, const DistGroup& g, bool cpu) {
  return wrap(mx::distributed::send(a, dst, g.group, comm_stream(cpu)));
}
ArrayPtr dist_recv(rust::Slice<const int32_t> shape, DtypeCode dtype, int32_t src, const DistGroup& g, bool cpu) {
  return wrap(mx::distributed::recv(to_shape(shape), to_dtype(dtype), src, g.group, comm_stream(cpu)));
}

}  // namespace mlxb
