//! The host kernels (`mlx::host`, kernels/cpu/) against products computed here in f64 from the same
//! elements, and against themselves: a row's bits must not depend on the other rows.

use mlx::quantized::{dequantize, quantize};
use mlx::{host, random, Array, Dtype, QuantMode, Quantized};

/// Rows `[m, k]` and `[n, k]` of normal numbers in `dtype`, from `seed`.
fn operands(m: i32, n: i32, k: i32, dtype: Dtype, seed: u64) -> (Array, Array) {
    let keys = random::split(&random::key(seed).unwrap(), 2).unwrap();
    let x = random::normal(&[m, k], Dtype::F32, &keys[0]).unwrap().as_dtype(dtype).unwrap();
    let w = random::normal(&[n, k], Dtype::F32, &keys[1]).unwrap().multiply(&Array::f32(0.05)).unwrap();
    (x, w.as_dtype(dtype).unwrap())
}

/// `x @ w^T` in f64 from the elements as stored, with each output's sum of |products| (what bounds the
/// rounding error of any summation order).
fn exact(x: &Array, w: &Array) -> Vec<(f64, f64)> {
    let (k, n) = (w.dim(1) as usize, w.dim(0) as usize);
    let xs = x.to_f32_vec().unwrap();
    let ws = w.to_f32_vec().unwrap();
    let m = xs.len() / k;
    let mut y = vec![(0.0, 0.0); m * n];
    for i in 0..m {
        for j in 0..n {
            let p = (0..k).map(|c| xs[i * k + c] as f64 * ws[j * k + c] as f64);
            y[i * n + j] = (p.clone().sum(), p.map(f64::abs).sum());
        }
    }
    y
}

/// Every output within an fp32 sum's error bound (k * 2^-24 of the sum of |products|) plus half an ulp of
/// the output dtype: the exact product computed in fp32 and rounded once.
fn assert_close(got: &Array, want: &[(f64, f64)], k: i32, dtype: Dtype, what: &str) {
    // The unit roundoff: half an ulp, relative to the value, at worst.
    let half_ulp = match dtype {
        Dtype::BF16 => 2f64.powi(-8),
        Dtype::F16 => 2f64.powi(-11),
        _ => 2f64.powi(-24),
    };
    let got = got.to_f32_vec().unwrap();
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, (y, abs))) in got.iter().zip(want).enumerate() {
        let err = (*g as f64 - y).abs();
        let bound = half_ulp * y.abs() + k as f64 * 2f64.powi(-24) * abs * (1.0 + half_ulp);
        assert!(err <= bound, "{what}: element {i}: {g} against {y} (error {err}, bound {bound})");
    }
}

#[test]
fn host_dense_matmul_matches_the_exact_product_in_every_dtype() {
    // K with and without a tail past the eight lanes, N with and without a tail past four rows.
    for dtype in [Dtype::F32, Dtype::BF16, Dtype::F16] {
        for &(m, n, k) in &[(1, 40, 256), (4, 37, 100), (19, 130, 64), (33, 5, 7), (1, 1, 1)] {
            let (x, w) = operands(m, n, k, dtype, 7 + m as u64);
            let y = host::dense_matmul(&x, &w).unwrap();
            assert_eq!(y.shape(), [m, n]);
            assert_eq!(y.dtype(), dtype);
            assert_close(&y, &exact(&x, &w), k, dtype, &format!("{dtype:?} m {m} n {n} k {k}"));
        }
    }
}

#[test]
fn host_dense_matmul_gives_a_row_the_same_bits_whatever_its_neighbours() {
    for dtype in [Dtype::F32, Dtype::BF16, Dtype::F16] {
        let (x, w) = operands(24, 70, 264, dtype, 3);
        let all = host::dense_matmul(&x, &w).unwrap();
        for (lo, hi) in [(0, 1), (5, 9), (23, 24), (0, 24)] {
            let part = host::dense_matmul(&x.slice_axis(0, lo, hi).unwrap(), &w).unwrap();
            let want = all.slice_axis(0, lo, hi).unwrap();
            assert_eq!(
                part.as_dtype(Dtype::F32).unwrap().to_vec::<f32>().unwrap(),
                want.as_dtype(Dtype::F32).unwrap().to_vec::<f32>().unwrap(),
                "{dtype:?} rows {lo}..{hi}"
            );
        }
    }
}

#[test]
fn host_dense_matmul_reads_strided_and_batched_inputs() {
    let (x, w) = operands(6, 24, 32, Dtype::BF16, 5);
    let want = exact(&x, &w);
    // x as [2, 3, 32]; w stored transposed, [K, N], and read through a transpose (not row-contiguous).
    let ws = w.to_f32_vec().unwrap();
    let wt: Vec<f32> = (0..32 * 24).map(|t| ws[(t % 24) * 32 + t / 24]).collect();
    let strided = Array::from_slice(&wt, &[32, 24]).unwrap().as_dtype(Dtype::BF16).unwrap().t().unwrap();
    let y = host::dense_matmul(&x.reshape(&[2, 3, 32]).unwrap(), &strided).unwrap();
    assert_eq!(y.shape(), [2, 3, 24]);
    assert_close(&y, &want, 32, Dtype::BF16, "strided w");
    // Every other row of a taller x.
    let (tall, _) = operands(12, 24, 32, Dtype::BF16, 9);
    let every_other = tall.reshape(&[6, 2, 32]).unwrap().slice_axis(1, 0, 1).unwrap().reshape(&[6, 32]).unwrap();
    let y = host::dense_matmul(&every_other, &w).unwrap();
    assert_close(&y, &exact(&every_other, &w), 32, Dtype::BF16, "strided x");
}

#[test]
fn host_dense_matmul_names_bad_operands() {
    let (x, w) = operands(2, 8, 16, Dtype::BF16, 1);
    let e = host::dense_matmul(&x, &w.as_dtype(Dtype::F32).unwrap()).expect_err("mixed dtypes");
    assert!(e.to_string().contains("both be f32, bf16 or f16"), "{e}");
    let e = host::dense_matmul(&x, &w.slice_axis(1, 0, 8).unwrap()).expect_err("K differs");
    assert!(e.to_string().contains("[N, K]"), "{e}");
    let i = Array::from_slice(&[1i32, 2], &[1, 2]).unwrap();
    assert!(host::dense_matmul(&i, &i).is_err());
}

/// `w [n, k]` quantized (MLX's affine layout, scales and biases in `dtype`), and the weights it stands for in
/// f32: dequantized from the scales and biases upcast, as the kernel reads them.
fn quantized(n: i32, k: i32, bits: i32, group: i32, dtype: Dtype, seed: u64) -> (Quantized, Array) {
    let w = random::normal(&[n, k], Dtype::F32, &random::key(seed).unwrap()).unwrap();
    let w = w.multiply(&Array::f32(0.05)).unwrap().as_dtype(dtype).unwrap();
    let q = quantize(&w, group, bits, QuantMode::Affine).unwrap();
    let f32 = |a: &Array| a.as_dtype(Dtype::F32).unwrap();
    let biases = f32(q.biases.as_ref().unwrap());
    let dense = dequantize(&q.weight, &f32(&q.scales), Some(&biases), group, bits, QuantMode::Affine).unwrap();
    (q, dense)
}

fn host_qmm(x: &Array, q: &Quantized) -> mlx::Result<Array> {
    host::quantized_matmul(x, &q.weight, &q.scales, q.biases.as_ref().unwrap(), q.group_size, q.bits)
}

#[test]
fn host_quantized_matmul_matches_the_exact_product_of_the_dequantized_weights() {
    for dtype in [Dtype::F32, Dtype::BF16, Dtype::F16] {
        for bits in [2, 4, 8] {
            for &(m, n, k, group) in &[(1, 40, 256, 64), (4, 37, 128, 32), (19, 9, 512, 128), (3, 5, 64, 64)] {
                let (q, dense) = quantized(n, k, bits, group, dtype, 11 + bits as u64);
                let (x, _) = operands(m, 1, k, dtype, 5 + m as u64);
                let y = host_qmm(&x, &q).unwrap();
                assert_eq!(y.shape(), [m, n]);
                assert_eq!(y.dtype(), dtype);
                // One more rounding than the dense bound: the kernel's s * q + b may differ from MLX's by one.
                let what = format!("{dtype:?} {bits} bits m {m} n {n} k {k} group {group}");
                assert_close(&y, &exact(&x, &dense), k + 2, dtype, &what);
            }
        }
    }
}

#[test]
fn host_quantized_matmul_gives_a_row_the_same_bits_whatever_its_neighbours() {
    for bits in [2, 4, 8] {
        let (q, _) = quantized(70, 256, bits, 64, Dtype::BF16, 4);
        let (x, _) = operands(24, 1, 256, Dtype::BF16, 8);
        let all = host_qmm(&x, &q).unwrap().as_dtype(Dtype::F32).unwrap().to_vec::<f32>().unwrap();
        for (lo, hi) in [(0, 1), (5, 9), (23, 24), (16, 24)] {
            let part = host_qmm(&x.slice_axis(0, lo, hi).unwrap(), &q).unwrap();
            let part = part.as_dtype(Dtype::F32).unwrap().to_vec::<f32>().unwrap();
            assert_eq!(part, all[lo as usize * 70..hi as usize * 70], "{bits} bits rows {lo}..{hi}");
        }
    }
}

#[test]
fn host_quantized_matmul_reads_batched_and_strided_x() {
    let (q, dense) = quantized(24, 128, 4, 64, Dtype::BF16, 2);
    let (tall, _) = operands(12, 1, 128, Dtype::BF16, 3);
    let every_other =
        tall.reshape(&[2, 3, 2, 128]).unwrap().slice_axis(2, 0, 1).unwrap().reshape(&[2, 3, 128]).unwrap();
    let y = host_qmm(&every_other, &q).unwrap();
    assert_eq!(y.shape(), [2, 3, 24]);
    let flat = every_other.reshape(&[6, 128]).unwrap();
    assert_close(&y, &exact(&flat, &dense), 130, Dtype::BF16, "strided batched x");
}

#[test]
fn host_quantized_matmul_names_bad_operands() {
    let (q, _) = quantized(8, 128, 4, 64, Dtype::BF16, 1);
    let (x, _) = operands(2, 1, 128, Dtype::BF16, 1);
    let b = q.biases.as_ref().unwrap();
    let err = |r: mlx::Result<Array>| r.expect_err("bad operands").to_string();
    let e = err(host::quantized_matmul(&x, &q.weight, &q.scales, b, 64, 3));
    assert!(e.contains("3 bits"), "{e}");
    let e = err(host::quantized_matmul(&x.slice_axis(1, 0, 64).unwrap(), &q.weight, &q.scales, b, 64, 4));
    assert!(e.contains("K 64"), "{e}");
    let e = err(host::quantized_matmul(&x, &q.weight, &q.scales, b, 32, 4));
    assert!(e.contains("[N, K / group]"), "{e}");
    let e = err(host::quantized_matmul(&x, &q.weight, &q.scales, &b.as_dtype(Dtype::F32).unwrap(), 64, 4));
    assert!(e.contains("f32, bf16 or f16"), "{e}");
    let e = err(host::quantized_matmul(&x, &q.scales, &q.scales, b, 64, 4));
    assert!(e.contains("uint32 w"), "{e}");
}
