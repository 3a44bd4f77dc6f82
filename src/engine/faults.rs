//! Fault injection, for the tests that prove a panic inside a model's worker is caught, reported to
//! whoever waited and contained (the worker, the other models and the engine go on). Nothing in
//! Tandem arms these; they cost one lock of an empty list per load and per generation.

use std::sync::Mutex;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Point {
    Load,
    Generation,
}

static ARMED: Mutex<Vec<(Point, String)>> = Mutex::new(Vec::new());

fn arm(point: Point, model: &str) {
    ARMED.lock().unwrap_or_else(|p| p.into_inner()).push((point, model.into()));
}

fn fire(point: Point, model: &str) {
    let mut armed = ARMED.lock().unwrap_or_else(|p| p.into_inner());
    let hit = armed.iter().position(|(p, m)| *p == point && m == model).map(|i| armed.swap_remove(i));
    drop(armed);
    if hit.is_some() {
        panic!("fault injected into {model}'s worker");
    }
}

/// The next load of `model` panics inside its worker thread.
#[doc(hidden)]
pub fn panic_next_load(model: &str) {
    arm(Point::Load, model)
}

/// The next generation of `model` panics inside its worker thread, after it has started.
#[doc(hidden)]
pub fn panic_next_generation(model: &str) {
    arm(Point::Generation, model)
}

pub(super) fn on_load(model: &str) {
    fire(Point::Load, model)
}

pub(super) fn on_generation(model: &str) {
    fire(Point::Generation, model)
}
