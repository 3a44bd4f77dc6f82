// The C++ half of the bridge: thin functions over MLX's C++ API that cxx can call.
// Every function that can throw is declared fallible on the Rust side, so an MLX exception
// becomes an `Err` carrying MLX's message instead of aborting the process.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "mlx/distributed/distributed.h"
#include "mlx/distributed/ops.h"
#include "mlx/mlx.h"
#include "rust/cxx.h"

namespace mlxb {

// The shared enums are defined by the generated ffi.rs.h; declared here so the signatures can name them.
enum class DtypeCode : uint8_t;
enum class UnaryOp : uint8_t;
enum class BinaryOp : uint8_t;
enum class ReduceOp : uint8_t;
enum class ArgReduceOp : uint8_t;

using Array = mlx::core::array;
using ArrayPtr = std::unique_ptr<Array>;

// A list of arrays passed across the bridge (cxx cannot hold slices of opaque C++ types).
struct ArrayVec {
  std::vector<Array> items;
};

// A compiled custom kernel (mlx::fast::metal_kernel / cuda_kernel).
struct Kernel {
  mlx::core::fast::CustomKernelFunction fn;
};

// A function traced and fused by MLX's graph compiler (mlx::core::compile).
struct Compiled {
  std::function<std::vector<Array>(const std::vector<Array>&)> fn;
};

// A group of processes that communicate (mlx::core::distributed::Group has no default constructor).
struct DistGroup {
  mlx::core::distributed::Group group;
};

// --- construction and inspection ---
ArrayPtr array_from_bytes(rust::Slice<const uint8_t> data, rust::Slice<const int32_t> shape, DtypeCode dtype);
ArrayPtr array_from_external(const uint8_t* data, rust::Slice<const int32_t> shape, DtypeCode dtype, size_t owner);
ArrayPtr array_scalar_f64(double v, DtypeCode dtype);
ArrayPtr array_clone(const Array& a);
ArrayPtr array_zeros(rust::Slice<const int32_t> shape, DtypeCode dtype);
ArrayPtr array_ones(rust::Slice<const int32_t> shape, DtypeCode dtype);
ArrayPtr array_full(rust::Slice<const int32_t> shape, double v, DtypeCode dtype);
ArrayPtr array_arange(double start, double stop, double step, DtypeCode dtype);
ArrayPtr array_eye(int32_t n, DtypeCode dtype);
ArrayPtr array_tri(int32_t n, int32_t m, int32_t k, DtypeCode dtype);
rust::Vec<int32_t> array_shape(const Array& a);
DtypeCode array_dtype(const Array& a);
size_t array_size(const Array& a);
size_t array_nbytes(const Array& a);
void array_eval(const Array& a);
bool array_is_ready(const Array& a);
void array_copy_to(const Array& a, rust::Slice<uint8_t> out);

// --- lists ---
std::unique_ptr<ArrayVec> vec_new();
void vec_push(ArrayVec& v, const Array& a);
size_t vec_len(const ArrayVec& v);
ArrayPtr vec_get(const ArrayVec& v, size_t i);

// --- evaluation, devices, memory ---
void eval_all(const ArrayVec& v);
void async_eval_all(const ArrayVec& v);
void synchronize();
void set_default_device(bool gpu);
bool default_device_is_gpu();
bool gpu_available();
bool cuda_available();
// major * 10 + minor of CUDA device 0; -1 without CUDA.
int32_t cuda_compute_capability();
int32_t new_stream(bool gpu);
void set_default_stream(int32_t index, bool gpu);
size_t get_active_memory();
size_t get_peak_memory();
size_t get_cache_memory();
void reset_peak_memory();
void clear_cache();
size_t set_memory_limit(size_t limit);
size_t set_cache_limit(size_t limit);
rust::String version();

// --- unary and binary elementwise ops (op codes are defined in ffi.rs) ---
ArrayPtr unary(UnaryOp op, const Array& a);
ArrayPtr binary(BinaryOp op, const Array& a, const Array& b);
ArrayPtr astype(const Array& a, DtypeCode dtype);
ArrayPtr where_(const Array& c, const Array& a, const Array& b);
ArrayPtr clip(const Array& a, const Array& lo, const Array& hi);
ArrayPtr stop_gradient(const Array& a);
ArrayPtr contiguous(const Array& a);

// --- shape ---
ArrayPtr reshape(const Array& a, rust::Slice<const int32_t> shape);
ArrayPtr transpose(const Array& a, rust::Slice<const int32_t> axes);
ArrayPtr swapaxes(const Array& a, int32_t a1, int32_t a2);
ArrayPtr slice(const Array& a, rust::Slice<const int32_t> start, rust::Slice<const int32_t> stop, rust::Slice<const int32_t> strides);
ArrayPtr slice_dynamic(const Array& a, const Array& start, rust::Slice<const int32_t> axes, rust::Slice<const int32_t> sizes);
ArrayPtr slice_update(const Array& src, const Array& upd, rust::Slice<const int32_t> start, rust::Slice<const int32_t> stop, rust::Slice<const int32_t> strides);
ArrayPtr concatenate(const ArrayVec& v, int32_t axis);
ArrayPtr stack(const ArrayVec& v, int32_t axis);
std::unique_ptr<ArrayVec> split_sections(const Array& a, int32_t n, int32_t axis);
std::unique_ptr<ArrayVec> split_indices(const Array& a, rust::Slice<const int32_t> indices, int32_t axis);
ArrayPtr take(const Array& a, const Array& idx, int32_t axis);
ArrayPtr take_along_axis(const Array& a, const Array& idx, int32_t axis);
ArrayPtr put_along_axis(const Array& a, const Array& idx, const Array& vals, int32_t axis);
ArrayPtr broadcast_to(const Array& a, rust::Slice<const int32_t> shape);
ArrayPtr expand_dims(const Array& a, rust::Slice<const int32_t> axes);
ArrayPtr squeeze(const Array& a, rust::Slice<const int32_t> axes);
ArrayPtr flatten(const Array& a, int32_t start, int32_t end);
ArrayPtr repeat(const Array& a, int32_t repeats, int32_t axis);
ArrayPtr tile(const Array& a, rust::Slice<const int32_t> reps);
ArrayPtr pad(const Array& a, rust::Slice<const int32_t> axes, rust::Slice<const int32_t> low, rust::Slice<const int32_t> high, const Array& value);
ArrayPtr moveaxis(const Array& a, int32_t src, int32_t dst);

// --- reductions (op codes in ffi.rs) ---
ArrayPtr reduce(ReduceOp op, const Array& a, rust::Slice<const int32_t> axes, bool keepdims);
ArrayPtr arg_reduce(ArgReduceOp op, const Array& a, int32_t axis, bool keepdims);
ArrayPtr softmax(const Array& a, rust::Slice<const int32_t> axes, bool precise);
ArrayPtr cumsum(const Array& a, int32_t axis, bool reverse, bool inclusive);
ArrayPtr sort(const Array& a, int32_t axis);
ArrayPtr argsort(const Array& a, int32_t axis);
ArrayPtr topk(const Array& a, int32_t k, int32_t axis);
ArrayPtr argpartition(const Array& a, int32_t kth, int32_t axis);

// --- linear algebra and convolution ---
ArrayPtr matmul(const Array& a, const Array& b);
ArrayPtr addmm(const Array& c, const Array& a, const Array& b, float alpha, float beta);
ArrayPtr conv1d(const Array& x, const Array& w, int32_t stride, int32_t padding, int32_t dilation, int32_t groups);
ArrayPtr conv2d(const Array& x, const Array& w, rust::Slice<const int32_t> stride, rust::Slice<const int32_t> padding, int32_t groups);
ArrayPtr conv3d(const Array& x, const Array& w, rust::Slice<const int32_t> stride, rust::Slice<const int32_t> padding, int32_t groups);

// --- host kernels (kernels/cpu/) ---
ArrayPtr host_dense_matmul(const Array& x, const Array& w);
ArrayPtr host_quantized_matmul(const Array& x, const Array& w, const Array& scales, const Array& biases, int32_t group_size, int32_t bits);
ArrayPtr host_elementwise(int32_t chain, const Array& a, const Array& b);
ArrayPtr host_rms_norm(const Array& x, const Array& w, float eps, float inv_d);
ArrayPtr host_gated_norm(const Array& o, const Array& z, const Array& w, float eps, float inv_d);
ArrayPtr host_rope(const Array& x, const Array& offsets, int32_t dims, float base, float scale);
ArrayPtr host_attention(const Array& q, const Array& keys, const Array& values, int32_t len, float scale);
std::unique_ptr<ArrayVec> host_gated_delta(const Array& q, const Array& k, const Array& v, const Array& g, const Array& beta, const Array& state, bool all_steps);
std::unique_ptr<ArrayVec> host_gated_delta_qkv(const Array& qkv, const Array& qs, const Array& ks, const Array& g,
                                               const Array& beta, const Array& state, int hk, float eps);

// --- quantization ---
std::unique_ptr<ArrayVec> quantize(const Array& w, int32_t group_size, int32_t bits, rust::Str mode);
ArrayPtr dequantize(const Array& w, const Array& scales, const Array& biases, bool has_biases, int32_t group_size, int32_t bits, rust::Str mode);
ArrayPtr quantized_matmul(const Array& x, const Array& w, const Array& scales, const Array& biases, bool has_biases, bool transpose, int32_t group_size, int32_t bits, rust::Str mode);

// --- fast ---
ArrayPtr rms_norm(const Array& x, const Array& w, bool has_w, float eps);
ArrayPtr layer_norm(const Array& x, const Array& w, bool has_w, const Array& b, bool has_b, float eps);
ArrayPtr rope(const Array& x, int32_t dims, bool traditional, float base, float scale, int32_t offset);
ArrayPtr rope_dynamic(const Array& x, int32_t dims, bool traditional, float base, float scale, const Array& offset);
ArrayPtr rope_freqs(const Array& x, int32_t dims, bool traditional, float scale, int32_t offset, const Array& freqs);
ArrayPtr sdpa(const Array& q, const Array& k, const Array& v, float scale, rust::Str mask_mode, const Array& mask, bool has_mask);
std::unique_ptr<ArrayVec> gated_delta_update(const Array& q, const Array& k, const Array& v, const Array& g, const Array& beta, const Array& state, bool has_state);

// --- random ---
ArrayPtr random_key(uint64_t seed);
std::unique_ptr<ArrayVec> random_split(const Array& key, int32_t num);
ArrayPtr random_uniform(rust::Slice<const int32_t> shape, DtypeCode dtype, const Array& key);
ArrayPtr random_normal(rust::Slice<const int32_t> shape, DtypeCode dtype, const Array& key);
ArrayPtr random_categorical(const Array& logits, int32_t axis, const Array& key);
ArrayPtr random_gumbel(rust::Slice<const int32_t> shape, DtypeCode dtype, const Array& key);

// --- custom kernels ---
std::unique_ptr<Kernel> metal_kernel(rust::Str name, rust::Slice<const rust::String> inputs, rust::Slice<const rust::String> outputs, rust::Str source, rust::Str header, bool row_contiguous);
std::unique_ptr<Kernel> cuda_kernel(rust::Str name, rust::Slice<const rust::String> inputs, rust::Slice<const rust::String> outputs, rust::Str source, rust::Str header, bool row_contiguous);
std::unique_ptr<ArrayVec> kernel_call(const Kernel& k, const ArrayVec& inputs, rust::Slice<const int32_t> out_shapes_flat, rust::Slice<const int32_t> out_ndims, rust::Slice<const DtypeCode> out_dtypes, rust::Slice<const int32_t> grid, rust::Slice<const int32_t> threadgroup, rust::Slice<const rust::String> tmpl_names, rust::Slice<const int32_t> tmpl_ints);

// --- graph compilation ---
// `body(context, inputs)` is a Rust function building the graph; it returns null on error (the
// message is then taken from Rust). `context` identifies the Rust closure and outlives the result.
std::unique_ptr<Compiled> compile(rust::Fn<std::unique_ptr<ArrayVec>(size_t, const ArrayVec&)> body, size_t context, bool shapeless);
std::unique_ptr<ArrayVec> compiled_call(const Compiled& c, const ArrayVec& inputs);
// The operations MLX will run to evaluate `outputs` (those not yet evaluated), one primitive name each.
rust::Vec<rust::String> graph_op_names(const ArrayVec& outputs);

// --- distributed (the ring backend over TCP, MPI, JACCL, NCCL as MLX builds them) ---
bool dist_is_available(rust::Str backend);
std::unique_ptr<DistGroup> dist_init(bool strict, rust::Str backend);
int32_t dist_rank(const DistGroup& g);
int32_t dist_size(const DistGroup& g);
ArrayPtr dist_all_sum(const Array& a, const DistGroup& g, bool cpu);
ArrayPtr dist_all_gather(const Array& a, const DistGroup& g, bool cpu);
ArrayPtr dist_send(const Array& a, int32_t dst, const DistGroup& g, bool cpu);
ArrayPtr dist_recv(rust::Slice<const int32_t> shape, DtypeCode dtype, int32_t src, const DistGroup& g, bool cpu);

}  // namespace mlxb
