//! MLX's graph compiler (`mlx::core::compile`): a function of arrays traced once per input shape
//! (or once for all shapes when shapeless) and replayed with its elementwise chains fused into single
//! kernels. Fewer, larger operations per token is what a GPU bound by per-launch cost wants.
//!
//! The traced body is a Rust closure. MLX calls it back (through the bridge) only while tracing, on
//! the calling thread; the closure must build its outputs from its inputs alone (anything it captures
//! is baked into the trace), and must not depend on input values.

use std::cell::RefCell;
use std::panic::{catch_unwind, AssertUnwindSafe};

use cxx::UniquePtr;

use crate::ffi::ffi;
use crate::{Array, Error, Result};

/// What a compiled function computes.
pub type Body = dyn Fn(&[Array]) -> Result<Vec<Array>> + Send + Sync;

/// A function compiled by MLX. [`Compiled::call`] runs the fused graph; [`Compiled::call_eager`] runs
/// the same body op by op (the reference a parity test compares against).
pub struct Compiled {
    // Dropped before `body`: destroying MLX's function erases its cache entry, after which the
    // closure is never called again.
    inner: UniquePtr<ffi::Compiled>,
    body: Box<Box<Body>>,
}

// SAFETY: the C++ object is an immutable std::function over MLX's thread-local compile cache; the
// body is `Send + Sync`. Calls build graphs, which Tandem serialises with its MLX lock.
unsafe impl Send for Compiled {}
unsafe impl Sync for Compiled {}

thread_local! {
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}

pub(crate) fn take_error() -> String {
    LAST_ERROR.with(|e| std::mem::take(&mut *e.borrow_mut()))
}

/// Called by MLX while tracing: runs the Rust body on placeholder inputs.
fn trampoline(context: usize, inputs: &ffi::ArrayVec) -> UniquePtr<ffi::ArrayVec> {
    // SAFETY: `context` is the address of the `Box<Body>` owned by the `Compiled` whose MLX function
    // is being called, which outlives the call.
    let body = unsafe { &*(context as *const Box<Body>) };
    let run = || -> Result<UniquePtr<ffi::ArrayVec>> {
        let ins =
            (0..ffi::vec_len(inputs)).map(|i| Array::wrap(ffi::vec_get(inputs, i))).collect::<Result<Vec<_>>>()?;
        let outs = body(&ins)?;
        Ok(crate::vec_to(&outs.iter().collect::<Vec<_>>()))
    };
    // A panic must not unwind into C++.
    let failure = match catch_unwind(AssertUnwindSafe(run)) {
        Ok(Ok(v)) => return v,
        Ok(Err(e)) => e.to_string(),
        Err(_) => "the traced function panicked".to_string(),
    };
    LAST_ERROR.with(|e| *e.borrow_mut() = failure);
    UniquePtr::null()
}

impl Compiled {
    /// Compiles `body`. `shapeless`: one trace serves every input shape; valid only for bodies whose
    /// operations do not depend on shapes (elementwise chains, broadcasts, reductions over the last
    /// axis; no reshapes to fixed sizes).
    pub fn new(
        body: impl Fn(&[Array]) -> Result<Vec<Array>> + Send + Sync + 'static,
        shapeless: bool,
    ) -> Result<Compiled> {
        let body: Box<Box<Body>> = Box::new(Box::new(body));
        let context = &*body as *const Box<Body> as usize;
        let inner = ffi::compile(trampoline, context, shapeless)?;
        Ok(Compiled { inner, body })
    }

    /// Runs the compiled graph (tracing it first for a new input shape).
    pub fn call(&self, inputs: &[&Array]) -> Result<Vec<Array>> {
        let c = self.inner.as_ref().ok_or_else(|| Error::Invalid("null compiled function".into()))?;
        crate::vec_from(ffi::compiled_call(c, &crate::vec_to(inputs))?)
    }

    /// Runs the body op by op, uncompiled.
    pub fn call_eager(&self, inputs: &[&Array]) -> Result<Vec<Array>> {
        let ins = inputs.iter().map(|a| a.try_clone()).collect::<Result<Vec<_>>>()?;
        (self.body)(&ins)
    }
}

/// The number of operations MLX will run to evaluate `outputs`: distinct primitives not yet
/// evaluated in their graph (a fused compiled segment counts once, a multi-output op once).
pub fn graph_ops(outputs: &[&Array]) -> usize {
    ffi::graph_op_names(&crate::vec_to(outputs)).len()
}

/// The operations behind `outputs` by MLX primitive name, with how many of each, most first.
pub fn graph_op_histogram(outputs: &[&Array]) -> Vec<(String, usize)> {
    let mut counts = std::collections::BTreeMap::new();
    for name in ffi::graph_op_names(&crate::vec_to(outputs)) {
        *counts.entry(name).or_insert(0usize) += 1;
    }
    let mut v: Vec<(String, usize)> = counts.into_iter().collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    v
}
