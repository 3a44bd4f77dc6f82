//! `mlx::compile`: a compiled function computes what its body computes op by op, once per shape or
//! for every shape when shapeless; a failing or panicking body is an error, never an abort; and
//! `graph_ops` sees the fused segment as one operation.

use mlx::compile::{graph_ops, Compiled};
use mlx::{Array, Dtype, Error};

fn random(shape: &[i32], seed: u64) -> Array {
    mlx::random::normal(shape, Dtype::F32, &mlx::random::key(seed).unwrap()).unwrap()
}

/// The gated-delta gates: sigmoid(b) and exp(-softplus(a + bias) * e^A), an elementwise chain of
/// eight operations with a broadcast.
fn gates() -> Compiled {
    Compiled::new(
        |x| {
            let beta = x[0].sigmoid()?;
            let decay = x[1].add(&x[2])?.softplus()?.multiply(&x[3].exp()?.negative()?)?.exp()?;
            Ok(vec![beta, decay])
        },
        true,
    )
    .unwrap()
}

#[test]
fn compiled_equals_eager_for_every_shape_when_shapeless() {
    let g = gates();
    let (bias, a_log) = (random(&[6], 1), random(&[6], 2));
    for (t, seed) in [(1, 10), (4, 11), (37, 12)] {
        let (b, a) = (random(&[1, t, 6], seed), random(&[1, t, 6], seed + 100));
        let fused = g.call(&[&b, &a, &bias, &a_log]).unwrap();
        let eager = g.call_eager(&[&b, &a, &bias, &a_log]).unwrap();
        assert_eq!(fused.len(), 2);
        for (f, e) in fused.iter().zip(&eager) {
            assert_eq!(f.shape(), vec![1, t, 6], "output shape follows the input at T = {t}");
            let (f, e) = (f.to_f32_vec().unwrap(), e.to_f32_vec().unwrap());
            for (i, (x, y)) in f.iter().zip(&e).enumerate() {
                // Fused kernels keep the op-by-op arithmetic; allow an ulp for a reordered exp.
                assert!((x - y).abs() <= 2.0 * f32::EPSILON * y.abs().max(1e-30), "T = {t}, element {i}: {x} vs {y}");
            }
        }
    }
}

#[test]
fn a_fused_chain_is_one_operation_and_evaluates_lazily() {
    let g = gates();
    let (b, a, bias, a_log) = (random(&[1, 2, 4], 3), random(&[1, 2, 4], 4), random(&[4], 5), random(&[4], 6));
    mlx::device::eval(&[&b, &a, &bias, &a_log]).unwrap();
    let eager = g.call_eager(&[&b, &a, &bias, &a_log]).unwrap();
    let fused = g.call(&[&b, &a, &bias, &a_log]).unwrap();
    let eager_ops = graph_ops(&eager.iter().collect::<Vec<_>>());
    let fused_ops = graph_ops(&fused.iter().collect::<Vec<_>>());
    assert!(eager_ops >= 7, "the op-by-op body has its eight operations (counted {eager_ops})");
    assert!(fused_ops < eager_ops, "compiled: {fused_ops} operations, eager: {eager_ops}");
    mlx::device::eval(&fused.iter().collect::<Vec<_>>()).unwrap();
    assert_eq!(graph_ops(&fused.iter().collect::<Vec<_>>()), 0, "nothing is left to run once evaluated");
}

#[test]
fn shaped_compilation_traces_each_shape() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let traces = Arc::new(AtomicUsize::new(0));
    let seen = traces.clone();
    let f = Compiled::new(
        move |x| {
            seen.fetch_add(1, Ordering::SeqCst);
            Ok(vec![x[0].multiply(&x[0])?.add(&x[0])?])
        },
        false,
    )
    .unwrap();
    for shape in [[2, 3], [2, 3], [5, 3], [2, 3]] {
        let x = random(&shape, 7);
        let got = f.call(&[&x]).unwrap()[0].to_f32_vec().unwrap();
        let want: Vec<f32> = x.to_f32_vec().unwrap().iter().map(|v| v * v + v).collect();
        assert_eq!(got, want);
    }
    assert_eq!(traces.load(Ordering::SeqCst), 2, "one trace per distinct shape, reused after");
}

#[test]
fn a_failing_or_panicking_body_is_an_error() {
    let fails = Compiled::new(|x| Ok(vec![x[0].reshape(&[7])?]), false).unwrap();
    let x = random(&[2, 3], 8);
    let e = fails.call(&[&x]).unwrap_err();
    assert!(matches!(e, Error::Mlx(_)), "{e:?}");
    assert!(e.to_string().contains("reshape"), "the body's own message comes through: {e}");

    let panics = Compiled::new(|_| panic!("bug in a traced body"), true).unwrap();
    let e = panics.call(&[&x]).unwrap_err();
    assert!(e.to_string().contains("panicked"), "{e}");
    // The thread and MLX are still usable.
    assert_eq!(x.multiply(&Array::f32(2.0)).unwrap().shape(), vec![2, 3]);
}
