//! `crates/mlx` against values computed by hand or by closed forms, and its error paths.
// Reference values are written as their closed forms give them, past f32's precision.
#![allow(clippy::excessive_precision)]

use mlx::fast::{self, Mask};
use mlx::{concatenate, random, where_, Array, Dtype, QuantMode};

fn arr(v: &[f32], shape: &[i32]) -> Array {
    Array::from_slice(v, shape).unwrap()
}

fn close(a: &[f32], b: &[f32], tol: f32) {
    assert_eq!(a.len(), b.len(), "lengths differ: {a:?} vs {b:?}");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= tol * (1.0 + y.abs()), "element {i}: {x} vs {y} (all: {a:?} vs {b:?})");
    }
}

#[test]
fn host_round_trip_every_dtype() {
    let f = [1.5f32, -2.25, 0.0, 3.0];
    assert_eq!(arr(&f, &[2, 2]).to_vec::<f32>().unwrap(), f);
    let h: Vec<mlx::f16> = f.iter().map(|&x| mlx::f16::from_f32(x)).collect();
    assert_eq!(Array::from_slice(&h, &[4]).unwrap().to_vec::<mlx::f16>().unwrap(), h);
    let b: Vec<mlx::bf16> = f.iter().map(|&x| mlx::bf16::from_f32(x)).collect();
    let ab = Array::from_slice(&b, &[4]).unwrap();
    assert_eq!(ab.dtype(), Dtype::BF16);
    assert_eq!(ab.to_f32_vec().unwrap(), f);
    assert_eq!(Array::from_slice(&[1i32, -7], &[2]).unwrap().to_vec::<i32>().unwrap(), [1, -7]);
    assert_eq!(Array::from_slice(&[1u32, u32::MAX], &[2]).unwrap().to_vec::<u32>().unwrap(), [1, u32::MAX]);
    assert_eq!(Array::from_slice(&[0u8, 255], &[2]).unwrap().to_vec::<u8>().unwrap(), [0, 255]);
    assert_eq!(Array::from_slice(&[true, false], &[2]).unwrap().to_vec::<bool>().unwrap(), [true, false]);
    // Casting f32 -> bf16 rounds to nearest even: 1 + 2^-9 is a tie and rounds down to 1.
    let c = arr(&[1.0 + 1.0 / 512.0, 1.0 + 3.0 / 512.0], &[2]).as_dtype(Dtype::BF16).unwrap();
    assert_eq!(c.to_f32_vec().unwrap(), [1.0, 1.0 + 4.0 / 512.0]);
}

/// A pipelined decoder reads step t's token after starting step t + 1: the read must wait for that token
/// alone. (Reading through a fresh copy op queued the copy behind step t + 1, so every read waited for the
/// next step too, and the device idled while the host built the step after it.)
#[test]
fn reading_an_evaluated_array_waits_for_it_alone() {
    let token = arr(&[1.0, 2.0, 3.0], &[3]).multiply(&Array::f32(2.0)).unwrap();
    let one = arr(&[5.0], &[1]).sum(&[], false).unwrap();
    mlx::device::eval(&[&token, &one]).unwrap();
    // Seconds of work queued behind it on the same stream.
    let key = random::key(7).unwrap();
    let mut next = random::normal(&[1024, 1024], Dtype::F32, &key).unwrap().multiply(&Array::f32(0.03)).unwrap();
    for _ in 0..8 {
        next = next.matmul(&next).unwrap().sigmoid().unwrap();
    }
    mlx::device::async_eval(&[&next]).unwrap();
    assert_eq!(token.to_vec::<f32>().unwrap(), [2.0, 4.0, 6.0]);
    assert_eq!(one.item::<f32>().unwrap(), 5.0);
    assert!(!next.is_ready(), "reading an evaluated array waited for the work queued after it");
    next.eval().unwrap();
    assert!(next.is_ready());
    // Views of evaluated arrays (transposed, broadcast) are still read in their logical order.
    let m = arr(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    mlx::device::eval(&[&m]).unwrap();
    assert_eq!(m.t().unwrap().to_vec::<f32>().unwrap(), [1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
    let b = arr(&[7.0], &[1]).broadcast_to(&[3]).unwrap();
    mlx::device::eval(&[&b]).unwrap();
    assert_eq!(b.to_vec::<f32>().unwrap(), [7.0, 7.0, 7.0]);
}

#[test]
fn external_memory_is_used_and_released() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    struct Guard(Arc<AtomicBool>, Vec<f32>);
    impl Drop for Guard {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    let dropped = Arc::new(AtomicBool::new(false));
    let data = vec![1.0f32, 2.0, 3.0];
    let guard = Guard(dropped.clone(), data);
    let ptr = guard.1.as_ptr() as *const u8;
    let a = unsafe { Array::from_external(ptr, 12, &[3], Dtype::F32, guard) }.unwrap();
    assert_eq!(a.multiply(&Array::f32(2.0)).unwrap().to_vec::<f32>().unwrap(), [2.0, 4.0, 6.0]);
    // MLX wraps the memory where the allocator can (Metal, unified memory) and otherwise copies and
    // releases the owner at once (CPU); either way the owner is gone once the array is.
    drop(a);
    assert!(dropped.load(Ordering::SeqCst), "owner must be released when the array goes");
    let bad = unsafe { Array::from_external(ptr, 8, &[3], Dtype::F32, ()) };
    assert!(bad.is_err());
}

#[test]
fn elementwise_math() {
    let x = arr(&[-2.0, -0.5, 0.0, 1.0, 3.0], &[5]);
    let xs = [-2.0f32, -0.5, 0.0, 1.0, 3.0];
    let map = |f: fn(f32) -> f32| xs.iter().map(|&v| f(v)).collect::<Vec<_>>();
    close(&x.exp().unwrap().to_vec().unwrap(), &map(f32::exp), 1e-6);
    close(&x.sigmoid().unwrap().to_vec().unwrap(), &map(|v| 1.0 / (1.0 + (-v).exp())), 1e-6);
    close(&x.silu().unwrap().to_vec().unwrap(), &map(|v| v / (1.0 + (-v).exp())), 1e-6);
    close(&x.softplus().unwrap().to_vec().unwrap(), &map(|v| (1.0 + v.exp()).ln()), 1e-6);
    close(&x.tanh().unwrap().to_vec().unwrap(), &map(f32::tanh), 1e-6);
    // erf(1) = 0.8427007929, erf(-0.5) = -0.5204998778
    let e = x.erf().unwrap().to_vec::<f32>().unwrap();
    close(&[e[1], e[3]], &[-0.520_499_88, 0.842_700_8], 1e-6);
    // gelu(1) = 0.8413447461 (erf form); gelu_tanh(1) = 0.8411919906
    close(&[x.gelu().unwrap().to_vec::<f32>().unwrap()[3]], &[0.841_344_75], 1e-6);
    close(&[x.gelu_tanh().unwrap().to_vec::<f32>().unwrap()[3]], &[0.841_191_99], 1e-6);
    let p = arr(&[1.0, 4.0, 9.0], &[3]);
    close(&p.rsqrt().unwrap().to_vec().unwrap(), &[1.0, 0.5, 1.0 / 3.0], 1e-6);
    close(&p.log().unwrap().to_vec().unwrap(), &[0.0, 4f32.ln(), 9f32.ln()], 1e-6);
    let m = x.maximum(&Array::f32(0.0)).unwrap();
    assert_eq!(m.to_vec::<f32>().unwrap(), [0.0, 0.0, 0.0, 1.0, 3.0]);
    let w = where_(&x.greater(&Array::f32(0.0)).unwrap(), &x, &Array::f32(-1.0)).unwrap();
    assert_eq!(w.to_vec::<f32>().unwrap(), [-1.0, -1.0, -1.0, 1.0, 3.0]);
}

#[test]
fn shapes() {
    let a = Array::arange(0.0, 24.0, 1.0, Dtype::F32).unwrap().reshape(&[2, 3, 4]).unwrap();
    let t = a.transpose(&[2, 0, 1]).unwrap();
    assert_eq!(t.shape(), [4, 2, 3]);
    // t[1, 0, 2] = a[0, 2, 1] = 9
    assert_eq!(t.to_vec::<f32>().unwrap()[3 * 2 + 2], 9.0);
    let s = a.slice(&[0, 1, 0], &[2, 3, 4], &[1, 1, 2]).unwrap();
    assert_eq!(s.to_vec::<f32>().unwrap(), [4.0, 6.0, 8.0, 10.0, 16.0, 18.0, 20.0, 22.0]);
    assert_eq!(a.slice_axis(-1, -1, 4).unwrap().to_vec::<f32>().unwrap(), [3.0, 7.0, 11.0, 15.0, 19.0, 23.0]);
    let z = Array::zeros(&[2, 3], Dtype::F32).unwrap();
    let u = z.slice_update(&Array::ones(&[1, 2], Dtype::F32).unwrap(), &[1, 1], &[2, 3], &[1, 1]).unwrap();
    assert_eq!(u.to_vec::<f32>().unwrap(), [0.0, 0.0, 0.0, 0.0, 1.0, 1.0]);
    let c = concatenate(&[&z, &u], 0).unwrap();
    assert_eq!(c.shape(), [4, 3]);
    let parts = a.split(2, 2).unwrap();
    assert_eq!(parts.len(), 2);
    assert_eq!(parts[1].shape(), [2, 3, 2]);
    let parts = a.split_at(&[1, 3], 2).unwrap();
    assert_eq!(parts.iter().map(|p| p.dim(2)).collect::<Vec<_>>(), [1, 2, 1]);
    let idx = Array::from_slice(&[2i32, 0], &[2]).unwrap();
    let g = a.take(&idx, 1).unwrap();
    assert_eq!(g.shape(), [2, 2, 4]);
    assert_eq!(g.to_vec::<f32>().unwrap()[..4], [8.0, 9.0, 10.0, 11.0]);
    let b = arr(&[1.0, 2.0], &[2, 1]).broadcast_to(&[2, 3]).unwrap();
    assert_eq!(b.to_vec::<f32>().unwrap(), [1.0, 1.0, 1.0, 2.0, 2.0, 2.0]);
    assert_eq!(b.expand_dims(&[0]).unwrap().shape(), [1, 2, 3]);
    assert_eq!(b.expand_dims(&[0]).unwrap().squeeze(&[0]).unwrap().shape(), [2, 3]);
    let p = arr(&[1.0, 2.0], &[1, 2]).pad(&[1], &[2], &[0], &Array::f32(0.0)).unwrap();
    assert_eq!(p.to_vec::<f32>().unwrap(), [0.0, 0.0, 1.0, 2.0]);
}

#[test]
fn reductions_and_ordering() {
    let a = arr(&[1.0, 5.0, 3.0, -1.0, 0.0, 2.0], &[2, 3]);
    assert_eq!(a.sum(&[1], false).unwrap().to_vec::<f32>().unwrap(), [9.0, 1.0]);
    assert_eq!(a.max(&[], false).unwrap().item::<f32>().unwrap(), 5.0);
    assert_eq!(a.argmax(1, false).unwrap().to_vec::<u32>().unwrap(), [1, 2]);
    let lse = a.logsumexp(&[1], false).unwrap().to_vec::<f32>().unwrap();
    let want = [(1f32.exp() + 5f32.exp() + 3f32.exp()).ln(), ((-1f32).exp() + 1.0 + 2f32.exp()).ln()];
    close(&lse, &want, 1e-6);
    let sm = a.softmax(&[1], true).unwrap().to_vec::<f32>().unwrap();
    close(&sm[..3], &[(1.0 - want[0]).exp(), (5.0 - want[0]).exp(), (3.0 - want[0]).exp()], 1e-6);
    assert_eq!(a.cumsum(1, false, true).unwrap().to_vec::<f32>().unwrap(), [1.0, 6.0, 9.0, -1.0, -1.0, 1.0]);
    assert_eq!(a.sort(1).unwrap().to_vec::<f32>().unwrap(), [1.0, 3.0, 5.0, -1.0, 0.0, 2.0]);
    let mut top = a.topk(2, 1).unwrap().to_vec::<f32>().unwrap();
    top[..2].sort_by(|x, y| x.partial_cmp(y).unwrap());
    top[2..].sort_by(|x, y| x.partial_cmp(y).unwrap());
    assert_eq!(top, [3.0, 5.0, 0.0, 2.0]);
    assert_eq!(a.argsort(1).unwrap().to_vec::<u32>().unwrap(), [0, 2, 1, 0, 1, 2]);
    let part = a.argpartition(1, 1).unwrap().to_vec::<u32>().unwrap();
    assert_eq!(part[1], 2, "second smallest of the first row is at index 2");
}

#[test]
fn matmul_and_conv() {
    let a = arr(&[1.0, 2.0, 3.0, 4.0], &[2, 2]);
    let b = arr(&[5.0, 6.0, 7.0, 8.0], &[2, 2]);
    assert_eq!(a.matmul(&b).unwrap().to_vec::<f32>().unwrap(), [19.0, 22.0, 43.0, 50.0]);
    assert_eq!(a.t().unwrap().to_vec::<f32>().unwrap(), [1.0, 3.0, 2.0, 4.0]);
    let c = mlx::ops::addmm(&a, &a, &b, 1.0, 2.0).unwrap();
    assert_eq!(c.to_vec::<f32>().unwrap(), [21.0, 26.0, 49.0, 58.0]);
    // Depthwise causal conv: x [1, 4, 2], w [2, 2, 1] (C_out, K, C_in/groups), left-padded by hand.
    let x = arr(&[1.0, 10.0, 2.0, 20.0, 3.0, 30.0, 4.0, 40.0], &[1, 4, 2]);
    let w = arr(&[1.0, 2.0, 0.5, -1.0], &[2, 2, 1]);
    let xp = x.pad(&[1], &[1], &[0], &Array::f32(0.0)).unwrap();
    let y = mlx::ops::conv1d(&xp, &w, 1, 0, 1, 2).unwrap();
    // channel 0: w=[1,2]: y_t = x_{t-1} + 2 x_t ; channel 1: w=[0.5,-1]: 0.5 x_{t-1} - x_t
    assert_eq!(y.to_vec::<f32>().unwrap(), [2.0, -10.0, 5.0, -15.0, 8.0, -20.0, 11.0, -25.0]);
}

#[test]
fn fast_ops_match_their_definitions() {
    let k = random::key(7).unwrap();
    let x = random::normal(&[2, 3, 8], Dtype::F32, &k).unwrap();
    let w = random::uniform(&[8], Dtype::F32, &random::split(&k, 2).unwrap()[1]).unwrap();
    let got = fast::rms_norm(&x, Some(&w), 1e-6).unwrap();
    let ms = x.square().unwrap().mean(&[-1], true).unwrap();
    let want = x.multiply(&ms.add(&Array::f32(1e-6)).unwrap().rsqrt().unwrap()).unwrap().multiply(&w).unwrap();
    close(&got.to_vec().unwrap(), &want.to_vec().unwrap(), 1e-5);

    let ln = fast::layer_norm(&x, None, None, 1e-6).unwrap();
    let mu = x.mean(&[-1], true).unwrap();
    let xc = x.subtract(&mu).unwrap();
    let var = xc.square().unwrap().mean(&[-1], true).unwrap();
    let want = xc.multiply(&var.add(&Array::f32(1e-6)).unwrap().rsqrt().unwrap()).unwrap();
    close(&ln.to_vec().unwrap(), &want.to_vec().unwrap(), 1e-5);

    // RoPE (rotate-half) at position p on a 4-dim vector with base b rotates pairs (0,2) and (1,3).
    let v = arr(&[1.0, 2.0, 3.0, 4.0], &[1, 1, 1, 4]);
    let r = fast::rope(&v, 4, false, 100.0, 1.0, 3).unwrap().to_vec::<f32>().unwrap();
    let (t0, t1) = (3.0f32, 3.0f32 * 100f32.powf(-0.5));
    let want = [
        1.0 * t0.cos() - 3.0 * t0.sin(),
        2.0 * t1.cos() - 4.0 * t1.sin(),
        3.0 * t0.cos() + 1.0 * t0.sin(),
        4.0 * t1.cos() + 2.0 * t1.sin(),
    ];
    close(&r, &want, 1e-5);

    // Attention with one key is that key's value, whatever the mask.
    let q = random::normal(&[1, 2, 3, 4], Dtype::F32, &k).unwrap();
    let kk = random::normal(&[1, 1, 1, 4], Dtype::F32, &k).unwrap();
    let vv = arr(&[1.0, 2.0, 3.0, 4.0], &[1, 1, 1, 4]);
    let o = fast::scaled_dot_product_attention(&q, &kk, &vv, 0.5, Mask::None).unwrap();
    assert_eq!(o.shape(), [1, 2, 3, 4]);
    close(&o.to_vec().unwrap(), &[1.0, 2.0, 3.0, 4.0].repeat(6), 1e-6);
    // Causal: the first query sees only the first key.
    let kk = random::normal(&[1, 1, 3, 4], Dtype::F32, &k).unwrap();
    let vv = Array::arange(0.0, 12.0, 1.0, Dtype::F32).unwrap().reshape(&[1, 1, 3, 4]).unwrap();
    let o = fast::scaled_dot_product_attention(&q, &kk, &vv, 0.5, Mask::Causal).unwrap().to_vec::<f32>().unwrap();
    close(&o[..4], &[0.0, 1.0, 2.0, 3.0], 1e-6);
}

#[test]
fn random_is_reproducible() {
    let a = random::uniform(&[16], Dtype::F32, &random::key(3).unwrap()).unwrap().to_vec::<f32>().unwrap();
    let b = random::uniform(&[16], Dtype::F32, &random::key(3).unwrap()).unwrap().to_vec::<f32>().unwrap();
    let c = random::uniform(&[16], Dtype::F32, &random::key(4).unwrap()).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(a, b);
    assert_ne!(a, c);
    assert!(a.iter().all(|&v| (0.0..1.0).contains(&v)));
    // A categorical draw from a (nearly) one-hot distribution returns that index.
    let logits = arr(&[-1e9, 0.0, -1e9], &[1, 3]);
    let s = random::categorical(&logits, -1, &random::key(1).unwrap()).unwrap();
    assert_eq!(s.to_vec::<u32>().unwrap(), [1]);
}

#[test]
fn quantize_round_trip_within_one_step() {
    let k = random::key(11).unwrap();
    let w = random::normal(&[8, 128], Dtype::F32, &k).unwrap();
    for bits in [2, 3, 4, 5, 6, 8] {
        let q = mlx::quantized::quantize(&w, 64, bits, QuantMode::Affine).unwrap();
        assert_eq!(q.weight.dtype(), Dtype::U32);
        assert_eq!(q.weight.shape(), [8, 128 * bits / 32]);
        assert_eq!(q.scales.shape(), [8, 2]);
        let d = q.dequantize().unwrap();
        let err = d.subtract(&w).unwrap().abs().unwrap().max(&[-1], false).unwrap().to_vec::<f32>().unwrap();
        let range =
            w.max(&[-1], false).unwrap().subtract(&w.min(&[-1], false).unwrap()).unwrap().to_vec::<f32>().unwrap();
        let levels = ((1 << bits) - 1) as f32;
        for (e, r) in err.iter().zip(&range) {
            // docs/MODEL.md §5.1: the error can reach about one step, not half of one.
            assert!(*e <= 1.01 * r / levels, "bits {bits}: error {e} above one step {}", r / levels);
        }
        let x = random::normal(&[3, 128], Dtype::F32, &k).unwrap();
        let y = q.matmul(&x, true).unwrap();
        let yd = x.matmul(&d.t().unwrap()).unwrap();
        close(&y.to_vec().unwrap(), &yd.to_vec().unwrap(), 1e-4);
    }
}

#[test]
fn errors_carry_mlx_messages() {
    let a = Array::zeros(&[2, 3], Dtype::F32).unwrap();
    let b = Array::zeros(&[4, 5], Dtype::F32).unwrap();
    let e = a.matmul(&b).unwrap_err().to_string();
    assert!(e.starts_with("mlx: ") && e.contains("matmul"), "{e}");
    let e = a.add(&b).unwrap_err().to_string();
    assert!(e.contains("broadcast"), "{e}");
    let e = a.reshape(&[7]).unwrap_err().to_string();
    assert!(e.contains("reshape") || e.contains("Cannot"), "{e}");
    assert!(mlx::quantized::quantize(&Array::zeros(&[2, 48], Dtype::F32).unwrap(), 64, 4, QuantMode::Affine).is_err());
    assert!(Array::from_bytes(&[0u8; 7], &[2], Dtype::F32).is_err());
    assert!(Array::zeros(&[-1], Dtype::F32).is_err());
    assert!(a.to_vec::<i32>().is_err());
    assert!(a.item::<f32>().is_err());
}

#[test]
fn memory_and_devices() {
    mlx::device::reset_peak_memory();
    let a = Array::ones(&[1024, 1024], Dtype::F32).unwrap();
    a.eval().unwrap();
    let m = mlx::device::memory_stats();
    assert!(m.active >= 4 << 20 && m.peak >= 4 << 20, "{m:?}");
    assert!(mlx::device::version().starts_with("0.32"));
    mlx::device::eval(&[&a]).unwrap();
    mlx::device::async_eval(&[&a]).unwrap();
    mlx::device::synchronize().unwrap();
    let _ = mlx::device::gpu_available();
    assert_eq!(
        mlx::device::default_device(),
        if mlx::device::gpu_available() { mlx::Device::Gpu } else { mlx::Device::Cpu }
    );
}

#[test]
fn custom_kernels_report_unavailable_backends() {
    use mlx::kernel::{Kernel, KernelBackend, Launch};
    // With no GPU the entry points exist and fail with an error rather than aborting.
    if mlx::device::gpu_available() {
        return;
    }
    let r = Kernel::new(KernelBackend::Metal, "k", &["a"], &["out"], "out[0] = a[0];", "").and_then(|k| {
        let a = Array::zeros(&[1], Dtype::F32).unwrap();
        k.call(
            &[&a],
            &Launch { outputs: &[(&[1], Dtype::F32)], grid: [1, 1, 1], threadgroup: [1, 1, 1], template: &[] },
        )
    });
    assert!(r.is_err());
}
