//! The CPU's host kernels for the elementwise chains and the RMSNorm (kernels/cpu/elementwise.{h,cc},
//! src/kernels/fused.rs) against MLX's own operations: the same bits for every bf16 input, for f32 values over
//! exp's whole range and its special values, for strided inputs, and the errors for inputs they do not take.

use mlx::host::{self, Chain};
use mlx::{random, Array, Dtype};
use tandem::kernels::fused::{self, reference};

fn rand(shape: &[i32], dtype: Dtype, seed: u64, scale: f32) -> Array {
    let x = random::normal(shape, Dtype::F32, &random::key(seed).unwrap()).unwrap();
    x.multiply(&Array::f32(scale)).unwrap().as_dtype(dtype).unwrap()
}

/// Every element of `got` carries `want`'s bits (any NaN for any NaN), and both have one shape and dtype.
fn assert_same_bits(what: &str, got: &Array, want: &Array) {
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    assert_eq!(got.dtype(), want.dtype(), "{what}: dtype");
    let g = got.as_dtype(Dtype::F32).unwrap().to_f32_vec().unwrap();
    let w = want.as_dtype(Dtype::F32).unwrap().to_f32_vec().unwrap();
    let bad: Vec<usize> = (0..g.len()).filter(|&i| !fused::same_bits(g[i], w[i])).collect();
    assert!(
        bad.is_empty(),
        "{what}: {} of {} elements differ from MLX's, first at {}: host {:e} against {:e}",
        bad.len(),
        g.len(),
        bad[0],
        g[bad[0]],
        w[bad[0]]
    );
}

/// MLX's op-by-op chain for `chain`.
fn mlx_chain(chain: Chain, a: &Array, b: &Array) -> Array {
    let out = match chain {
        Chain::Swiglu => reference::swiglu(a, b),
        Chain::SigmoidGate => reference::sigmoid_gate(a, b),
        Chain::Silu => reference::silu(a),
        Chain::SiluGate => reference::silu_gate(a, b),
    };
    out.unwrap().remove(0)
}

const CHAINS: [Chain; 4] = [Chain::Swiglu, Chain::SigmoidGate, Chain::Silu, Chain::SiluGate];

/// All 65,536 bf16 bit patterns (NaNs, infinities, subnormals included) as each chain's first input and as
/// its second: the host kernel's bits are MLX's, for every one.
#[test]
fn every_bf16_input_gets_mlx_bits() {
    let bits: Vec<u16> = (0..=u16::MAX).collect();
    let bytes: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
    let all = Array::from_bytes(&bytes, &[256, 256], Dtype::BF16).unwrap();
    let other = rand(&[256, 256], Dtype::BF16, 7, 6.0);
    for chain in CHAINS {
        for (x, y) in [(&all, &other), (&other, &all)] {
            // The silu gate's first input is the f32 norm output.
            let x32;
            let x = if chain == Chain::SiluGate {
                x32 = rand(&[256, 256], Dtype::F32, 8, 3.0);
                &x32
            } else {
                x
            };
            let inputs: Vec<&Array> = if chain == Chain::Silu { vec![y] } else { vec![x, y] };
            let got = fused::host(chain, &inputs).unwrap();
            let want = if chain == Chain::Silu { mlx_chain(chain, y, y) } else { mlx_chain(chain, x, y) };
            assert_same_bits(&format!("{chain:?}, bf16"), &got, &want);
        }
    }
}

/// f32 over exp's range (MLX's exp polynomial, its ±88 limits) and the special values.
#[test]
fn f32_inputs_get_mlx_bits() {
    let mut v: Vec<f32> = (0..4096).map(|i| (i as f32 - 2048.0) * 0.0461).collect();
    v.extend([f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0, 88.0, -88.0, 88.000_01, -88.000_01, 1e-40]);
    v.extend(std::iter::repeat_n(0.5, 4116 - v.len()));
    let a = Array::from_slice(&v, &[12, 343]).unwrap();
    let b = Array::from_slice(&v.iter().rev().copied().collect::<Vec<_>>(), &[12, 343]).unwrap();
    for chain in CHAINS {
        let inputs: Vec<&Array> = if chain == Chain::Silu { vec![&a] } else { vec![&a, &b] };
        let want = if chain == Chain::Silu { mlx_chain(chain, &a, &a) } else { mlx_chain(chain, &a, &b) };
        assert_same_bits(&format!("{chain:?}, f32"), &fused::host(chain, &inputs).unwrap(), &want);
    }
}

/// SwiGLU's gate and up are halves of one projection's output: last-axis slices, read in place; a transposed
/// input is packed first. Both give the contiguous inputs' bits.
#[test]
fn strided_inputs_get_the_bits_of_contiguous_ones() {
    for dtype in [Dtype::BF16, Dtype::F32] {
        let both = rand(&[2, 5, 96], dtype, 11, 2.0);
        let (gate, up) = (both.slice_axis(2, 0, 48).unwrap(), both.slice_axis(2, 48, 96).unwrap());
        let want = mlx_chain(Chain::Swiglu, &gate, &up);
        assert_same_bits("swiglu over slices", &fused::host(Chain::Swiglu, &[&gate, &up]).unwrap(), &want);
        let t = rand(&[48, 10], dtype, 12, 2.0).transpose(&[1, 0]).unwrap();
        let u = rand(&[10, 48], dtype, 13, 2.0);
        let want = mlx_chain(Chain::SigmoidGate, &t, &u);
        assert_same_bits("sigmoid gate, transposed", &fused::host(Chain::SigmoidGate, &[&t, &u]).unwrap(), &want);
        let eps = 1e-6;
        let x = both.slice_axis(2, 16, 80).unwrap();
        let w = rand(&[64], Dtype::F32, 14, 1.0);
        let want = &reference::rms_norm_f32(&x, &w, &Array::f32(eps), &Array::f32(1.0 / 64.0)).unwrap()[0];
        assert_same_bits("rms norm over a slice", &host::rms_norm(&x, &w, eps, 1.0 / 64.0).unwrap(), want);
    }
}

/// An input nothing else holds gives the output its buffer, as MLX's elementwise ops do (the kernels then compute
/// in place): the values are those of a fresh output.
#[test]
fn donated_inputs_compute_in_place() {
    for dtype in [Dtype::BF16, Dtype::F32] {
        let (x, y) = (rand(&[3, 200], dtype, 21, 4.0), rand(&[3, 200], dtype, 22, 4.0));
        let two = Array::f32(2.0).as_dtype(dtype).unwrap();
        // x * 2 and the norm's input exist only as these calls' inputs: donatable when the graph runs.
        let got = host::elementwise(Chain::Swiglu, &x.multiply(&two).unwrap(), &y).unwrap();
        let want = mlx_chain(Chain::Swiglu, &x.multiply(&two).unwrap(), &y);
        assert_same_bits("swiglu, donated gate", &got, &want);
        let got = host::elementwise(Chain::Silu, &y.multiply(&two).unwrap(), &y.multiply(&two).unwrap()).unwrap();
        assert_same_bits("silu, donated", &got, &mlx_chain(Chain::Silu, &y.multiply(&two).unwrap(), &y));
        let w = rand(&[200], Dtype::F32, 23, 1.0);
        let got = host::rms_norm(&x.multiply(&two).unwrap(), &w, 1e-6, 1.0 / 200.0).unwrap();
        let want =
            &reference::rms_norm_f32(&x.multiply(&two).unwrap(), &w, &Array::f32(1e-6), &Array::f32(0.005)).unwrap()[0];
        assert_same_bits("rms norm, donated x", &got, want);
    }
}

/// The norm, f32 and bf16, at the model's row lengths and one that is no multiple of eight: MLX's op-by-op
/// norm and MLX's own `fast::rms_norm` on its CPU, bit for bit; and what the model calls takes it.
#[test]
fn rms_norm_gets_mlx_bits() {
    for dtype in [Dtype::BF16, Dtype::F32] {
        for (rows, d, seed) in [(1, 256, 1), (9, 64, 2), (3, 255, 3), (2, 5120, 4)] {
            let x = rand(&[rows, d], dtype, seed, 3.0);
            let w = rand(&[d], Dtype::F32, seed + 100, 1.0).add(&Array::f32(1.0)).unwrap();
            let inv_d = 1.0 / d as f32;
            let got = host::rms_norm(&x, &w, 1e-6, inv_d).unwrap();
            let what = format!("rms norm {dtype:?} [{rows}, {d}]");
            let want = &reference::rms_norm_f32(&x, &w, &Array::f32(1e-6), &Array::f32(inv_d)).unwrap()[0];
            assert_same_bits(&what, &got, want);
            let fast = mlx::fast::rms_norm(&x.as_dtype(Dtype::F32).unwrap(), Some(&w), 1e-6).unwrap();
            assert_same_bits(&format!("{what} vs fast::rms_norm"), &got, &fast.as_dtype(dtype).unwrap());
            if mlx::device::default_device() == mlx::device::Device::Cpu {
                assert!(fused::host_norm_selected(&x, &w), "{what}: the model's norm takes the host kernel");
                assert_same_bits(&what, &tandem::kernels::norm::fallback(&x, &w, 1e-6).unwrap(), &got);
            }
        }
    }
}

/// Which calls take the host kernels, and the probe's verdict here.
#[test]
fn elementwise_selection_rules() {
    let (a, b) = (rand(&[2, 8], Dtype::BF16, 1, 1.0), rand(&[2, 8], Dtype::BF16, 2, 1.0));
    let a32 = a.as_dtype(Dtype::F32).unwrap();
    assert!(fused::host_applicable(Chain::Swiglu, &[&a, &b]));
    assert!(fused::host_applicable(Chain::Silu, &[&a32]));
    assert!(fused::host_applicable(Chain::SiluGate, &[&a32, &b]), "an f32 norm output and a bf16 gate");
    assert!(!fused::host_applicable(Chain::SiluGate, &[&a, &b]), "the silu gate's first input must be f32");
    assert!(!fused::host_applicable(Chain::Swiglu, &[&a32, &b]), "mixed dtypes");
    assert!(!fused::host_applicable(Chain::Swiglu, &[&a]), "one input for a two-input chain");
    let f16 = a.as_dtype(Dtype::F16).unwrap();
    assert!(!fused::host_applicable(Chain::Swiglu, &[&f16, &f16]), "f16: MLX's compiled chain");
    let wide = rand(&[2, 16], Dtype::BF16, 3, 1.0);
    assert!(!fused::host_applicable(Chain::Swiglu, &[&a, &wide]), "broadcasting: MLX's compiled chain");
    let w = rand(&[8], Dtype::F32, 4, 1.0);
    assert!(fused::host_norm_applicable(&a, &w));
    assert!(!fused::host_norm_applicable(&a, &w.as_dtype(Dtype::BF16).unwrap()), "a bf16 scale");
    assert!(!fused::host_norm_applicable(&a, &rand(&[7], Dtype::F32, 5, 1.0)), "a scale of another length");
    assert_eq!(fused::host_probe().unwrap(), 0, "the probe finds MLX's bits on this machine");
    if mlx::device::default_device() == mlx::device::Device::Cpu {
        assert!(fused::host_selected(Chain::Swiglu, &[&a, &b]));
    }
}

/// Inputs the kernels do not take are errors naming what is wrong, not wrong numbers.
#[test]
fn elementwise_bad_inputs_are_errors() {
    let a = rand(&[2, 8], Dtype::BF16, 1, 1.0);
    let wide = rand(&[2, 16], Dtype::BF16, 2, 1.0);
    let err = host::elementwise(Chain::Swiglu, &a, &wide).unwrap_err().to_string();
    assert!(err.contains("[2, 8]") && err.contains("[2, 16]"), "{err}");
    let f16 = a.as_dtype(Dtype::F16).unwrap();
    let err = host::elementwise(Chain::Swiglu, &f16, &f16).unwrap_err().to_string();
    assert!(err.contains("f32 or bf16"), "{err}");
    let err = host::elementwise(Chain::SiluGate, &a, &a).unwrap_err().to_string();
    assert!(err.contains("silu gate"), "{err}");
    let err = host::rms_norm(&a, &rand(&[7], Dtype::F32, 3, 1.0), 1e-6, 0.125).unwrap_err().to_string();
    assert!(err.contains("[2, 8]") && err.contains("[7]"), "{err}");
    let err = host::rms_norm(&a, &rand(&[8], Dtype::BF16, 3, 1.0), 1e-6, 0.125).unwrap_err().to_string();
    assert!(err.contains("w f32"), "{err}");
}

/// The gated norm's host kernel (`kernels::gated_norm`, on MLX's CPU) carries its fallback's bits (MLX's norm as
/// the host computes it, then the SiLU gate): f32 and bf16 z, z a slice of a wider array (the in-projection's
/// split) and z contiguous, one and several rows; against an independent f32 reference within bf16's rounding;
/// selected on the CPU unless switched off; a shape it does not compute is refused by name.
#[test]
fn gated_norm_host_kernel_has_the_fallbacks_bits() {
    use tandem::kernels::gated_norm as gn;
    if mlx::device::default_device() != mlx::device::Device::Cpu {
        println!("gated_norm_host_kernel_has_the_fallbacks_bits: SKIPPED: MLX computes on the GPU here");
        return;
    }
    assert_eq!(gn::host_probe().unwrap(), 0.0, "host probe: bits off the fallback's");
    for (i, dtype) in [Dtype::F32, Dtype::BF16].into_iter().enumerate() {
        for &(b, t, h, d) in &[(1, 1, 4, 64), (2, 3, 6, 32), (1, 9, 3, 20)] {
            let what = format!("{dtype:?} [{b}, {t}, {h}, {d}]");
            let (o, z, w) = gn::random_inputs(b, t, h, d, dtype, 90 + i as u64).unwrap();
            let eps = 1e-6;
            let got = gn::host(&o, &z, &w, eps).unwrap();
            assert_same_bits(&what, &got, &gn::fallback(&o, &z, &w, eps).unwrap());
            let packed = z.contiguous().unwrap();
            assert_same_bits(&format!("{what}, z packed"), &gn::host(&o, &packed, &w, eps).unwrap(), &got);
            // w * x / sqrt(mean(x^2) + eps) * z * sigmoid(z), per head, in f32 from the inputs' values.
            let z32 = z.as_dtype(Dtype::F32).unwrap().reshape(&o.shape()).unwrap();
            let ms = o.square().unwrap().mean(&[-1], true).unwrap();
            let n = o.multiply(&ms.add(&Array::f32(eps)).unwrap().rsqrt().unwrap()).unwrap().multiply(&w).unwrap();
            let want = n.multiply(&z32.multiply(&z32.sigmoid().unwrap()).unwrap()).unwrap();
            let (g, r) = (got.as_dtype(Dtype::F32).unwrap().to_f32_vec().unwrap(), want.to_f32_vec().unwrap());
            let worst = g.iter().zip(&r).map(|(a, b)| (a - b).abs() / b.abs().max(1e-3)).fold(0.0f32, f32::max);
            let bound = if dtype == Dtype::BF16 { 8e-3 } else { 1e-5 };
            assert!(worst <= bound, "{what}: {worst:e} from the f32 reference");
        }
    }
    let (o, z, w) = gn::random_inputs(1, 2, 4, 32, Dtype::BF16, 1).unwrap();
    let off = tandem::kernels::policy() == tandem::kernels::Policy::Off
        || [gn::HOST_NAME, "cpu_elementwise"].iter().any(|n| tandem::kernels::disabled(n));
    assert_eq!(gn::host_selected(&o, &z, &w), !off, "selected on the CPU");
    let wrong = z.slice_axis(2, 0, 64).unwrap();
    assert!(!gn::host_applicable(&o, &wrong, &w));
    let err = gn::host(&o, &wrong, &w, 1e-6).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err.contains("gated norm") && err.contains("z [1, 2, 64]"), "{err}");
}
