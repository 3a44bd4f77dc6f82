//! The cxx bridge declarations. Every C++ function that can throw returns `Result`, because cxx
//! treats any other function as noexcept and a throw there would abort the process.

// The bridge module is named for what it is; `mlx::ffi::ffi` is cxx's shape, not a naming slip.
#[allow(clippy::module_inception)]
#[cxx::bridge(namespace = "mlxb")]
pub(crate) mod ffi {
    // Codes shared with C++ as `enum class`es: both sides name the same variants, so a code can never be
    // read as another type or op, and an unknown value is an error on either side.
    #[repr(u8)]
    enum DtypeCode {
        Bool,
        U8,
        U16,
        U32,
        U64,
        I8,
        I16,
        I32,
        I64,
        F16,
        F32,
        F64,
        BF16,
        C64,
    }
    #[repr(u8)]
    enum UnaryOp {
        Negative,
        Abs,
        Exp,
        Log,
        Log1p,
        Sqrt,
        Rsqrt,
        Square,
        Sigmoid,
        Tanh,
        Erf,
        Sin,
        Cos,
        Floor,
        Ceil,
        Round,
        LogicalNot,
        Reciprocal,
        Expm1,
        Sign,
        Isnan,
        Isinf,
    }
    #[repr(u8)]
    enum BinaryOp {
        Add,
        Subtract,
        Multiply,
        Divide,
        Power,
        Maximum,
        Minimum,
        Equal,
        NotEqual,
        Less,
        LessEqual,
        Greater,
        GreaterEqual,
        LogicalAnd,
        LogicalOr,
        Logaddexp,
        Remainder,
        FloorDivide,
        Arctan2,
        BitwiseAnd,
        BitwiseOr,
        LeftShift,
        RightShift,
    }
    #[repr(u8)]
    enum ReduceOp {
        Sum,
        Mean,
        Max,
        Min,
        Prod,
        Logsumexp,
        All,
        Any,
        Var,
    }
    #[repr(u8)]
    enum ArgReduceOp {
        Argmax,
        Argmin,
    }

    unsafe extern "C++" {
        include!("mlx-bridge/cxx/bridge.h");

        type Array;
        type ArrayVec;
        type Kernel;
        type Compiled;
        type DistGroup;

        fn array_from_bytes(data: &[u8], shape: &[i32], dtype: DtypeCode) -> Result<UniquePtr<Array>>;
        unsafe fn array_from_external(
            data: *const u8,
            shape: &[i32],
            dtype: DtypeCode,
            owner: usize,
        ) -> Result<UniquePtr<Array>>;
        fn array_scalar_f64(v: f64, dtype: DtypeCode) -> Result<UniquePtr<Array>>;
        fn array_clone(a: &Array) -> Result<UniquePtr<Array>>;
        fn array_zeros(shape: &[i32], dtype: DtypeCode) -> Result<UniquePtr<Array>>;
        fn array_ones(shape: &[i32], dtype: DtypeCode) -> Result<UniquePtr<Array>>;
        fn array_full(shape: &[i32], v: f64, dtype: DtypeCode) -> Result<UniquePtr<Array>>;
        fn array_arange(start: f64, stop: f64, step: f64, dtype: DtypeCode) -> Result<UniquePtr<Array>>;
        fn array_eye(n: i32, dtype: DtypeCode) -> Result<UniquePtr<Array>>;
        fn array_tri(n: i32, m: i32, k: i32, dtype: DtypeCode) -> Result<UniquePtr<Array>>;
        fn array_shape(a: &Array) -> Vec<i32>;
        fn array_dtype(a: &Array) -> Result<DtypeCode>;
        fn array_size(a: &Array) -> usize;
        fn array_nbytes(a: &Array) -> usize;
        fn array_eval(a: &Array) -> Result<()>;
        fn array_is_ready(a: &Array) -> bool;
        fn array_copy_to(a: &Array, out: &mut [u8]) -> Result<()>;

        fn vec_new() -> UniquePtr<ArrayVec>;
        fn vec_push(v: Pin<&mut ArrayVec>, a: &Array);
        fn vec_len(v: &ArrayVec) -> usize;
        fn vec_get(v: &ArrayVec, i: usize) -> Result<UniquePtr<Array>>;

        fn eval_all(v: &ArrayVec) -> Result<()>;
        fn async_eval_all(v: &ArrayVec) -> Result<()>;
        fn synchronize() -> Result<()>;
        fn set_default_device(gpu: bool) -> Result<()>;
        fn default_device_is_gpu() -> bool;
        fn gpu_available() -> bool;
        fn cuda_available() -> bool;
        fn cuda_compute_capability() -> i32;
        fn new_stream(gpu: bool) -> Result<i32>;
        fn set_default_stream(index: i32, gpu: bool) -> Result<()>;
        fn get_active_memory() -> usize;
        fn get_peak_memory() -> usize;
        fn get_cache_memory() -> usize;
        fn reset_peak_memory();
        fn clear_cache();
        fn set_memory_limit(limit: usize) -> usize;
        fn set_cache_limit(limit: usize) -> usize;
        fn version() -> String;

        fn unary(op: UnaryOp, a: &Array) -> Result<UniquePtr<Array>>;
        fn binary(op: BinaryOp, a: &Array, b: &Array) -> Result<UniquePtr<Array>>;
        fn astype(a: &Array, dtype: DtypeCode) -> Result<UniquePtr<Array>>;
        fn where_(c: &Array, a: &Array, b: &Array) -> Result<UniquePtr<Array>>;
        fn clip(a: &Array, lo: &Array, hi: &Array) -> Result<UniquePtr<Array>>;
        fn stop_gradient(a: &Array) -> Result<UniquePtr<Array>>;
        fn contiguous(a: &Array) -> Result<UniquePtr<Array>>;

        fn reshape(a: &Array, shape: &[i32]) -> Result<UniquePtr<Array>>;
        fn transpose(a: &Array, axes: &[i32]) -> Result<UniquePtr<Array>>;
        fn swapaxes(a: &Array, a1: i32, a2: i32) -> Result<UniquePtr<Array>>;
        fn slice(a: &Array, start: &[i32], stop: &[i32], strides: &[i32]) -> Result<UniquePtr<Array>>;
        fn slice_dynamic(a: &Array, start: &Array, axes: &[i32], sizes: &[i32]) -> Result<UniquePtr<Array>>;
        fn slice_update(
            src: &Array,
            upd: &Array,
            start: &[i32],
            stop: &[i32],
            strides: &[i32],
        ) -> Result<UniquePtr<Array>>;
        fn concatenate(v: &ArrayVec, axis: i32) -> Result<UniquePtr<Array>>;
        fn stack(v: &ArrayVec, axis: i32) -> Result<UniquePtr<Array>>;
        fn split_sections(a: &Array, n: i32, axis: i32) -> Result<UniquePtr<ArrayVec>>;
        fn split_indices(a: &Array, indices: &[i32], axis: i32) -> Result<UniquePtr<ArrayVec>>;
        fn take(a: &Array, idx: &Array, axis: i32) -> Result<UniquePtr<Array>>;
        fn take_along_axis(a: &Array, idx: &Array, axis: i32) -> Result<UniquePtr<Array>>;
        fn put_along_axis(a: &Array, idx: &Array, vals: &Array, axis: i32) -> Result<UniquePtr<Array>>;
        fn broadcast_to(a: &Array, shape: &[i32]) -> Result<UniquePtr<Array>>;
        fn expand_dims(a: &Array, axes: &[i32]) -> Result<UniquePtr<Array>>;
        fn squeeze(a: &Array, axes: &[i32]) -> Result<UniquePtr<Array>>;
        fn flatten(a: &Array, start: i32, end: i32) -> Result<UniquePtr<Array>>;
        fn repeat(a: &Array, repeats: i32, axis: i32) -> Result<UniquePtr<Array>>;
        fn tile(a: &Array, reps: &[i32]) -> Result<UniquePtr<Array>>;
        fn pad(a: &Array, axes: &[i32], low: &[i32], high: &[i32], value: &Array) -> Result<UniquePtr<Array>>;
        fn moveaxis(a: &Array, src: i32, dst: i32) -> Result<UniquePtr<Array>>;

        fn reduce(op: ReduceOp, a: &Array, axes: &[i32], keepdims: bool) -> Result<UniquePtr<Array>>;
        fn arg_reduce(op: ArgReduceOp, a: &Array, axis: i32, keepdims: bool) -> Result<UniquePtr<Array>>;
        fn softmax(a: &Array, axes: &[i32], precise: bool) -> Result<UniquePtr<Array>>;
        fn cumsum(a: &Array, axis: i32, reverse: bool, inclusive: bool) -> Result<UniquePtr<Array>>;
        fn sort(a: &Array, axis: i32) -> Result<UniquePtr<Array>>;
        fn argsort(a: &Array, axis: i32) -> Result<UniquePtr<Array>>;
        fn topk(a: &Array, k: i32, axis: i32) -> Result<UniquePtr<Array>>;
        fn argpartition(a: &Array, kth: i32, axis: i32) -> Result<UniquePtr<Array>>;

        fn matmul(a: &Array, b: &Array) -> Result<UniquePtr<Array>>;
        fn addmm(c: &Array, a: &Array, b: &Array, alpha: f32, beta: f32) -> Result<UniquePtr<Array>>;
        fn host_dense_matmul(x: &Array, w: &Array) -> Result<UniquePtr<Array>>;
        fn host_quantized_matmul(
            x: &Array,
            w: &Array,
            scales: &Array,
            biases: &Array,
            group_size: i32,
            bits: i32,
        ) -> Result<UniquePtr<Array>>;
        fn host_elementwise(chain: i32, a: &Array, b: &Array) -> Result<UniquePtr<Array>>;
        fn host_rms_norm(x: &Array, w: &Array, eps: f32, inv_d: f32) -> Result<UniquePtr<Array>>;
        fn host_gated_norm(o: &Array, z: &Array, w: &Array, eps: f32, inv_d: f32) -> Result<UniquePtr<Array>>;
        fn host_rope(x: &Array, offsets: &Array, dims: i32, base: f32, scale: f32) -> Result<UniquePtr<Array>>;
        fn host_attention(q: &Array, keys: &Array, values: &Array, len: i32, scale: f32) -> Result<UniquePtr<Array>>;
        fn host_gated_delta(
            q: &Array,
            k: &Array,
            v: &Array,
            g: &Array,
            beta: &Array,
            state: &Array,
            all_steps: bool,
        ) -> Result<UniquePtr<ArrayVec>>;
        #[allow(clippy::too_many_arguments)]
        fn host_gated_delta_qkv(
            qkv: &Array,
            qs: &Array,
            ks: &Array,
            g: &Array,
            beta: &Array,
            state: &Array,
            hk: i32,
            eps: f32,
        ) -> Result<UniquePtr<ArrayVec>>;
        fn conv1d(
            x: &Array,
            w: &Array,
            stride: i32,
            padding: i32,
            dilation: i32,
            groups: i32,
        ) -> Result<UniquePtr<Array>>;
        fn conv2d(x: &Array, w: &Array, stride: &[i32], padding: &[i32], groups: i32) -> Result<UniquePtr<Array>>;
        fn conv3d(x: &Array, w: &Array, stride: &[i32], padding: &[i32], groups: i32) -> Result<UniquePtr<Array>>;

        fn quantize(w: &Array, group_size: i32, bits: i32, mode: &str) -> Result<UniquePtr<ArrayVec>>;
        fn dequantize(
            w: &Array,
            scales: &Array,
            biases: &Array,
            has_biases: bool,
            group_size: i32,
            bits: i32,
            mode: &str,
        ) -> Result<UniquePtr<Array>>;
        #[allow(clippy::too_many_arguments)]
        fn quantized_matmul(
            x: &Array,
            w: &Array,
            scales: &Array,
            biases: &Array,
            has_biases: bool,
            transpose: bool,
            group_size: i32,
            bits: i32,
            mode: &str,
        ) -> Result<UniquePtr<Array>>;

        fn rms_norm(x: &Array, w: &Array, has_w: bool, eps: f32) -> Result<UniquePtr<Array>>;
        fn layer_norm(x: &Array, w: &Array, has_w: bool, b: &Array, has_b: bool, eps: f32) -> Result<UniquePtr<Array>>;
        fn rope(
            x: &Array,
            dims: i32,
            traditional: bool,
            base: f32,
            scale: f32,
            offset: i32,
        ) -> Result<UniquePtr<Array>>;
        fn rope_dynamic(
            x: &Array,
            dims: i32,
            traditional: bool,
            base: f32,
            scale: f32,
            offset: &Array,
        ) -> Result<UniquePtr<Array>>;
        fn rope_freqs(
            x: &Array,
            dims: i32,
            traditional: bool,
            scale: f32,
            offset: i32,
            freqs: &Array,
        ) -> Result<UniquePtr<Array>>;
        fn sdpa(
            q: &Array,
            k: &Array,
            v: &Array,
            scale: f32,
            mask_mode: &str,
            mask: &Array,
            has_mask: bool,
        ) -> Result<UniquePtr<Array>>;
        fn gated_delta_update(
            q: &Array,
            k: &Array,
            v: &Array,
            g: &Array,
            beta: &Array,
            state: &Array,
            has_state: bool,
        ) -> Result<UniquePtr<ArrayVec>>;

        fn random_key(seed: u64) -> Result<UniquePtr<Array>>;
        fn random_split(key: &Array, num: i32) -> Result<UniquePtr<ArrayVec>>;
        fn random_uniform(shape: &[i32], dtype: DtypeCode, key: &Array) -> Result<UniquePtr<Array>>;
        fn random_normal(shape: &[i32], dtype: DtypeCode, key: &Array) -> Result<UniquePtr<Array>>;
        fn random_categorical(logits: &Array, axis: i32, key: &Array) -> Result<UniquePtr<Array>>;
        fn random_gumbel(shape: &[i32], dtype: DtypeCode, key: &Array) -> Result<UniquePtr<Array>>;

        fn metal_kernel(
            name: &str,
            inputs: &[String],
            outputs: &[String],
            source: &str,
            header: &str,
            row_contiguous: bool,
        ) -> Result<UniquePtr<Kernel>>;
        fn cuda_kernel(
            name: &str,
            inputs: &[String],
            outputs: &[String],
            source: &str,
            header: &str,
            row_contiguous: bool,
        ) -> Result<UniquePtr<Kernel>>;
        #[allow(clippy::too_many_arguments)]
        fn kernel_call(
            k: &Kernel,
            inputs: &ArrayVec,
            out_shapes_flat: &[i32],
            out_ndims: &[i32],
            out_dtypes: &[DtypeCode],
            grid: &[i32],
            threadgroup: &[i32],
            tmpl_names: &[String],
            tmpl_ints: &[i32],
        ) -> Result<UniquePtr<ArrayVec>>;

        fn compile(
            body: fn(context: usize, inputs: &ArrayVec) -> UniquePtr<ArrayVec>,
            context: usize,
            shapeless: bool,
        ) -> Result<UniquePtr<Compiled>>;
        fn compiled_call(c: &Compiled, inputs: &ArrayVec) -> Result<UniquePtr<ArrayVec>>;
        fn graph_op_names(outputs: &ArrayVec) -> Vec<String>;

        fn dist_is_available(backend: &str) -> bool;
        fn dist_init(strict: bool, backend: &str) -> Result<UniquePtr<DistGroup>>;
        fn dist_rank(g: &DistGroup) -> i32;
        fn dist_size(g: &DistGroup) -> i32;
        fn dist_all_sum(a: &Array, g: &DistGroup, cpu: bool) -> Result<UniquePtr<Array>>;
        fn dist_all_gather(a: &Array, g: &DistGroup, cpu: bool) -> Result<UniquePtr<Array>>;
        fn dist_send(a: &Array, dst: i32, g: &DistGroup, cpu: bool) -> Result<UniquePtr<Array>>;
        fn dist_recv(shape: &[i32], dtype: DtypeCode, src: i32, g: &DistGroup, cpu: bool) -> Result<UniquePtr<Array>>;
    }

    extern "Rust" {
        fn release_owner(owner: usize);
        fn compile_take_error() -> String;
    }
}

/// The message of the last failed traced function on this thread (see `compile.rs`).
fn compile_take_error() -> String {
    crate::compile::take_error()
}

/// Called by MLX (through the deleter of an external buffer) when it no longer needs memory that a
/// Rust owner keeps alive, e.g. a memory-mapped safetensors file.
fn release_owner(owner: usize) {
    if owner != 0 {
        // SAFETY: `owner` was produced by `Box::into_raw` in `Array::from_external` and MLX calls the
        // deleter exactly once.
        drop(unsafe { Box::from_raw(owner as *mut crate::array::Owner) });
    }
}
