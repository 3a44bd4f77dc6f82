//! The depthwise conv + SiLU kernel (kernels/cuda/conv_silu.cu{,h}, src/kernels/conv.rs) against MLX's conv
//! and a direct sum, and its exactness across positions and batch. The CUDA tests print why they are skipped
//! elsewhere (this CPU machine, CI).

use mlx::device::{backend, Backend};
use mlx::{Array, Dtype};
use tandem::kernels::conv;

fn rel(a: &Array, b: &Array) -> f32 {
    tandem::kernels::quantized_matmul::relative_error(a, b).unwrap()
}

/// `silu(sum_i w[c, i] x[b, t + i, c])` by slices and sums, in f32: what the kernel and the fallback compute.
fn direct(x: &Array, w: &Array) -> Array {
    let (k, steps) = (w.dim(1), x.dim(1) - w.dim(1) + 1);
    let x = x.as_dtype(Dtype::F32).unwrap();
    let mut acc = Array::zeros(&[x.dim(0), steps, x.dim(2)], Dtype::F32).unwrap();
    for i in 0..k {
        let wi = w.slice_axis(1, i, i + 1).unwrap().reshape(&[1, 1, -1]).unwrap();
        acc = acc.add(&x.slice_axis(1, i, i + steps).unwrap().multiply(&wi).unwrap()).unwrap();
    }
    acc.multiply(&acc.sigmoid().unwrap()).unwrap()
}

/// Which calls the kernel takes: x `[B, K - 1 + T, C]` of a float dtype with T up to 16, an fp32 weight
/// `[C, K, 1]` of a width up to 8.
#[test]
fn conv_selection_rules() {
    let (x, w) = conv::random_inputs(2, 4, 96, 4, Dtype::BF16, 1).unwrap();
    assert!(conv::applicable(&x, &w), "a verify of 4 positions for 2 sequences");
    assert!(conv::applicable(&x.slice_axis(1, 0, 4).unwrap(), &w), "a decode step");
    assert!(!conv::applicable(&x.slice_axis(1, 0, 3).unwrap(), &w), "no new position");
    let (long, _) = conv::random_inputs(1, 17, 96, 4, Dtype::BF16, 2).unwrap();
    assert!(!conv::applicable(&long, &w), "17 positions: a prefill's, MLX's conv");
    assert!(!conv::applicable(&x, &w.as_dtype(Dtype::BF16).unwrap()), "a bf16 weight");
    assert!(!conv::applicable(&x.slice_axis(2, 0, 95).unwrap(), &w), "channels differ");
    if backend() != Backend::Cuda {
        assert!(!conv::selected(&x, &w), "selected without CUDA");
    }
}

/// The fallback (and so the layer on every backend without the kernel) is the conv the kernel computes.
#[test]
fn conv_fallback_is_the_direct_sum() {
    for dtype in [Dtype::BF16, Dtype::F32] {
        let (x, w) = conv::random_inputs(3, 5, 40, 4, dtype, 3).unwrap();
        let y = conv::conv_silu(&x, &w).unwrap();
        assert_eq!((y.shape(), y.dtype()), (vec![3, 5, 40], Dtype::F32));
        let e = rel(&y, &direct(&x, &w));
        assert!(e < 1e-5, "{dtype:?}: {e:.2e} from the direct sum");
    }
}

/// On CUDA: the kernel within its tolerance of MLX's conv for bf16, f16 and f32 inputs, at the 27B layer's
/// 10240 channels and at odd sizes, 1 to 16 positions; each position bit-identical to its one-position call
/// and to the same position in a batch of one; the probe passes.
#[test]
fn conv_cuda_parity() {
    if backend() != Backend::Cuda {
        println!("conv_cuda_parity: SKIPPED: MLX's backend here is {:?}, not CUDA", backend());
        return;
    }
    assert!(conv::probe().unwrap() <= conv::TOLERANCE);
    for dtype in [Dtype::BF16, Dtype::F16, Dtype::F32] {
        let mut worst = 0.0f32;
        for (b, t, c) in [(1, 1, 10240), (1, 4, 10240), (8, 4, 10240), (3, 16, 300), (2, 2, 1)] {
            let (x, w) = conv::random_inputs(b, t, c, 4, dtype, (b * 100 + t) as u64).unwrap();
            let y = conv::cuda(&x, &w).unwrap();
            let e = rel(&y, &conv::fallback(&x, &w).unwrap()).max(rel(&y, &direct(&x, &w)));
            worst = worst.max(e);
            assert!(e <= conv::TOLERANCE, "{dtype:?} B {b} T {t} C {c}: {e:.2e}");
            for s in 0..t {
                let alone =
                    conv::cuda(&x.slice_axis(0, b - 1, b).unwrap().slice_axis(1, s, s + 4).unwrap(), &w).unwrap();
                let row = y.slice_axis(0, b - 1, b).unwrap().slice_axis(1, s, s + 1).unwrap();
                assert_eq!(row.to_bytes().unwrap(), alone.to_bytes().unwrap(), "{dtype:?} B {b} position {s}");
            }
        }
        println!(
            "conv parity {dtype:?}: kernel/MLX {worst:.2e} (tolerance {:.0e}); positions bit-identical alone",
            conv::TOLERANCE
        );
    }
}

/// On any machine with a C++ compiler: the CUDA source itself, run by a CPU emulation
/// (tests/it/emulate/conv.cpp), against a double-precision reference and for the same bit-identity.
#[test]
fn conv_source_emulated_on_cpu() {
    let defines = [("CONV_CUH", "conv_silu.cuh"), ("CONV_BODY", "conv_silu.cu")];
    if let Some(out) = crate::common::run_emulation("conv", &defines) {
        assert!(out.contains("every position identical alone"), "{out}");
    }
}

/// On any machine with a C++ compiler: the window kernel's CUDA source (kernels/cuda/conv_window.cu) run by a
/// CPU emulation (tests/it/emulate/conv_window.cpp): the window and the new rows read through their strides, y
/// bit-identical to the conv kernel's body over the packed concatenation, the window and the recorded input
/// exactly the concatenation's rows, for one, four and sixteen new rows.
#[test]
fn conv_window_source_emulated_on_cpu() {
    let defines =
        [("CONV_CUH", "conv_silu.cuh"), ("CONV_BODY", "conv_silu.cu"), ("CONV_WINDOW_BODY", "conv_window.cu")];
    if let Some(out) = crate::common::run_emulation("conv_window", &defines) {
        assert_eq!(out.matches("window and input the concatenation's rows").count(), 3, "{out}");
    }
}

/// A layer's conv step off CUDA (and wherever the window kernel is not selected): y is the conv over the
/// concatenation, the window its last K - 1 rows, the input kept only when asked; the window kernel's rules
/// refuse mismatched windows and dtypes, and a refused launch is an error naming the arrays.
#[test]
fn conv_step_is_the_concatenations_conv() {
    let (x, w) = conv::random_inputs(2, 3, 40, 4, Dtype::BF16, 9).unwrap();
    let (prev, next) = (x.slice_axis(1, 0, 3).unwrap(), x.slice_axis(1, 3, 6).unwrap());
    for record in [false, true] {
        let step = conv::step(&prev, &next, &w, record).unwrap();
        assert_eq!(step.y.to_bytes().unwrap(), conv::conv_silu(&x, &w).unwrap().to_bytes().unwrap(), "y");
        assert_eq!(step.window.to_bytes().unwrap(), x.slice_axis(1, 3, 6).unwrap().to_bytes().unwrap(), "window");
        assert_eq!(step.input.map(|i| i.to_bytes().unwrap()), record.then(|| x.to_bytes().unwrap()), "input");
    }
    // The layer's layout (window packed, rows a slice of a wider array, the weight a transposed view).
    let (p2, n2, w2) = conv::window_inputs(2, 5, 40, 4, Dtype::BF16, 10).unwrap();
    let step = conv::step(&p2, &n2, &w2, true).unwrap();
    let x2 = mlx::concatenate(&[&p2, &n2], 1).unwrap();
    assert_eq!(step.y.to_bytes().unwrap(), conv::conv_silu(&x2, &w2).unwrap().to_bytes().unwrap(), "y, strided");
    assert_eq!(step.window.to_bytes().unwrap(), x2.slice_axis(1, 5, 8).unwrap().to_bytes().unwrap());
    // One new row: the window is the last two old rows and the new one.
    let step = conv::step(&prev, &next.slice_axis(1, 0, 1).unwrap(), &w, false).unwrap();
    let want = x.slice_axis(1, 1, 4).unwrap();
    assert_eq!(step.window.to_bytes().unwrap(), want.to_bytes().unwrap(), "window after one row");
    assert!(conv::window_applicable(&prev, &next, &w));
    assert!(!conv::window_applicable(&prev.slice_axis(1, 0, 2).unwrap(), &next, &w), "a short window");
    assert!(!conv::window_applicable(&prev.as_dtype(Dtype::F32).unwrap(), &next, &w), "mixed dtypes");
    if backend() != Backend::Cuda {
        assert!(!conv::window_selected(&prev, &next, &w, true), "selected without CUDA");
    }
    let err = conv::window_cuda(&prev.slice_axis(1, 0, 2).unwrap(), &next, &w, true).err().unwrap().to_string();
    assert!(err.contains("conv window kernel") && err.contains("[2, 2, 40]"), "{err}");
}

/// On CUDA: the window kernel's outputs bit-identical to the conv kernel over the concatenation (y) and to the
/// concatenation's rows (window, input), laid out as a layer meets them (the window packed, the new rows a
/// slice of a wider array, the weight a transposed view: `conv::window_inputs`), for bf16, f16 and f32 rows at
/// 1..16 new positions and 1..4 sequences; its probes pass with and without the recorded input; tandem-tiny's MTP
/// decoding matches plain decoding with every kernel on.
#[test]
fn conv_window_cuda_parity() {
    if backend() != Backend::Cuda {
        println!("conv_window_cuda_parity: SKIPPED: MLX's backend here is {:?}, not CUDA", backend());
        return;
    }
    for dtype in [Dtype::BF16, Dtype::F16, Dtype::F32] {
        for record in [false, true] {
            assert_eq!(conv::window_probe(dtype, record).unwrap(), 0.0, "{dtype:?} recording {record}: probe");
        }
        for &(b, t, c) in &[(1, 1, 10240), (1, 4, 10240), (4, 4, 10240), (2, 16, 300), (3, 7, 33)] {
            let case = format!("{dtype:?} b {b} t {t} c {c}");
            let (prev, next, w) = conv::window_inputs(b, t, c, 4, dtype, (b * 100 + t) as u64).unwrap();
            let packed = mlx::concatenate(&[&prev, &next], 1).unwrap();
            let want_y = conv::cuda(&packed, &w.contiguous().unwrap()).unwrap().to_bytes().unwrap();
            for record in [false, true] {
                let got = conv::window_cuda(&prev, &next, &w, record).unwrap();
                assert_eq!(got.y.to_bytes().unwrap(), want_y, "{case} record {record}: y");
                let window = packed.slice_axis(1, t, t + 3).unwrap();
                assert_eq!(got.window.to_bytes().unwrap(), window.to_bytes().unwrap(), "{case}: window");
                let input = got.input.map(|i| i.to_bytes().unwrap());
                assert_eq!(input, record.then(|| packed.to_bytes().unwrap()), "{case}: input");
            }
        }
        println!("conv window parity {dtype:?}: bit-identical to the conv kernel and the concatenation");
    }
    crate::common::tiny_mtp_matches_plain(Dtype::BF16, true);
}
