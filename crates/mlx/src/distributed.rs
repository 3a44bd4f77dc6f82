//! MLX's distributed layer: a group of processes (one per machine, or several on one for tests)
//! that sum, gather, send and receive arrays. The backends are MLX's own (the ring over TCP, MPI,
//! JACCL over RDMA, NCCL on CUDA); a process finds its place from the environment as MLX defines
//! it (for the ring: `MLX_HOSTFILE`, a JSON list of each rank's `["ip:port", ...]`, and `MLX_RANK`).
//!
//! The collectives are lazy ops like any other: they run when their result is evaluated, and every
//! rank must evaluate the same ones in the same order.

use cxx::UniquePtr;

use crate::ffi::ffi;
use crate::{Array, Dtype, Error, Result};

/// A group of processes that communicate.
pub struct Group {
    inner: UniquePtr<ffi::DistGroup>,
    /// Run communication on the CPU stream (the ring and MPI backends' data moves through host memory).
    cpu: bool,
}

// SAFETY: a group is a shared handle to MLX's backend, which MLX itself uses from its stream threads.
unsafe impl Send for Group {}
unsafe impl Sync for Group {}

/// Whether MLX was built with `backend` ("ring", "mpi", "jaccl", "nccl", or "any").
pub fn is_available(backend: &str) -> bool {
    ffi::dist_is_available(backend)
}

/// Joins the group the environment describes, over `backend`. Fails (rather than answering a group
/// of one) when the backend cannot start: a missing or malformed hostfile, a rank outside it, a port
/// that cannot be bound.
pub fn init(backend: &str) -> Result<Group> {
    if !is_available(backend) {
        return Err(Error::Invalid(format!("MLX was built without the `{backend}` distributed backend")));
    }
    let inner = ffi::dist_init(true, backend)?;
    Ok(Group { inner, cpu: matches!(backend, "ring" | "mpi") })
}

impl Group {
    fn raw(&self) -> &ffi::DistGroup {
        // A constructed Group always holds a non-null pointer.
        self.inner.as_ref().expect("null MLX group")
    }

    pub fn rank(&self) -> i32 {
        ffi::dist_rank(self.raw())
    }

    pub fn size(&self) -> i32 {
        ffi::dist_size(self.raw())
    }

    /// The element-wise sum of `a` over every rank (each gets the sum).
    pub fn all_sum(&self, a: &Array) -> Result<Array> {
        Array::wrap(ffi::dist_all_sum(a.raw(), self.raw(), self.cpu))
    }

    /// Every rank's `a`, concatenated along the first axis in rank order.
    pub fn all_gather(&self, a: &Array) -> Result<Array> {
        Array::wrap(ffi::dist_all_gather(a.raw(), self.raw(), self.cpu))
    }

    /// Sends `a` to rank `dst`; the result is a token that must be evaluated for the send to happen.
    pub fn send(&self, a: &Array, dst: i32) -> Result<Array> {
        self.check_peer(dst)?;
        Array::wrap(ffi::dist_send(a.raw(), dst, self.raw(), self.cpu))
    }

    /// Receives an array of `shape` and `dtype` from rank `src`.
    pub fn recv(&self, shape: &[i32], dtype: Dtype, src: i32) -> Result<Array> {
        self.check_peer(src)?;
        Array::wrap(ffi::dist_recv(shape, dtype.code(), src, self.raw(), self.cpu))
    }

    fn check_peer(&self, peer: i32) -> Result<()> {
        let (rank, size) = (self.rank(), self.size());
        if peer < 0 || peer >= size || peer == rank {
            return Err(Error::Invalid(format!("rank {rank}: no peer {peer} in a group of {size}")));
        }
        Ok(())
    }
}
