use std::fmt;

use cxx::UniquePtr;

use crate::ffi::ffi;
use crate::{Dtype, Element, Error, Result};

/// Something that keeps external memory alive while MLX uses it (e.g. a memory map).
pub(crate) type Owner = Box<dyn std::any::Any + Send + Sync>;

/// An MLX array: a cheap, reference-counted handle to a lazily evaluated tensor.
pub struct Array {
    pub(crate) inner: UniquePtr<ffi::Array>,
}

// SAFETY: an MLX array is a handle to shared, immutable-once-evaluated data; moving a handle to
// another thread is safe. It is not `Sync`: building graphs from one array on several threads at
// once is not something MLX promises.
unsafe impl Send for Array {}

impl Array {
    pub(crate) fn wrap(r: std::result::Result<UniquePtr<ffi::Array>, cxx::Exception>) -> Result<Array> {
        Ok(Array { inner: r? })
    }

    pub(crate) fn raw(&self) -> &ffi::Array {
        // A constructed Array always holds a non-null pointer.
        self.inner.as_ref().expect("null MLX array")
    }

    /// Copies host data of type `T` into a new array of the given shape.
    pub fn from_slice<T: Element>(data: &[T], shape: &[i32]) -> Result<Array> {
        // SAFETY: any initialised `T: Element` (plain numbers) may be viewed as bytes.
        let bytes = unsafe { std::slice::from_raw_parts(data.as_ptr() as *const u8, std::mem::size_of_val(data)) };
        Self::from_bytes(bytes, shape, T::DTYPE)
    }

    /// Copies raw little-endian bytes into a new array.
    pub fn from_bytes(data: &[u8], shape: &[i32], dtype: Dtype) -> Result<Array> {
        check_shape(shape)?;
        Self::wrap(ffi::array_from_bytes(data, shape, dtype.code()))
    }

    /// Wraps memory owned by `owner` (for example a memory-mapped file) without copying where MLX
    /// allows it. `owner` is dropped once MLX no longer needs the memory.
    ///
    /// # Safety
    /// `data..data+len` must stay valid and unmodified for as long as `owner` lives, `len` must match
    /// `shape` and `dtype`, and `data` must be aligned for `dtype`.
    pub unsafe fn from_external<O: Send + Sync + 'static>(
        data: *const u8,
        len: usize,
        shape: &[i32],
        dtype: Dtype,
        owner: O,
    ) -> Result<Array> {
        check_shape(shape)?;
        let n: usize = shape.iter().map(|&d| d as usize).product();
        if n * dtype.size() != len {
            return Err(Error::Invalid(format!(
                "external buffer of {len} bytes does not hold {n} elements of {dtype}"
            )));
        }
        let owner: Owner = Box::new(owner);
        let raw = Box::into_raw(Box::new(owner)) as usize;
        // On an error MLX may or may not have taken the deleter; leaking the owner is the safe side.
        Self::wrap(ffi::array_from_external(data, shape, dtype.code(), raw))
    }

    pub fn scalar<T: Into<f64>>(v: T, dtype: Dtype) -> Result<Array> {
        Self::wrap(ffi::array_scalar_f64(v.into(), dtype.code()))
    }
    pub fn f32(v: f32) -> Array {
        Self::scalar(v, Dtype::F32).expect("scalar construction cannot fail")
    }
    pub fn zeros(shape: &[i32], dtype: Dtype) -> Result<Array> {
        Self::wrap(ffi::array_zeros(shape, dtype.code()))
    }
    pub fn ones(shape: &[i32], dtype: Dtype) -> Result<Array> {
        Self::wrap(ffi::array_ones(shape, dtype.code()))
    }
    pub fn full(shape: &[i32], v: f64, dtype: Dtype) -> Result<Array> {
        Self::wrap(ffi::array_full(shape, v, dtype.code()))
    }
    pub fn arange(start: f64, stop: f64, step: f64, dtype: Dtype) -> Result<Array> {
        Self::wrap(ffi::array_arange(start, stop, step, dtype.code()))
    }
    pub fn eye(n: i32, dtype: Dtype) -> Result<Array> {
        Self::wrap(ffi::array_eye(n, dtype.code()))
    }
    /// Lower-triangular ones: `tri(n, m, k)[i][j] = 1 if j <= i + k`.
    pub fn tri(n: i32, m: i32, k: i32, dtype: Dtype) -> Result<Array> {
        Self::wrap(ffi::array_tri(n, m, k, dtype.code()))
    }

    pub fn shape(&self) -> Vec<i32> {
        ffi::array_shape(self.raw())
    }
    pub fn ndim(&self) -> usize {
        self.shape().len()
    }
    /// The size of axis `axis` (negative counts from the end).
    pub fn dim(&self, axis: i32) -> i32 {
        let s = self.shape();
        let i = if axis < 0 { s.len() as i32 + axis } else { axis };
        s[i as usize]
    }
    /// The element type. MLX's types map one to one onto [`Dtype`] (the C++ side's switch is
    /// exhaustive and compiled with `-Werror=switch`), so this cannot fail with the pinned MLX; a
    /// libmlx newer than its headers reports through [`Array::try_dtype`].
    pub fn dtype(&self) -> Dtype {
        match self.try_dtype() {
            Ok(d) => d,
            Err(e) => panic!("MLX returned an array type this bridge does not know: {e}"),
        }
    }
    /// The element type, or an error for a type code the bridge does not know.
    pub fn try_dtype(&self) -> Result<Dtype> {
        Dtype::from_code(ffi::array_dtype(self.raw())?)
    }
    pub fn size(&self) -> usize {
        ffi::array_size(self.raw())
    }
    pub fn nbytes(&self) -> usize {
        ffi::array_nbytes(self.raw())
    }

    /// Evaluates the array's graph.
    pub fn eval(&self) -> Result<()> {
        Ok(ffi::array_eval(self.raw())?)
    }

    /// Whether the array's value is computed and safe to read without waiting: a constant, or an
    /// evaluated result whose computation has finished (an `async_eval` still running: false).
    pub fn is_ready(&self) -> bool {
        ffi::array_is_ready(self.raw())
    }

    /// Evaluates and copies the data out as `T`; the array's dtype must be `T`'s. An array already
    /// evaluated into a dense buffer is read where it lies once its own computation is done, without
    /// waiting for work queued after it (the next pipelined step); views and lazy arrays are copied.
    pub fn to_vec<T: Element + Default>(&self) -> Result<Vec<T>> {
        let dt = self.dtype();
        if dt != T::DTYPE {
            return Err(Error::Dtype { expected: T::DTYPE, actual: dt });
        }
        let mut out = vec![T::default(); self.size()];
        // SAFETY: `out` is a fully initialised buffer of plain numbers; we overwrite its bytes.
        let bytes = unsafe {
            std::slice::from_raw_parts_mut(out.as_mut_ptr() as *mut u8, std::mem::size_of_val(out.as_slice()))
        };
        ffi::array_copy_to(self.raw(), bytes)?;
        Ok(out)
    }

    /// Evaluates and copies the raw bytes out (row-major, little-endian).
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let mut out = vec![0u8; self.nbytes()];
        ffi::array_copy_to(self.raw(), &mut out)?;
        Ok(out)
    }

    /// Casts to f32 and copies the data out.
    pub fn to_f32_vec(&self) -> Result<Vec<f32>> {
        self.as_dtype(Dtype::F32)?.to_vec::<f32>()
    }

    /// The single value of a one-element array, as `T`.
    pub fn item<T: Element + Default>(&self) -> Result<T> {
        if self.size() != 1 {
            return Err(Error::Invalid(format!("item() on an array of shape {:?}", self.shape())));
        }
        Ok(self.as_dtype(T::DTYPE)?.to_vec::<T>()?[0])
    }

    pub fn try_clone(&self) -> Result<Array> {
        Self::wrap(ffi::array_clone(self.raw()))
    }
}

impl Clone for Array {
    fn clone(&self) -> Self {
        // Copying the handle only bumps a reference count; it cannot throw.
        self.try_clone().expect("cloning an MLX array handle")
    }
}

impl fmt::Debug for Array {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Array({:?}, {})", self.shape(), self.dtype())
    }
}

fn check_shape(shape: &[i32]) -> Result<()> {
    if let Some(d) = shape.iter().find(|&&d| d < 0) {
        return Err(Error::Invalid(format!("negative dimension {d} in shape {shape:?}")));
    }
    Ok(())
}
