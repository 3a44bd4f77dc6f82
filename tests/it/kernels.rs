//! Custom kernels (kernels/, src/kernels/) against the MLX ops they replace.
//!
//! The CUDA parity tests need MLX's CUDA backend: elsewhere (this CPU machine, CI) each prints why it is
//! skipped and returns. Their evidence on a GPU comes from benches/gpu/kernels_bench.sh, which runs this
//! module there (and benches/gpu/qmm_kernel.py, the same check from Python over more shapes, with timings).

use mlx::device::{backend, cuda_compute_capability, Backend};
use mlx::quantized::{dequantize, quantize};
use mlx::{random, Array, Dtype, QuantMode, Quantized};
use tandem::kernels::quantized_matmul as qmm;

/// Skips (printing why) unless MLX runs on CUDA here.
fn cuda_or_skip(test: &str) -> bool {
    if backend() == Backend::Cuda {
        return true;
    }
    println!(
        "{test}: SKIPPED: MLX's backend here is {:?}, not CUDA; the CUDA parity evidence comes from \
         benches/gpu/kernels_bench.sh on a GPU (kernels/README.md)",
        backend()
    );
    false
}

fn weights(n: i32, k: i32, bits: i32, dtype: Dtype, seed: u64) -> Quantized {
    let w = random::normal(&[n, k], Dtype::F32, &random::key(seed).unwrap()).unwrap();
    let w = w.multiply(&Array::f32(0.02)).unwrap().as_dtype(dtype).unwrap();
    quantize(&w, 64, bits, QuantMode::Affine).unwrap()
}

fn inputs(m: i32, k: i32, dtype: Dtype, seed: u64) -> Array {
    random::normal(&[m, k], Dtype::F32, &random::key(seed).unwrap()).unwrap().as_dtype(dtype).unwrap()
}

/// x @ dequantize(q)^T in fp32, built here from MLX's dequantize with fp32 scales and biases.
fn fp32_reference(x: &Array, q: &Quantized) -> Vec<f32> {
    let f = |a: &Array| a.as_dtype(Dtype::F32).unwrap();
    let biases = q.biases.as_ref().map(f);
    let w = dequantize(&q.weight, &f(&q.scales), biases.as_ref(), q.group_size, q.bits, q.mode).unwrap();
    f(x).matmul(&w.t().unwrap()).unwrap().to_f32_vec().unwrap()
}

/// ‖a − b‖ / ‖b‖ in f64; infinite when `a` holds a NaN or an infinity.
fn rel_error(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    if a.iter().any(|v| !v.is_finite()) {
        return f64::INFINITY;
    }
    let num: f64 = a.iter().zip(b).map(|(x, y)| (*x as f64 - *y as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den).sqrt()
}

/// The stated tolerance against fp32: half an ulp of the output dtype at its worst (relative), what rounding
/// the exact result to that dtype can cost.
fn half_ulp(dtype: Dtype) -> f64 {
    if dtype == Dtype::F16 {
        2f64.powi(-11)
    } else {
        2f64.powi(-8)
    }
}

#[test]
fn qmm_selection_rules() {
    let q4 = weights(8, 5120, 4, Dtype::BF16, 1);
    let x = inputs(4, 5120, Dtype::BF16, 2).reshape(&[1, 4, 5120]).unwrap();
    assert!(qmm::applicable(&x, &q4), "verify-width bf16 x, 4-bit group-64 weights");
    assert!(qmm::applicable(&inputs(32, 5120, Dtype::BF16, 2), &q4), "a batch's verify: 8 streams x 4 tokens");
    let x33 = inputs(33, 5120, Dtype::BF16, 2);
    assert!(!qmm::applicable(&x33, &q4), "33 rows is past verify width");
    assert!(!qmm::applicable(&x.as_dtype(Dtype::F32).unwrap(), &q4), "f32 x");
    let q3 = weights(8, 5120, 3, Dtype::BF16, 1);
    assert!(!qmm::applicable(&x, &q3), "3 bits");
    let w = inputs(8, 5120, Dtype::BF16, 3);
    let g32 = quantize(&w, 32, 4, QuantMode::Affine).unwrap();
    assert!(!qmm::applicable(&x, &g32), "group size 32");
    let f16_scales = Quantized { scales: q4.scales.as_dtype(Dtype::F16).unwrap(), ..q4.clone() };
    assert!(!qmm::applicable(&x, &f16_scales), "scales of another dtype than x");
    let small_k = weights(8, 64, 4, Dtype::BF16, 1);
    assert!(!qmm::applicable(&inputs(1, 64, Dtype::BF16, 2), &small_k), "K below the tested range");

    if backend() != Backend::Cuda {
        // Off CUDA no CUDA kernel; on the CPU the host kernel (qmm_host_kernel_is_selected_and_within_half_an_ulp).
        assert!(!qmm::selected(&x, &q4));
        let y = qmm::quantized_matmul(&x, &q4).unwrap();
        let want = if qmm::host_selected(&x, &q4) {
            qmm::host(&x, &q4)
        } else if qmm::cpu_selected(&x, &q4) {
            qmm::cpu_f32(&x, &q4)
        } else {
            qmm::fallback(&x, &q4)
        };
        assert_eq!(y.shape(), vec![1, 4, 8]);
        assert_eq!(y.dtype(), Dtype::BF16);
        assert_eq!(y.to_bytes().unwrap(), want.unwrap().to_bytes().unwrap());
    }
    let x32 = x.as_dtype(Dtype::F32).unwrap();
    assert!(!qmm::cpu_selected(&x32, &q4), "f32 x keeps MLX's op");
    let mx = Quantized { mode: QuantMode::Mxfp4, ..q4.clone() };
    assert!(!qmm::cpu_selected(&x, &mx), "only affine weights");
    assert!(!qmm::host_selected(&x, &mx), "the host kernel: only affine weights");
    assert!(!qmm::host_selected(&x, &q3), "the host kernel: no 3 bits");
    assert!(!qmm::host_selected(&x, &Quantized { biases: None, ..q4.clone() }), "the host kernel: biases needed");
    assert!(!qmm::host_selected(&x, &f16_scales), "the host kernel: scales and biases of one dtype");
    assert!(!qmm::host_selected(&inputs(1, 256, Dtype::BF16, 2), &q4), "the host kernel: K of x and w differ");
}

/// The host quantized matmul (kernels/cpu/) on MLX's CPU device: selected for every float dtype at 2, 4 and 8
/// bits and any M, within half an ulp of the fp32 reference, each row's bits the same for every M, and the
/// model's quantized path goes to it.
#[test]
fn qmm_host_kernel_is_selected_and_within_half_an_ulp() {
    if mlx::device::default_device() != mlx::device::Device::Cpu {
        println!("qmm_host_kernel_is_selected_and_within_half_an_ulp: SKIPPED: MLX computes on the GPU here");
        return;
    }
    for dtype in [Dtype::BF16, Dtype::F16, Dtype::F32] {
        let tolerance = if dtype == Dtype::F32 { 1e-5 } else { half_ulp(dtype) as f32 };
        let probe = qmm::host_probe(dtype).unwrap();
        assert!(probe <= tolerance, "{dtype:?}: probe error {probe:.2e}");
        for bits in [2, 4, 8] {
            for (i, &(n, k, group)) in
                [(384, 256, 64), (40, 1024, 64), (4096, 256, 32), (24, 128, 128)].iter().enumerate()
            {
                let w = dense_weights(n, k, dtype, 70 + i as u64);
                let q = quantize(&w, group, bits, QuantMode::Affine).unwrap();
                let x32 = inputs(32, k, dtype, 80 + i as u64);
                let case = format!("{dtype:?} {bits}-bit N={n} K={k} group {group}");
                assert!(qmm::host_selected(&x32, &q), "{case}: not selected");
                let y32 = qmm::quantized_matmul(&x32, &q).unwrap();
                assert_eq!(y32.dtype(), dtype);
                let reference = qmm::reference(&x32, &q).unwrap();
                let e = qmm::relative_error(&y32, &reference).unwrap();
                let e_mlx = qmm::relative_error(&qmm::fallback(&x32, &q).unwrap(), &reference).unwrap();
                assert!(e <= tolerance, "{case}: error {e:.2e} against fp32 (MLX's op: {e_mlx:.2e})");
                rows_alone_as_in_32(&x32, &y32, |x| qmm::quantized_matmul(x, &q).unwrap(), &case);
                let y3 = qmm::quantized_matmul(&x32.reshape(&[4, 8, k]).unwrap(), &q).unwrap();
                assert_eq!(y3.to_bytes().unwrap(), y32.to_bytes().unwrap(), "{case}: [4, 8, K] differs from [32, K]");
                println!("qmm host {case}: error {e:.2e} against fp32, MLX's op {e_mlx:.2e}");
            }
        }
    }
}

/// Past 8 rows one block takes every 8-row slab (so each weight tile is unpacked once for all rows); up to 8 it
/// is one slab launched as before. The groups loaded per round may change with the slabs (they order no sums).
#[test]
fn qmm_slab_rule_takes_every_slab_past_8_rows() {
    for ls in [qmm::WIDE, qmm::NARROW] {
        for m in 1..=qmm::MAX_ROWS {
            let (slabs, groups) = qmm::slab_shape(m, ls);
            assert_eq!(slabs, (m + 7) / 8, "{ls:?} at {m} rows");
            assert!(groups == 1 || groups == ls.groups_per_round, "{ls:?} at {m} rows loads {groups} groups");
            if m <= 8 {
                assert_eq!(groups, ls.groups_per_round, "one slab launches as before: {ls:?} at {m} rows");
            }
        }
    }
}

/// The CPU path (MLX's op in fp32, rounded once to x's dtype) is within half an ulp of an fp32 reference at
/// the shapes tandem-tiny and a real model use, at decode, verify and prefill widths, and rows do not
/// depend on how many come in one call (a verify's logits are decoding's own).
#[test]
fn qmm_cpu_path_is_fp32_rounded_once() {
    // The path exists for MLX's CPU device; on a GPU its op is the GPU's (and never selected there).
    if mlx::device::default_device() != mlx::device::Device::Cpu {
        println!("qmm_cpu_path_is_fp32_rounded_once: SKIPPED: MLX computes on the GPU here, not the CPU");
        return;
    }
    for dtype in [Dtype::BF16, Dtype::F16] {
        for bits in [4, 8] {
            for (i, &(n, k)) in [(384, 256), (40, 1024), (4096, 256)].iter().enumerate() {
                let q = weights(n, k, bits, dtype, 30 + i as u64);
                let x8 = inputs(8, k, dtype, 40 + i as u64);
                let y8 = qmm::cpu_f32(&x8, &q).unwrap();
                assert_eq!(y8.dtype(), dtype);
                for m in [1, 3, 8] {
                    let x = x8.slice_axis(0, 0, m).unwrap();
                    let y = qmm::cpu_f32(&x, &q).unwrap();
                    let case = format!("{dtype:?} {bits}-bit N={n} K={k} M={m}");
                    let e = rel_error(&y.to_f32_vec().unwrap(), &fp32_reference(&x, &q));
                    assert!(e <= half_ulp(dtype), "{case}: error {e:.2e} against fp32 over the tolerance");
                    let rows8 = y8.slice_axis(0, 0, m).unwrap();
                    assert_eq!(y.to_bytes().unwrap(), rows8.to_bytes().unwrap(), "{case}: rows differ from M = 8");
                }
                let e_mlx = rel_error(&qmm::fallback(&x8, &q).unwrap().to_f32_vec().unwrap(), &fp32_reference(&x8, &q));
                println!(
                    "qmm cpu {dtype:?} {bits}-bit N={n} K={k}: MLX's own op in {dtype:?} is {e_mlx:.2e} from fp32"
                );
            }
        }
    }
}

/// Widths the CUDA parity runs take: every verify of one stream, then batches' verifies across 8-row slabs.
const WIDTHS: [i32; 15] = [1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 17, 24, 31, 32];

/// Each row of a 32-row call (slabs 0..4) has the bits the kernel gives that row alone: a sequence's verify
/// rows inside a batch are its plain steps' own.
fn rows_alone_as_in_32(x32: &Array, y32: &Array, kernel: impl Fn(&Array) -> Array, case: &str) {
    for j in [0, 7, 8, 13, 16, 23, 24, 31] {
        let alone = kernel(&x32.slice_axis(0, j, j + 1).unwrap());
        let inside = y32.slice_axis(0, j, j + 1).unwrap();
        assert_eq!(alone.to_bytes().unwrap(), inside.to_bytes().unwrap(), "{case}: row {j} alone differs from M = 32");
    }
}

#[test]
fn qmm_cuda_parity() {
    if !cuda_or_skip("qmm_cuda_parity") {
        return;
    }
    // Edge shapes (partial tiles, K of two groups, N below one block) and 27B projection shapes.
    let shapes = [(40, 256), (1000, 128), (48, 5120), (5120, 6144), (17408, 5120), (5120, 17408)];
    for dtype in [Dtype::BF16, Dtype::F16] {
        for bits in [4, 8] {
            for (i, &(n, k)) in shapes.iter().enumerate() {
                let q = weights(n, k, bits, dtype, 10 + i as u64);
                let x32 = inputs(32, k, dtype, 20 + i as u64);
                let y32 = qmm::cuda(&x32, &q).unwrap();
                let mut worst = (0.0f64, 0.0f64, 0.0f64);
                for m in WIDTHS {
                    let x = x32.slice_axis(0, 0, m).unwrap();
                    let y = qmm::cuda(&x, &q).unwrap();
                    assert_eq!(y.shape(), vec![m, n]);
                    let yv = y.to_f32_vec().unwrap();
                    let reference = fp32_reference(&x, &q);
                    let fallback = qmm::fallback(&x, &q).unwrap().to_f32_vec().unwrap();
                    let (e_ref, e_mlx, e_fb) =
                        (rel_error(&yv, &reference), rel_error(&fallback, &reference), rel_error(&yv, &fallback));
                    worst = (worst.0.max(e_ref), worst.1.max(e_mlx), worst.2.max(e_fb));
                    let case = format!("{dtype:?} {bits}-bit N={n} K={k} M={m}");
                    assert!(e_ref <= half_ulp(dtype), "{case}: error {e_ref:.2e} against fp32 over the tolerance");
                    // Against MLX's op: within both outputs' distances to the reference plus one rounding.
                    assert!(
                        e_fb <= e_ref + e_mlx + half_ulp(dtype),
                        "{case}: {e_fb:.2e} from MLX's op (kernel {e_ref:.2e}, MLX {e_mlx:.2e} from fp32)"
                    );
                    // Batch invariance: each row as it comes out of the 32-row call.
                    let rows32 = y32.slice_axis(0, 0, m).unwrap();
                    assert_eq!(y.to_bytes().unwrap(), rows32.to_bytes().unwrap(), "{case}: rows differ from M = 32");
                }
                rows_alone_as_in_32(&x32, &y32, |x| qmm::cuda(x, &q).unwrap(), &format!("{dtype:?} {bits}-bit N={n}"));
                println!(
                    "qmm parity {dtype:?} {bits}-bit N={n} K={k}: kernel/fp32 {:.2e}, MLX op/fp32 {:.2e}, \
                     kernel/MLX op {:.2e} (worst over M = 1..32; tolerance {:.2e})",
                    worst.0,
                    worst.1,
                    worst.2,
                    half_ulp(dtype)
                );
            }
        }
    }
}

#[test]
fn qmm_cuda_misaligned_and_3d_inputs() {
    if !cuda_or_skip("qmm_cuda_misaligned_and_3d_inputs") {
        return;
    }
    let (n, k) = (96, 512);
    let q = weights(n, k, 4, Dtype::BF16, 5);
    let x = inputs(3, k, Dtype::BF16, 6);
    let y = qmm::cuda(&x, &q).unwrap();
    // A view one element into its buffer: the kernel's scalar-load path, same bits.
    let padded = mlx::concatenate(&[&Array::zeros(&[1], Dtype::BF16).unwrap(), &x.reshape(&[-1]).unwrap()], 0).unwrap();
    let shifted = padded.slice_axis(0, 1, 1 + 3 * k).unwrap().reshape(&[3, k]).unwrap();
    assert_eq!(qmm::cuda(&shifted, &q).unwrap().to_bytes().unwrap(), y.to_bytes().unwrap());
    // The model's [B, T, K] activations.
    let y3 = qmm::cuda(&x.reshape(&[1, 3, k]).unwrap(), &q).unwrap();
    assert_eq!(y3.shape(), vec![1, 3, n]);
    assert_eq!(y3.to_bytes().unwrap(), y.to_bytes().unwrap());
    // Other axis counts (reshaped to two around the kernel).
    let y4 = qmm::cuda(&x.reshape(&[1, 1, 3, k]).unwrap(), &q).unwrap();
    assert_eq!(y4.shape(), vec![1, 1, 3, n]);
    assert_eq!(y4.to_bytes().unwrap(), y.to_bytes().unwrap());
    let y1 = qmm::cuda(&x.slice_axis(0, 1, 2).unwrap().reshape(&[k]).unwrap(), &q).unwrap();
    assert_eq!(y1.shape(), vec![n]);
    assert_eq!(y1.to_bytes().unwrap(), y.slice_axis(0, 1, 2).unwrap().reshape(&[n]).unwrap().to_bytes().unwrap());
    // Outside the kernel's range: an error, not a wrong answer.
    assert!(qmm::cuda(&inputs(33, k, Dtype::BF16, 7), &q).is_err());
}

#[test]
fn qmm_cuda_selected_on_tested_class() {
    if !cuda_or_skip("qmm_cuda_selected_on_tested_class") {
        return;
    }
    let cc = cuda_compute_capability();
    let q = weights(256, 1024, 8, Dtype::BF16, 8);
    let x = inputs(4, 1024, Dtype::BF16, 9);
    let tested = cc.is_some_and(|c| qmm::TESTED_CLASSES.contains(&c));
    let off = tandem::kernels::policy() == tandem::kernels::Policy::Off;
    println!("compute capability {cc:?}, tested class {tested}, TANDEM_KERNELS off {off}");
    assert_eq!(qmm::selected(&x, &q), tested && !off, "selection on compute capability {cc:?}");
    let err = qmm::probe(Dtype::BF16, 8).unwrap();
    assert!(err <= qmm::tolerance(Dtype::BF16) as f32, "probe error {err:.2e}");
    if qmm::selected(&x, &q) {
        let y = qmm::quantized_matmul(&x, &q).unwrap();
        assert_eq!(y.to_bytes().unwrap(), qmm::cuda(&x, &q).unwrap().to_bytes().unwrap());
    }
}

fn dense_weights(n: i32, k: i32, dtype: Dtype, seed: u64) -> Array {
    let w = random::normal(&[n, k], Dtype::F32, &random::key(seed).unwrap()).unwrap();
    w.multiply(&Array::f32(0.02)).unwrap().as_dtype(dtype).unwrap()
}

/// The dense kernel's selection rule on any backend: which formats and shapes it computes, and never off CUDA
/// (there `Linear`'s dense path is MLX's matmul, bit for bit).
#[test]
fn dmm_selection_rules() {
    use tandem::kernels::dense_matmul as dmm;
    let w = dense_weights(8, 5120, Dtype::BF16, 1);
    let x = inputs(4, 5120, Dtype::BF16, 2).reshape(&[1, 4, 5120]).unwrap();
    assert!(dmm::applicable(&x, &w), "verify-width bf16 x and w");
    assert!(dmm::applicable(&inputs(1, 5120, Dtype::BF16, 2), &w), "decode width");
    assert!(dmm::applicable(&inputs(32, 5120, Dtype::BF16, 2), &w), "a batch's verify: 8 streams x 4 tokens");
    assert!(!dmm::applicable(&inputs(33, 5120, Dtype::BF16, 2), &w), "33 rows is past verify width");
    assert!(!dmm::applicable(&x.as_dtype(Dtype::F32).unwrap(), &w.as_dtype(Dtype::F32).unwrap()), "f32");
    assert!(!dmm::applicable(&x, &w.as_dtype(Dtype::F16).unwrap()), "x and w of different dtypes");
    assert!(!dmm::applicable(&inputs(1, 96, Dtype::BF16, 2), &dense_weights(8, 96, Dtype::BF16, 1)), "K of 96");
    assert!(!dmm::applicable(&inputs(1, 256, Dtype::BF16, 2), &w), "K of x and w differ");
    assert!(dmm::applicable(&inputs(2, 64, Dtype::F16, 2), &dense_weights(3, 64, Dtype::F16, 1)), "f16, K = 64");
    if backend() != Backend::Cuda {
        assert!(!dmm::selected(&x, &w), "selected without CUDA");
        let y = dmm::dense_matmul(&x, &w).unwrap();
        assert_eq!(y.shape(), vec![1, 4, 8]);
        assert_eq!(y.dtype(), Dtype::BF16);
        // On the CPU the host kernel (dmm_cpu_kernel_is_selected_and_within_half_an_ulp), elsewhere MLX's op.
        let want = if dmm::cpu_selected(&x, &w) { mlx::host::dense_matmul(&x, &w) } else { dmm::fallback(&x, &w) };
        assert_eq!(y.to_bytes().unwrap(), want.unwrap().to_bytes().unwrap());
    }
}

/// The host dense matmul (kernels/cpu/) on MLX's CPU device: selected for every float dtype and any M, within
/// half an ulp of the fp32 reference where MLX's own op is too, each row's bits the same for every M, and the
/// model's dense path goes to it.
#[test]
fn dmm_cpu_kernel_is_selected_and_within_half_an_ulp() {
    use tandem::kernels::dense_matmul as dmm;
    if mlx::device::default_device() != mlx::device::Device::Cpu {
        println!("dmm_cpu_kernel_is_selected_and_within_half_an_ulp: SKIPPED: MLX computes on the GPU here");
        return;
    }
    for dtype in [Dtype::BF16, Dtype::F16, Dtype::F32] {
        let probe = dmm::cpu_probe(dtype).unwrap();
        let tolerance = if dtype == Dtype::F32 { 1e-5 } else { half_ulp(dtype) as f32 };
        assert!(probe <= tolerance, "{dtype:?}: probe error {probe:.2e}");
        for (i, &(n, k)) in [(4096, 256), (40, 1024), (37, 100)].iter().enumerate() {
            let w = dense_weights(n, k, dtype, 50 + i as u64);
            let x32 = inputs(32, k, dtype, 60 + i as u64);
            assert!(dmm::cpu_selected(&x32, &w), "{dtype:?} N={n} K={k}: not selected");
            let y32 = dmm::dense_matmul(&x32, &w).unwrap();
            let reference = dmm::reference(&x32, &w).unwrap();
            let case = format!("{dtype:?} N={n} K={k}");
            let e = tandem::kernels::quantized_matmul::relative_error(&y32, &reference).unwrap();
            let e_mlx =
                tandem::kernels::quantized_matmul::relative_error(&dmm::fallback(&x32, &w).unwrap(), &reference)
                    .unwrap();
            assert!(e <= tolerance, "{case}: error {e:.2e} against fp32 (MLX's op: {e_mlx:.2e})");
            rows_alone_as_in_32(&x32, &y32, |x| dmm::dense_matmul(x, &w).unwrap(), &case);
            // Three axes, as the model's [B, T, K] hidden states arrive.
            let y3 = dmm::dense_matmul(&x32.reshape(&[4, 8, k]).unwrap(), &w).unwrap();
            assert_eq!(y3.to_bytes().unwrap(), y32.to_bytes().unwrap(), "{case}: [4, 8, K] differs from [32, K]");
            println!("dmm cpu {case}: error {e:.2e} against fp32, MLX's op {e_mlx:.2e}");
        }
    }
}

/// The dense kernel's slab rule, like the quantized one's: past 8 rows one block takes every 8-row slab (each
/// weight chunk loaded once for all rows), one chunk a round past two slabs; up to 8 rows, one slab launched as
/// before.
#[test]
fn dmm_slab_rule_takes_every_slab_past_8_rows() {
    use tandem::kernels::dense_matmul as dmm;
    for u in [1, 2] {
        for m in 1..=tandem::kernels::VERIFY_ROWS {
            let (slabs, chunks) = dmm::slab_shape(m, u);
            assert_eq!(slabs, (m + 7) / 8, "{m} rows, {u} chunks a round");
            let expected = if slabs > 2 { 1 } else { u };
            assert_eq!(chunks, expected, "{m} rows ({slabs} slabs) load {chunks} chunks a round, not {expected}");
        }
    }
}

/// The dense kernel against an fp32 reference (x and w upcast) and against MLX's matmul, bf16 and f16,
/// M = 1..32, on edge shapes (partial tiles, K of one chunk, N below one block) and the 27B projection
/// shapes: within half an ulp of the output dtype of the reference, and each row's bits the same whatever M
/// (MLX's own op is not: it prints whether its M = 1 row matched). A misaligned view of x gives the aligned
/// copy's bits, `[B, T, K]` inputs keep their leading axes, and 33 rows is an error.
#[test]
fn dmm_cuda_parity() {
    use tandem::kernels::dense_matmul as dmm;
    if !cuda_or_skip("dmm_cuda_parity") {
        return;
    }
    let shapes =
        [(40, 256), (1000, 128), (3, 64), (48, 5120), (4096, 5120), (6144, 5120), (17408, 5120), (5120, 17408)];
    for dtype in [Dtype::BF16, Dtype::F16] {
        for (i, &(n, k)) in shapes.iter().enumerate() {
            let w = dense_weights(n, k, dtype, 50 + i as u64);
            let x32 = inputs(32, k, dtype, 60 + i as u64);
            let y32 = dmm::cuda(&x32, &w).unwrap();
            let mlx32 = dmm::fallback(&x32, &w).unwrap();
            let (mut worst, mut mlx_invariant) = ((0.0f64, 0.0f64, 0.0f64), true);
            for m in WIDTHS {
                let x = x32.slice_axis(0, 0, m).unwrap();
                let y = dmm::cuda(&x, &w).unwrap();
                assert_eq!(y.shape(), vec![m, n]);
                let yv = y.to_f32_vec().unwrap();
                let reference = dmm::reference(&x, &w).unwrap().to_f32_vec().unwrap();
                let fallback = dmm::fallback(&x, &w).unwrap();
                let fv = fallback.to_f32_vec().unwrap();
                let (e_ref, e_mlx, e_fb) =
                    (rel_error(&yv, &reference), rel_error(&fv, &reference), rel_error(&yv, &fv));
                worst = (worst.0.max(e_ref), worst.1.max(e_mlx), worst.2.max(e_fb));
                let case = format!("{dtype:?} N={n} K={k} M={m}");
                assert!(e_ref <= half_ulp(dtype), "{case}: error {e_ref:.2e} against fp32 over the tolerance");
                assert!(
                    e_fb <= e_ref + e_mlx + half_ulp(dtype),
                    "{case}: {e_fb:.2e} from MLX's op (kernel {e_ref:.2e}, MLX {e_mlx:.2e} from fp32)"
                );
                // Batch invariance: each row as it comes out of the 32-row call.
                let rows32 = y32.slice_axis(0, 0, m).unwrap();
                assert_eq!(y.to_bytes().unwrap(), rows32.to_bytes().unwrap(), "{case}: rows differ from M = 32");
                mlx_invariant &= fallback.to_bytes().unwrap() == mlx32.slice_axis(0, 0, m).unwrap().to_bytes().unwrap();
            }
            rows_alone_as_in_32(&x32, &y32, |x| dmm::cuda(x, &w).unwrap(), &format!("dense {dtype:?} N={n}"));
            println!(
                "dmm parity {dtype:?} N={n} K={k}: kernel/fp32 {:.2e}, MLX op/fp32 {:.2e}, kernel/MLX op {:.2e} \
                 (worst over M = 1..32; tolerance {:.2e}); kernel rows bit-identical across M; MLX op's rows {}",
                worst.0,
                worst.1,
                worst.2,
                half_ulp(dtype),
                if mlx_invariant { "bit-identical too" } else { "NOT bit-identical across M" }
            );
        }
    }
    let (n, k) = (96, 512);
    let w = dense_weights(n, k, Dtype::BF16, 5);
    let x = inputs(3, k, Dtype::BF16, 6);
    let y = dmm::cuda(&x, &w).unwrap();
    // A view one element into its buffer: the kernel's element-wise load path, same bits.
    let padded = mlx::concatenate(&[&Array::zeros(&[1], Dtype::BF16).unwrap(), &x.reshape(&[-1]).unwrap()], 0).unwrap();
    let shifted = padded.slice_axis(0, 1, 1 + 3 * k).unwrap().reshape(&[3, k]).unwrap();
    assert_eq!(dmm::cuda(&shifted, &w).unwrap().to_bytes().unwrap(), y.to_bytes().unwrap(), "misaligned x");
    // A weight that is a view one row into its buffer (as a fused matmul's part could be): same bits.
    let w_tail =
        mlx::concatenate(&[&dense_weights(1, k, Dtype::BF16, 7), &w], 0).unwrap().slice_axis(0, 1, 1 + n).unwrap();
    assert_eq!(dmm::cuda(&x, &w_tail).unwrap().to_bytes().unwrap(), y.to_bytes().unwrap(), "offset weight view");
    let y3 = dmm::cuda(&x.reshape(&[1, 3, k]).unwrap(), &w).unwrap();
    assert_eq!(y3.shape(), vec![1, 3, n]);
    assert_eq!(y3.to_bytes().unwrap(), y.to_bytes().unwrap());
    assert!(dmm::cuda(&inputs(33, k, Dtype::BF16, 7), &w).is_err(), "33 rows");
    assert!(dmm::cuda(&inputs(2, 96, Dtype::BF16, 7), &dense_weights(8, 96, Dtype::BF16, 1)).is_err(), "K of 96");
}

/// On CUDA: the dense kernel is selected exactly on tested machine classes (not with `TANDEM_KERNELS=off`
/// or `-dense_matmul`), its probe passes, and through the model (tandem-tiny in bf16, where it runs at every
/// decode and verify projection) greedy MTP output equals plain greedy output at depths 1-3.
/// The dense kernel reads x's rows the same whatever its axes: `[B, T, K]` as the model passes it (the kernel
/// flattens the leading axes itself) and other counts (reshaped around it) give the `[M, K]` call's bytes.
#[test]
fn dmm_cuda_reads_any_axes_alike() {
    use tandem::kernels::dense_matmul as dmm;
    if !cuda_or_skip("dmm_cuda_reads_any_axes_alike") {
        return;
    }
    let (n, k) = (96, 512);
    let (w, x) = (dense_weights(n, k, Dtype::BF16, 10), inputs(6, k, Dtype::BF16, 11));
    let y = dmm::cuda(&x, &w).unwrap().to_bytes().unwrap();
    for shape in [vec![2, 3, k], vec![1, 2, 3, k]] {
        let ys = dmm::cuda(&x.reshape(&shape).unwrap(), &w).unwrap();
        assert_eq!(ys.shape()[..shape.len() - 1], shape[..shape.len() - 1], "{shape:?}");
        assert_eq!(ys.to_bytes().unwrap(), y, "{shape:?}");
    }
}

#[test]
fn dmm_cuda_selected_and_lossless() {
    use tandem::kernels::dense_matmul as dmm;
    if !cuda_or_skip("dmm_cuda_selected_and_lossless") {
        return;
    }
    let cc = cuda_compute_capability();
    let tested = cc.is_some_and(|c| dmm::TESTED_CLASSES.contains(&c));
    let off = tandem::kernels::policy() == tandem::kernels::Policy::Off || tandem::kernels::disabled(dmm::NAME);
    println!("compute capability {cc:?}, tested class {tested}, dense_matmul kernel off {off}");
    for dtype in [Dtype::BF16, Dtype::F16] {
        let (w, x) = (dense_weights(256, 1024, dtype, 8), inputs(4, 1024, dtype, 9));
        assert_eq!(dmm::selected(&x, &w), tested && !off, "{dtype:?}");
        let err = dmm::probe(dtype).unwrap();
        assert!(err <= tandem::kernels::quantized_matmul::tolerance(dtype), "{dtype:?}: probe error {err:.2e}");
        if dmm::selected(&x, &w) {
            let y = dmm::dense_matmul(&x, &w).unwrap();
            assert_eq!(y.to_bytes().unwrap(), dmm::cuda(&x, &w).unwrap().to_bytes().unwrap());
        }
    }
    crate::common::tiny_mtp_matches_plain(Dtype::BF16, !off);
}

/// Every compiled elementwise chain (src/kernels/fused.rs) gives the values its op-by-op body gives,
/// on every backend, in bf16 and f32, at decode, verify and prefill widths, and one compiled trace
/// serves them all. Fused kernels keep each op's arithmetic; the bound allows for a reordered
/// transcendental (2 ulp of f32; bf16 outputs must match exactly or within one bf16 ulp).
#[test]
fn fused_chains_match_their_op_by_op_bodies() {
    use tandem::kernels::fused::{self, reference};
    let rand = |shape: &[i32], dtype: Dtype, seed: u64| {
        random::normal(shape, Dtype::F32, &random::key(seed).unwrap()).unwrap().as_dtype(dtype).unwrap()
    };
    let compare = |what: &str, got: &Array, want: &Array| {
        assert_eq!(got.shape(), want.shape(), "{what}");
        assert_eq!(got.dtype(), want.dtype(), "{what}");
        let ulp = if got.dtype() == Dtype::BF16 { 2f32.powi(-7) } else { 2.0 * f32::EPSILON };
        let (g, w) = (got.to_f32_vec().unwrap(), want.to_f32_vec().unwrap());
        for (i, (a, b)) in g.iter().zip(&w).enumerate() {
            assert!((a - b).abs() <= ulp * b.abs().max(1e-6), "{what}: element {i}: compiled {a}, op by op {b}");
        }
    };
    for dtype in [Dtype::BF16, Dtype::F32] {
        for (t, seed) in [(1, 1), (4, 2), (37, 3)] {
            let what = |name: &str| format!("{name} ({dtype}, T = {t})");
            let (b, a) = (rand(&[1, t, 6], dtype, seed), rand(&[1, t, 6], dtype, seed + 10));
            let (bias, neg_a) = (rand(&[6], dtype, 4), rand(&[6], Dtype::F32, 5).exp().unwrap().negative().unwrap());
            let (beta, decay) = fused::delta_gates(&b, &a, &bias, &neg_a).unwrap();
            let want = reference::delta_gates(&b, &a, &bias, &neg_a).unwrap();
            compare(&what("delta_gates beta"), &beta, &want[0]);
            compare(&what("delta_gates decay"), &decay, &want[1]);
            let (n, z) = (rand(&[1, t, 3, 8], Dtype::F32, seed + 20), rand(&[1, t, 3, 8], dtype, seed + 30));
            compare(&what("silu_gate"), &fused::silu_gate(&n, &z).unwrap(), &reference::silu_gate(&n, &z).unwrap()[0]);
            let (g, u) = (rand(&[1, t, 16], dtype, seed + 40), rand(&[1, t, 16], dtype, seed + 50));
            compare(&what("swiglu"), &fused::swiglu(&g, &u).unwrap(), &reference::swiglu(&g, &u).unwrap()[0]);
            compare(
                &what("sigmoid_gate"),
                &fused::sigmoid_gate(&g, &u).unwrap(),
                &reference::sigmoid_gate(&g, &u).unwrap()[0],
            );
            compare(&what("silu"), &fused::silu(&g).unwrap(), &reference::silu(&g).unwrap()[0]);
            let (x, w) = (rand(&[1, t, 64], dtype, seed + 70), rand(&[64], Dtype::F32, seed + 80));
            let (eps, inv_d) = (Array::f32(1e-6), Array::f32(1.0 / 64.0));
            let norm = &reference::rms_norm_f32(&x, &w, &eps, &inv_d).unwrap()[0];
            compare(&what("rms_norm_f32"), &fused::rms_norm_f32(&x, &w, &eps, &inv_d).unwrap(), norm);
            if mlx::device::default_device() == mlx::device::Device::Cpu {
                // Where MLX's norm is its own op-by-op fallback, the chain is those operations: the same bytes,
                // op by op and compiled as the model calls it (`norm::fallback`, x in f32 in the linear-attention layers).
                let x32 = x.as_dtype(Dtype::F32).unwrap();
                let mlx_norm = mlx::fast::rms_norm(&x32, Some(&w), 1e-6).unwrap();
                let want = mlx_norm.as_dtype(dtype).unwrap().to_bytes().unwrap();
                assert_eq!(norm.to_bytes().unwrap(), want, "{}", what("MLX's rms_norm"));
                let model_norm = tandem::kernels::norm::fallback(&x32, &w, 1e-6).unwrap();
                assert_eq!(model_norm.to_bytes().unwrap(), mlx_norm.to_bytes().unwrap(), "{}", what("norm::fallback"));
            }
        }
    }
    if fused::enabled() {
        // f16, which the CPU's host kernels (tests/it/elementwise_kernel.rs) leave to the compiled chain.
        let (g, u) = (rand(&[1, 4, 16], Dtype::F16, 60), rand(&[1, 4, 16], Dtype::F16, 61));
        let compiled = fused::swiglu(&g, &u).unwrap();
        let eager = &reference::swiglu(&g, &u).unwrap()[0];
        mlx::device::eval(&[&g, &u]).unwrap();
        assert!(
            mlx::compile::graph_ops(&[&compiled]) < mlx::compile::graph_ops(&[eager]),
            "compiled chains run as fewer operations"
        );
        let (x, w) = (rand(&[1, 4, 64], Dtype::BF16, 62), rand(&[64], Dtype::F32, 63));
        let (eps, inv_d) = (Array::f32(1e-6), Array::f32(1.0 / 64.0));
        let compiled = fused::rms_norm_f32(&x, &w, &eps, &inv_d).unwrap();
        let eager = &reference::rms_norm_f32(&x, &w, &eps, &inv_d).unwrap()[0];
        mlx::device::eval(&[&x, &w]).unwrap();
        let (c, e) = (mlx::compile::graph_ops(&[&compiled]), mlx::compile::graph_ops(&[eager]));
        assert!(c < e, "the compiled norm runs as fewer operations: {c} against {e}");
    }
}
