//! Locks that outlive a panic: the engine's shared records (job views, statistics, summaries) stay
//! consistent field by field, so a thread that panicked while holding one must not take every later
//! caller down with it.

use std::sync::{Mutex, MutexGuard};

/// Takes `m`, also when a panicking thread left it poisoned.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
