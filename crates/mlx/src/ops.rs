//! Array operations: elementwise math, shapes, reductions, linear algebra.
//! Names follow MLX's C++ API (and mlx-rs where practical).

use crate::ffi::ffi;
use crate::{Array, Dtype, Result};

macro_rules! unary_ops {
    ($($name:ident = $op:ident),* $(,)?) => {
        impl Array {
            $(pub fn $name(&self) -> Result<Array> { Array::wrap(ffi::unary(ffi::UnaryOp::$op, self.raw())) })*
        }
    };
}
unary_ops!(
    negative = Negative,
    abs = Abs,
    exp = Exp,
    log = Log,
    log1p = Log1p,
    sqrt = Sqrt,
    rsqrt = Rsqrt,
    square = Square,
    sigmoid = Sigmoid,
    tanh = Tanh,
    erf = Erf,
    sin = Sin,
    cos = Cos,
    floor = Floor,
    ceil = Ceil,
    round = Round,
    logical_not = LogicalNot,
    reciprocal = Reciprocal,
    expm1 = Expm1,
    sign = Sign,
    isnan = Isnan,
    isinf = Isinf,
);

macro_rules! binary_ops {
    ($($name:ident = $op:ident),* $(,)?) => {
        impl Array {
            $(pub fn $name(&self, other: &Array) -> Result<Array> {
                Array::wrap(ffi::binary(ffi::BinaryOp::$op, self.raw(), other.raw()))
            })*
        }
    };
}
binary_ops!(
    add = Add,
    subtract = Subtract,
    multiply = Multiply,
    divide = Divide,
    power = Power,
    maximum = Maximum,
    minimum = Minimum,
    equal = Equal,
    not_equal = NotEqual,
    less = Less,
    less_equal = LessEqual,
    greater = Greater,
    greater_equal = GreaterEqual,
    logical_and = LogicalAnd,
    logical_or = LogicalOr,
    logaddexp = Logaddexp,
    remainder = Remainder,
    floor_divide = FloorDivide,
    arctan2 = Arctan2,
    bitwise_and = BitwiseAnd,
    bitwise_or = BitwiseOr,
    left_shift = LeftShift,
    right_shift = RightShift,
);

macro_rules! reductions {
    ($($name:ident => $op:ident),* $(,)?) => {
        impl Array {
            $(
            /// Reduces over `axes` (all axes when empty).
            pub fn $name(&self, axes: &[i32], keepdims: bool) -> Result<Array> {
                let all: Vec<i32>;
                let axes = if axes.is_empty() { all = (0..self.ndim() as i32).collect(); &all } else { axes };
                Array::wrap(ffi::reduce(ffi::ReduceOp::$op, self.raw(), axes, keepdims))
            })*
        }
    };
}
reductions!(sum => Sum, mean => Mean, max => Max, min => Min, prod => Prod, logsumexp => Logsumexp,
            all => All, any => Any, var => Var);

impl Array {
    // --- elementwise helpers built from the above ---
    /// `x * sigmoid(x)`.
    pub fn silu(&self) -> Result<Array> {
        self.multiply(&self.sigmoid()?)
    }
    /// `log(1 + exp(x))`, computed stably as `logaddexp(x, 0)`.
    pub fn softplus(&self) -> Result<Array> {
        self.logaddexp(&Array::scalar(0.0, self.dtype())?)
    }
    /// GELU with the exact erf form.
    pub fn gelu(&self) -> Result<Array> {
        let half = Array::scalar(0.5, self.dtype())?;
        let inv_sqrt2 = Array::scalar(std::f64::consts::FRAC_1_SQRT_2, self.dtype())?;
        let one = Array::scalar(1.0, self.dtype())?;
        self.multiply(&half)?.multiply(&self.multiply(&inv_sqrt2)?.erf()?.add(&one)?)
    }
    /// GELU with the tanh approximation (`gelu_pytorch_tanh`).
    pub fn gelu_tanh(&self) -> Result<Array> {
        let dt = self.dtype();
        let c = Array::scalar((2.0 / std::f64::consts::PI).sqrt(), dt)?;
        let k = Array::scalar(0.044715, dt)?;
        let inner = self.add(&self.power(&Array::scalar(3.0, dt)?)?.multiply(&k)?)?.multiply(&c)?;
        let one = Array::scalar(1.0, dt)?;
        self.multiply(&Array::scalar(0.5, dt)?)?.multiply(&inner.tanh()?.add(&one)?)
    }
    pub fn as_dtype(&self, dtype: Dtype) -> Result<Array> {
        if self.dtype() == dtype {
            return Ok(self.clone());
        }
        Array::wrap(ffi::astype(self.raw(), dtype.code()))
    }
    pub fn clip(&self, lo: &Array, hi: &Array) -> Result<Array> {
        Array::wrap(ffi::clip(self.raw(), lo.raw(), hi.raw()))
    }
    pub fn stop_gradient(&self) -> Result<Array> {
        Array::wrap(ffi::stop_gradient(self.raw()))
    }
    pub fn contiguous(&self) -> Result<Array> {
        Array::wrap(ffi::contiguous(self.raw()))
    }

    // --- shape ---
    pub fn reshape(&self, shape: &[i32]) -> Result<Array> {
        Array::wrap(ffi::reshape(self.raw(), shape))
    }
    pub fn transpose(&self, axes: &[i32]) -> Result<Array> {
        Array::wrap(ffi::transpose(self.raw(), axes))
    }
    /// Reverses the axes (matrix transpose for 2-D arrays).
    pub fn t(&self) -> Result<Array> {
        let axes: Vec<i32> = (0..self.ndim() as i32).rev().collect();
        self.transpose(&axes)
    }
    pub fn swapaxes(&self, a: i32, b: i32) -> Result<Array> {
        Array::wrap(ffi::swapaxes(self.raw(), a, b))
    }
    pub fn moveaxis(&self, src: i32, dst: i32) -> Result<Array> {
        Array::wrap(ffi::moveaxis(self.raw(), src, dst))
    }
    /// `a[start:stop:strides]` per axis.
    pub fn slice(&self, start: &[i32], stop: &[i32], strides: &[i32]) -> Result<Array> {
        Array::wrap(ffi::slice(self.raw(), start, stop, strides))
    }
    /// Slices `[start, stop)` along one axis (negative indices count from the end).
    pub fn slice_axis(&self, axis: i32, start: i32, stop: i32) -> Result<Array> {
        let shape = self.shape();
        let nd = shape.len() as i32;
        let ax = if axis < 0 { nd + axis } else { axis } as usize;
        let norm = |i: i32| if i < 0 { shape[ax] + i } else { i.min(shape[ax]) };
        let mut lo = vec![0; shape.len()];
        let mut hi = shape.clone();
        lo[ax] = norm(start);
        hi[ax] = norm(stop);
        self.slice(&lo, &hi, &vec![1; shape.len()])
    }
    /// Slices with starts given by an array (no host synchronisation).
    pub fn slice_dynamic(&self, start: &Array, axes: &[i32], sizes: &[i32]) -> Result<Array> {
        Array::wrap(ffi::slice_dynamic(self.raw(), start.raw(), axes, sizes))
    }
    /// A copy of `self` with `update` written into the slice `[start:stop:strides]`.
    pub fn slice_update(&self, update: &Array, start: &[i32], stop: &[i32], strides: &[i32]) -> Result<Array> {
        Array::wrap(ffi::slice_update(self.raw(), update.raw(), start, stop, strides))
    }
    pub fn split(&self, sections: i32, axis: i32) -> Result<Vec<Array>> {
        crate::vec_from(ffi::split_sections(self.raw(), sections, axis)?)
    }
    /// Splits before each of `indices` along `axis`.
    pub fn split_at(&self, indices: &[i32], axis: i32) -> Result<Vec<Array>> {
        crate::vec_from(ffi::split_indices(self.raw(), indices, axis)?)
    }
    pub fn take(&self, indices: &Array, axis: i32) -> Result<Array> {
        Array::wrap(ffi::take(self.raw(), indices.raw(), axis))
    }
    pub fn take_along_axis(&self, indices: &Array, axis: i32) -> Result<Array> {
        Array::wrap(ffi::take_along_axis(self.raw(), indices.raw(), axis))
    }
    pub fn put_along_axis(&self, indices: &Array, values: &Array, axis: i32) -> Result<Array> {
        Array::wrap(ffi::put_along_axis(self.raw(), indices.raw(), values.raw(), axis))
    }
    pub fn broadcast_to(&self, shape: &[i32]) -> Result<Array> {
        Array::wrap(ffi::broadcast_to(self.raw(), shape))
    }
    pub fn expand_dims(&self, axes: &[i32]) -> Result<Array> {
        Array::wrap(ffi::expand_dims(self.raw(), axes))
    }
    pub fn squeeze(&self, axes: &[i32]) -> Result<Array> {
        Array::wrap(ffi::squeeze(self.raw(), axes))
    }
    pub fn flatten(&self, start: i32, end: i32) -> Result<Array> {
        Array::wrap(ffi::flatten(self.raw(), start, end))
    }
    pub fn repeat(&self, repeats: i32, axis: i32) -> Result<Array> {
        Array::wrap(ffi::repeat(self.raw(), repeats, axis))
    }
    pub fn tile(&self, reps: &[i32]) -> Result<Array> {
        Array::wrap(ffi::tile(self.raw(), reps))
    }
    /// Pads `axes` with `low`/`high` copies of `value`.
    pub fn pad(&self, axes: &[i32], low: &[i32], high: &[i32], value: &Array) -> Result<Array> {
        Array::wrap(ffi::pad(self.raw(), axes, low, high, value.raw()))
    }

    // --- reductions and ordering ---
    pub fn argmax(&self, axis: i32, keepdims: bool) -> Result<Array> {
        Array::wrap(ffi::arg_reduce(ffi::ArgReduceOp::Argmax, self.raw(), axis, keepdims))
    }
    pub fn argmin(&self, axis: i32, keepdims: bool) -> Result<Array> {
        Array::wrap(ffi::arg_reduce(ffi::ArgReduceOp::Argmin, self.raw(), axis, keepdims))
    }
    /// Softmax over `axes`; `precise` accumulates in f32 for half-precision inputs.
    pub fn softmax(&self, axes: &[i32], precise: bool) -> Result<Array> {
        Array::wrap(ffi::softmax(self.raw(), axes, precise))
    }
    pub fn cumsum(&self, axis: i32, reverse: bool, inclusive: bool) -> Result<Array> {
        Array::wrap(ffi::cumsum(self.raw(), axis, reverse, inclusive))
    }
    pub fn sort(&self, axis: i32) -> Result<Array> {
        Array::wrap(ffi::sort(self.raw(), axis))
    }
    pub fn argsort(&self, axis: i32) -> Result<Array> {
        Array::wrap(ffi::argsort(self.raw(), axis))
    }
    /// The `k` largest values along `axis` (in no particular order).
    pub fn topk(&self, k: i32, axis: i32) -> Result<Array> {
        Array::wrap(ffi::topk(self.raw(), k, axis))
    }
    pub fn argpartition(&self, kth: i32, axis: i32) -> Result<Array> {
        Array::wrap(ffi::argpartition(self.raw(), kth, axis))
    }

    // --- linear algebra ---
    pub fn matmul(&self, other: &Array) -> Result<Array> {
        Array::wrap(ffi::matmul(self.raw(), other.raw()))
    }
}

/// `cond ? a : b`, broadcasting.
pub fn where_(cond: &Array, a: &Array, b: &Array) -> Result<Array> {
    Array::wrap(ffi::where_(cond.raw(), a.raw(), b.raw()))
}

pub fn concatenate(arrays: &[&Array], axis: i32) -> Result<Array> {
    Array::wrap(ffi::concatenate(&crate::vec_to(arrays), axis))
}

pub fn stack(arrays: &[&Array], axis: i32) -> Result<Array> {
    Array::wrap(ffi::stack(&crate::vec_to(arrays), axis))
}

/// `beta * c + alpha * (a @ b)`.
pub fn addmm(c: &Array, a: &Array, b: &Array, alpha: f32, beta: f32) -> Result<Array> {
    Array::wrap(ffi::addmm(c.raw(), a.raw(), b.raw(), alpha, beta))
}

/// 1-D convolution; `x` is `[N, L, C_in]`, `w` is `[C_out, K, C_in / groups]` (MLX's layout).
pub fn conv1d(x: &Array, w: &Array, stride: i32, padding: i32, dilation: i32, groups: i32) -> Result<Array> {
    Array::wrap(ffi::conv1d(x.raw(), w.raw(), stride, padding, dilation, groups))
}

/// 2-D convolution; `x` is `[N, H, W, C_in]`, `w` is `[C_out, KH, KW, C_in / groups]`.
pub fn conv2d(x: &Array, w: &Array, stride: [i32; 2], padding: [i32; 2], groups: i32) -> Result<Array> {
    Array::wrap(ffi::conv2d(x.raw(), w.raw(), &stride, &padding, groups))
}

/// 3-D convolution; `x` is `[N, D, H, W, C_in]`, `w` is `[C_out, KD, KH, KW, C_in / groups]`.
pub fn conv3d(x: &Array, w: &Array, stride: [i32; 3], padding: [i32; 3], groups: i32) -> Result<Array> {
    Array::wrap(ffi::conv3d(x.raw(), w.raw(), &stride, &padding, groups))
}
