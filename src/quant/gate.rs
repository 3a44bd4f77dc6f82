//! The compute gate: how a conversion shares MLX with the rest of the process.
//!
//! MLX is driven by one thread at a time. A conversion that runs beside other MLX work (the server's
//! chats) takes the gate around each unit of MLX work — opening the source, analysing the MTP head,
//! each written tensor, each calibrated module — and lets go between units, so that the other work
//! waits for at most one unit instead of the whole conversion. The quant layer does not know whose
//! lock it is: the caller supplies it in [`ConvertOptions::gate`](super::ConvertOptions::gate) (the
//! engine's, through `Engine::compute_gate`). The default gate locks nothing (the CLI, which drives
//! MLX alone).

use std::any::Any;
use std::fmt;
use std::sync::Arc;

type Acquire = dyn Fn() -> Box<dyn Any> + Send + Sync;

/// Takes a lock around each unit of a conversion's MLX work. Cheap to clone.
#[derive(Clone, Default)]
pub struct ComputeGate(Option<Arc<Acquire>>);

impl ComputeGate {
    /// A gate whose `acquire` blocks until MLX is this thread's, and returns a guard that lets go
    /// when dropped. Letting go should hand the lock fairly to a thread already waiting (a fair
    /// mutex), or a conversion that takes it again at once could keep the waiter out.
    pub fn new(acquire: impl Fn() -> Box<dyn Any> + Send + Sync + 'static) -> ComputeGate {
        ComputeGate(Some(Arc::new(acquire)))
    }

    /// Whether this gate locks anything.
    pub fn is_open(&self) -> bool {
        self.0.is_none()
    }

    /// Holds the gate until the returned [`Hold`] is dropped.
    pub fn hold(&self) -> Hold<'_> {
        Hold { gate: self, guard: self.acquire() }
    }

    /// Runs `f` holding the gate.
    pub fn run<R>(&self, f: impl FnOnce() -> R) -> R {
        let _hold = self.hold();
        f()
    }

    fn acquire(&self) -> Option<Box<dyn Any>> {
        self.0.as_ref().map(|acquire| acquire())
    }
}

impl fmt::Debug for ComputeGate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.is_open() { "ComputeGate(open)" } else { "ComputeGate(locking)" })
    }
}

/// Every gate compares equal: it says how a conversion shares MLX, not what it writes.
impl PartialEq for ComputeGate {
    fn eq(&self, _: &ComputeGate) -> bool {
        true
    }
}

/// The gate, held.
pub struct Hold<'g> {
    gate: &'g ComputeGate,
    guard: Option<Box<dyn Any>>,
}

impl Hold<'_> {
    /// Runs `f` (which must not touch MLX) with the gate let go, then takes it again: between two
    /// units of work that share state on this thread (calibration's forward pass), a waiting thread
    /// gets its turn.
    pub fn unlocked<R>(&mut self, f: impl FnOnce() -> R) -> R {
        self.guard = None;
        let r = f();
        self.guard = self.gate.acquire();
        r
    }
}
