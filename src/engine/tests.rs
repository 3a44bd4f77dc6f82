use super::*;

/// A conversion takes the gate again right after letting go of it; a thread that was waiting
/// must get the lock at that release, not whenever the conversion happens to pause. (With an
/// unfair lock the releasing thread wins again, and the waiter starves: std's Mutex lets this
/// test wait for every remaining unit.)
#[test]
fn a_waiting_thread_gets_the_lock_when_a_conversion_lets_go() {
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;
    const UNITS: usize = 200;
    let units = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let converter = {
        let (units, stop) = (units.clone(), stop.clone());
        std::thread::spawn(move || {
            let gate = compute_gate();
            for _ in 0..UNITS {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let _hold = gate.hold();
                units.fetch_add(1, Ordering::SeqCst);
                // One unit of work; long enough for the waiter to be asleep on the lock by its end.
                std::thread::sleep(Duration::from_millis(10));
            }
        })
    };
    while units.load(Ordering::SeqCst) < 2 {
        std::thread::sleep(Duration::from_millis(1));
    }
    let before = units.load(Ordering::SeqCst);
    let lock = compute_lock();
    let waited = units.load(Ordering::SeqCst) - before;
    drop(lock);
    stop.store(true, Ordering::SeqCst);
    converter.join().unwrap();
    assert!(waited <= 2, "the waiting thread got the lock only after {waited} more units of work");
}

#[test]
fn memory_check() {
    let gib = 1u64 << 30;
    let need = |weights| catalog::memory_needed(weights, 0);
    assert!(fits_in_memory("m", need(gib), 4 * gib).is_ok());
    assert!(fits_in_memory("m", need(gib), 0).is_ok(), "unknown available memory");
    let err = fits_in_memory("big", need(20 * gib), 8 * gib).unwrap_err();
    assert!(matches!(err, EngineError::NotEnoughMemory { .. }));
    let message = err.to_string();
    assert!(message.contains("`big`") && message.contains("22.2 GiB") && message.contains("8.0 GiB"), "{message}");
}
