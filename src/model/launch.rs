//! Launching a forward's layers while the rest of it is still being built.
//!
//! MLX runs nothing until a graph is evaluated, so a forward built in full and then evaluated leaves the
//! device idle while the host builds it. A pipelined plain step hides that behind the step before it;
//! an MTP verify (whose drafts and decisions need the previous cycle's values) and a batched step cannot.
//! Inside [`early`], a forward starts (`async_eval`) its stream every [`EVERY`] layers as it goes, so the
//! device computes the first layers while the host builds the next. The same operations run in the same
//! order: the values are the same bits. Elsewhere (counting a graph's operations, tests that inspect
//! graphs) forwards stay lazy. `TANDEM_NO_EARLY_LAUNCH=1` keeps them lazy everywhere (benchmarks' A/B).

use std::cell::Cell;
use std::sync::OnceLock;

use mlx::Array;

/// Layers built between two launches (`TANDEM_LAUNCH_EVERY=n` sets another count, for benchmarks' A/B). Two,
/// not four: 4-bit 27B slice on an H100, MTP depth 3 at 1 / 2 / 4 / 8 streams +4 to +9 %, batched plain steps
/// +6 to +9 % (docs/PERF.md, session 22).
pub const EVERY: usize = 2;

fn every() -> usize {
    static N: OnceLock<usize> = OnceLock::new();
    *N.get_or_init(|| {
        std::env::var("TANDEM_LAUNCH_EVERY").ok().and_then(|v| v.parse().ok()).filter(|&n| n > 0).unwrap_or(EVERY)
    })
}

thread_local! {
    static EARLY: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with this thread's forwards launching their layers as they are built.
pub fn early<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            EARLY.with(|e| e.set(self.0));
        }
    }
    let _restore = Restore(EARLY.with(|e| e.replace(!switched_off())));
    f()
}

fn switched_off() -> bool {
    static OFF: OnceLock<bool> = OnceLock::new();
    *OFF.get_or_init(|| std::env::var_os("TANDEM_NO_EARLY_LAUNCH").is_some_and(|v| v != "0"))
}

/// Starts computing `arrays` now (a cycle's drafts, before the verify built on them), unless
/// `TANDEM_NO_EARLY_LAUNCH` keeps graphs lazy.
pub fn start(arrays: &[&Array]) -> mlx::Result<()> {
    if switched_off() {
        return Ok(());
    }
    mlx::device::async_eval(arrays)
}

/// After layer `layer` (0-based) of `layers`: starts computing `arrays` where [`early`] is on and a
/// launch is due (never after the last layer: the caller evaluates the whole forward then).
pub(crate) fn after_layer(layer: usize, layers: usize, arrays: &[&Array]) -> mlx::Result<()> {
    if (layer + 1) % every() == 0 && layer + 1 < layers && EARLY.with(Cell::get) {
        mlx::device::async_eval(arrays)?;
    }
    Ok(())
}
