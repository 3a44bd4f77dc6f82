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
