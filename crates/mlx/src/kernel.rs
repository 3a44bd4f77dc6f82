//! Custom GPU kernels through MLX's `fast::metal_kernel` / `fast::cuda_kernel`.
//! On a backend without the matching GPU, building or calling a kernel returns an error.

use cxx::UniquePtr;

use crate::ffi::ffi;
use crate::{Array, Dtype, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelBackend {
    Metal,
    Cuda,
}

/// A kernel body plus the names of its inputs and outputs, compiled on first call by MLX.
pub struct Kernel {
    inner: UniquePtr<ffi::Kernel>,
}

/// One call's launch configuration.
pub struct Launch<'a> {
    pub outputs: &'a [(&'a [i32], Dtype)],
    pub grid: [i32; 3],
    pub threadgroup: [i32; 3],
    /// Integer template arguments, e.g. `("N", 4)`.
    pub template: &'a [(&'a str, i32)],
}

impl Kernel {
    pub fn new(
        backend: KernelBackend,
        name: &str,
        inputs: &[&str],
        outputs: &[&str],
        source: &str,
        header: &str,
    ) -> Result<Kernel> {
        let ins: Vec<String> = inputs.iter().map(|s| s.to_string()).collect();
        let outs: Vec<String> = outputs.iter().map(|s| s.to_string()).collect();
        let inner = match backend {
            KernelBackend::Metal => ffi::metal_kernel(name, &ins, &outs, source, header)?,
            KernelBackend::Cuda => ffi::cuda_kernel(name, &ins, &outs, source, header)?,
        };
        Ok(Kernel { inner })
    }

    pub fn call(&self, inputs: &[&Array], launch: &Launch<'_>) -> Result<Vec<Array>> {
        let mut flat = Vec::new();
        let mut ndims = Vec::new();
        let mut dtypes = Vec::new();
        for (shape, dt) in launch.outputs {
            flat.extend_from_slice(shape);
            ndims.push(shape.len() as i32);
            dtypes.push(dt.code());
        }
        let names: Vec<String> = launch.template.iter().map(|(n, _)| n.to_string()).collect();
        let ints: Vec<i32> = launch.template.iter().map(|(_, v)| *v).collect();
        let k = self.inner.as_ref().expect("null kernel");
        crate::vec_from(ffi::kernel_call(
            k,
            &crate::vec_to(inputs),
            &flat,
            &ndims,
            &dtypes,
            &launch.grid,
            &launch.threadgroup,
            &names,
            &ints,
        )?)
    }
}
