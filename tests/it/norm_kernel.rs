//! The RMSNorm kernels (kernels/cuda/rms_norm.cuh, add_rms_norm.cu; src/kernels/norm.rs) against MLX's ops and
//! an fp32 reference, and their exactness across rows. The CUDA tests print why they are skipped elsewhere
//! (this CPU machine, CI).

use mlx::device::{backend, Backend};
use mlx::{Array, Dtype};
use tandem::kernels::norm;
use tandem::kernels::quantized_matmul::{relative_error, tolerance};

fn rel(a: &Array, b: &Array) -> f32 {
    relative_error(a, b).unwrap()
}

/// Which calls the kernels take: rows of a float dtype with an fp32 scale as long as a row; the residual of
/// the same shape and dtype.
#[test]
fn norm_selection_rules() {
    let (h, m, w) = norm::random_inputs(4, 96, Dtype::BF16, 1).unwrap();
    assert!(norm::applicable(&h, None, &w), "4 rows of 96");
    assert!(norm::applicable(&h, Some(&m), &w), "with the residual");
    assert!(norm::applicable(&h.reshape(&[2, 2, 96]).unwrap(), None, &w), "[B, T, D] rows");
    assert!(!norm::applicable(&h, None, &w.as_dtype(Dtype::BF16).unwrap()), "a bf16 scale");
    assert!(!norm::applicable(&h.slice_axis(1, 0, 95).unwrap(), None, &w), "rows shorter than the scale");
    assert!(!norm::applicable(&h, Some(&m.as_dtype(Dtype::F32).unwrap()), &w), "a residual of another dtype");
    assert!(!norm::applicable(&h, Some(&m.slice_axis(0, 0, 3).unwrap()), &w), "a residual of another shape");
    assert!(!norm::applicable(&h.as_dtype(Dtype::I32).unwrap(), None, &w), "integers");
    if backend() != Backend::Cuda {
        assert!(!norm::selected(&h, Some(&m), &w), "selected without CUDA");
    }
    // A launch the rules refuse is an error before any kernel is made (on every backend).
    let err = norm::add_cuda(&h, &m, &w.slice_axis(0, 0, 95).unwrap(), 1e-6).unwrap_err().to_string();
    assert!(err.contains("rms_norm kernel") && err.contains("[95]"), "{err}");
}

/// The paths every backend without the kernel takes: the fp32 norm of the rounded sum, within half an ulp
/// of the fp32 reference, and the sum itself exactly MLX's add.
#[test]
fn norm_fallback_is_the_fp32_norm() {
    for dtype in [Dtype::BF16, Dtype::F16, Dtype::F32] {
        let (h, m, w) = norm::random_inputs(5, 300, dtype, 2).unwrap();
        let (sum, y) = norm::add_rms_norm(&h, &m, &w, 1e-6).unwrap();
        assert_eq!(sum.to_bytes().unwrap(), h.add(&m).unwrap().to_bytes().unwrap(), "{dtype:?}: the sum");
        assert_eq!((y.shape(), y.dtype()), (vec![5, 300], dtype));
        let e = rel(&y, &norm::reference(&sum, &w, 1e-6).unwrap());
        assert!(e <= tolerance(dtype), "{dtype:?}: {e:.2e} from the fp32 reference");
        let alone = norm::rms_norm(&sum, &w, 1e-6).unwrap();
        assert_eq!(alone.to_bytes().unwrap(), y.to_bytes().unwrap(), "{dtype:?}: the plain norm of the sum");
    }
}

/// On CUDA: both kernels within half an ulp of the fp32 reference and of MLX's ops, the sum bit-identical to
/// MLX's add, for bf16, f16 and f32 rows of the 27B hidden size (5120), a head (256) and odd sizes; each row
/// bit-identical to that row alone; the probe passes.
#[test]
fn norm_cuda_parity() {
    if backend() != Backend::Cuda {
        println!("norm_cuda_parity: SKIPPED: MLX's backend here is {:?}, not CUDA", backend());
        return;
    }
    for dtype in [Dtype::BF16, Dtype::F16, Dtype::F32] {
        assert!(norm::probe(dtype).unwrap() <= tolerance(dtype), "{dtype:?}: probe");
        let mut worst = (0.0f32, 0.0f32);
        for (rows, d) in [(1, 5120), (32, 5120), (96, 256), (3, 300), (2, 1), (1, 65536)] {
            let (h, m, w) = norm::random_inputs(rows, d, dtype, (rows * 10 + d) as u64).unwrap();
            let case = format!("{dtype:?} rows {rows} D {d}");
            let y = norm::cuda(&h, &w, 1e-6).unwrap();
            let (sum, y_add) = norm::add_cuda(&h, &m, &w, 1e-6).unwrap();
            assert_eq!(sum.to_bytes().unwrap(), h.add(&m).unwrap().to_bytes().unwrap(), "{case}: the sum");
            for (got, x) in [(&y, &h), (&y_add, &sum)] {
                let e_ref = rel(got, &norm::reference(x, &w, 1e-6).unwrap());
                let e_mlx = rel(got, &norm::fallback(x, &w, 1e-6).unwrap());
                worst = (worst.0.max(e_ref), worst.1.max(e_mlx));
                assert!(e_ref <= tolerance(dtype) && e_mlx <= tolerance(dtype), "{case}: {e_ref:.2e} / {e_mlx:.2e}");
            }
            for r in [0, rows - 1] {
                let row = |a: &Array| a.slice_axis(0, r, r + 1).unwrap().to_bytes().unwrap();
                let alone = norm::cuda(&h.slice_axis(0, r, r + 1).unwrap(), &w, 1e-6).unwrap();
                assert_eq!(row(&y), alone.to_bytes().unwrap(), "{case}: row {r} alone");
            }
        }
        println!(
            "norm parity {dtype:?}: kernel/fp32 {:.2e}, kernel/MLX {:.2e} (tolerance {:.2e}); rows bit-identical alone",
            worst.0,
            worst.1,
            tolerance(dtype)
        );
    }
    crate::common::tiny_mtp_matches_plain(Dtype::BF16, true);
}

/// On any machine with a C++ compiler: the CUDA source itself, both bodies, run by a CPU emulation
/// (tests/it/emulate/norm.cpp) against a double-precision reference, the sum exact, and each row of a
/// 3-row call bit-identical to the row alone, at row lengths below, at and across a block's 256 threads.
#[test]
fn norm_source_emulated_on_cpu() {
    let defines = [("NORM_CUH", "rms_norm.cuh"), ("NORM_BODY", "rms_norm.cu"), ("ADD_NORM_BODY", "add_rms_norm.cu")];
    if let Some(out) = crate::common::run_emulation("norm", &defines) {
        assert!(out.contains("d 2048: worst relative error"), "{out}");
        assert!(out.matches("every row identical alone").count() == 4, "{out}");
    }
}

/// Which calls the gated norm's CUDA kernel takes: o `[B, T, H, D]` f32, z `[B, T, H·D]` of a float dtype
/// (a slice of a wider array included), w `[D]` f32; never selected without CUDA; a launch the rules refuse is
/// an error that names the arrays, before any kernel is made.
#[test]
fn gated_norm_cuda_selection_rules() {
    use tandem::kernels::gated_norm as gn;
    let (o, z, w) = gn::random_inputs(2, 3, 4, 32, Dtype::BF16, 3).unwrap();
    assert!(gn::applicable(&o, &z, &w), "z a slice of the in-projection");
    assert!(gn::applicable(&o, &z.as_dtype(Dtype::F16).unwrap(), &w), "f16 z");
    assert!(!gn::applicable(&o, &z.slice_axis(2, 0, 64).unwrap(), &w), "z narrower than the heads");
    assert!(!gn::applicable(&o.as_dtype(Dtype::BF16).unwrap(), &z, &w), "a bf16 o");
    assert!(!gn::applicable(&o, &z, &w.slice_axis(0, 0, 31).unwrap()), "a scale shorter than a head");
    assert!(!gn::applicable(&o.reshape(&[6, 4, 32]).unwrap(), &z.reshape(&[6, 128]).unwrap(), &w), "3-D o");
    if backend() != Backend::Cuda {
        assert!(!gn::selected(&o, &z, &w), "selected without CUDA");
    }
    let err = gn::cuda(&o, &z.slice_axis(2, 0, 64).unwrap(), &w, 1e-6).unwrap_err().to_string();
    assert!(err.contains("gated norm kernel") && err.contains("[2, 3, 64]"), "{err}");
}

/// On CUDA: the gated norm's kernel within its tolerance of MLX's operations and of an f32 reference for
/// bf16, f16 and f32 z at the 27B slice's shape (48 heads of 128) and odd ones, z sliced or packed alike
/// (bit-identical), each token bit-identical to that token alone; then tandem-tiny's MTP decoding matches
/// plain decoding with every kernel on.
#[test]
fn gated_norm_cuda_parity() {
    use tandem::kernels::gated_norm as gn;
    use tandem::kernels::quantized_matmul::host_tolerance;
    if backend() != Backend::Cuda {
        println!("gated_norm_cuda_parity: SKIPPED: MLX's backend here is {:?}, not CUDA", backend());
        return;
    }
    for dtype in [Dtype::BF16, Dtype::F16, Dtype::F32] {
        let tol = host_tolerance(dtype);
        assert!(gn::cuda_probe(dtype).unwrap() <= tol, "{dtype:?}: probe");
        let mut worst = (0.0f32, 0.0f32);
        for &(b, t, h, d) in &[(1, 1, 48, 128), (1, 4, 48, 128), (4, 4, 48, 128), (2, 3, 5, 33), (1, 2, 3, 20)] {
            let case = format!("{dtype:?} [{b}, {t}, {h}, {d}]");
            let (o, z, w) = gn::random_inputs(b, t, h, d, dtype, (b * 100 + t * 10 + h) as u64).unwrap();
            let got = gn::cuda(&o, &z, &w, 1e-6).unwrap();
            assert_eq!((got.shape(), got.dtype()), (z.shape(), dtype), "{case}");
            let packed = gn::cuda(&o, &z.contiguous().unwrap(), &w, 1e-6).unwrap();
            assert_eq!(got.to_bytes().unwrap(), packed.to_bytes().unwrap(), "{case}: z packed");
            let z32 = z.as_dtype(Dtype::F32).unwrap().reshape(&o.shape()).unwrap();
            let ms = o.square().unwrap().mean(&[-1], true).unwrap();
            let n = o.multiply(&ms.add(&Array::f32(1e-6)).unwrap().rsqrt().unwrap()).unwrap().multiply(&w).unwrap();
            let want =
                n.multiply(&z32.multiply(&z32.sigmoid().unwrap()).unwrap()).unwrap().reshape(&z.shape()).unwrap();
            let (e_ref, e_mlx) = (rel(&got, &want), rel(&got, &gn::fallback(&o, &z, &w, 1e-6).unwrap()));
            worst = (worst.0.max(e_ref), worst.1.max(e_mlx));
            assert!(e_ref <= tol && e_mlx <= tol, "{case}: {e_ref:.2e} / {e_mlx:.2e}");
            let tok = |a: &Array, i: i32| a.slice_axis(1, i, i + 1).unwrap();
            for i in [0, t - 1] {
                let alone = gn::cuda(&tok(&o, i), &tok(&z, i), &w, 1e-6).unwrap();
                assert_eq!(tok(&got, i).to_bytes().unwrap(), alone.to_bytes().unwrap(), "{case}: token {i} alone");
            }
        }
        println!(
            "gated norm parity {dtype:?}: kernel/f32 {:.2e}, kernel/MLX {:.2e} (tolerance {tol:.2e})",
            worst.0, worst.1
        );
    }
    crate::common::tiny_mtp_matches_plain(Dtype::BF16, true);
}

/// On any machine with a C++ compiler: the gated norm's CUDA source run by a CPU emulation
/// (tests/it/emulate/gated_norm.cpp): z read through its strides as a slice, o through transposed strides, head
/// sizes of 128 and odd ones, head counts that leave a block's last warps idle; within 1e-5 of double precision,
/// every token bit-identical to the token alone.
#[test]
fn gated_norm_source_emulated_on_cpu() {
    let defines = [("NORM_CUH", "rms_norm.cuh"), ("GATED_NORM_BODY", "gated_norm.cu")];
    if let Some(out) = crate::common::run_emulation("gated_norm", &defines) {
        assert_eq!(out.matches("every token identical alone").count(), 4, "{out}");
    }
}
