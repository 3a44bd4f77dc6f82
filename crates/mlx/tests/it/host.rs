//! The host kernels (`mlx::host`, kernels/cpu/) against products computed here in f64 from the same
//! elements, and against themselves: a row's bits must not depend on the other rows.

use mlx::{host, random, Array, Dtype};

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
