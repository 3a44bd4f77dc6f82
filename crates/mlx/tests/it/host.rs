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

// --- gated delta ---

/// Inputs of one recurrence `(q, k, v, g, beta, state)` in f32: q and k unit rows (q also scaled by
/// 1/sqrt(Dk)), gates in (0.5, 1), betas in (0, 1), as a Gated DeltaNet layer feeds them.
#[allow(clippy::type_complexity)]
fn recurrence_inputs(b: i32, t: i32, hk: i32, hv: i32, dk: i32, dv: i32, seed: u64) -> [Array; 6] {
    let keys = random::split(&random::key(seed).unwrap(), 6).unwrap();
    let normal = |shape: &[i32], i: usize| random::normal(shape, Dtype::F32, &keys[i]).unwrap();
    let unit = |a: Array| {
        let norm = a.square().unwrap().sum(&[-1], true).unwrap().sqrt().unwrap();
        a.divide(&norm).unwrap()
    };
    let q = unit(normal(&[b, t, hk, dk], 0)).multiply(&Array::f32(1.0 / (dk as f32).sqrt())).unwrap();
    let k = unit(normal(&[b, t, hk, dk], 1));
    let v = normal(&[b, t, hv, dv], 2);
    let g =
        normal(&[b, t, hv], 3).sigmoid().unwrap().multiply(&Array::f32(0.5)).unwrap().add(&Array::f32(0.5)).unwrap();
    let beta = normal(&[b, t, hv], 4).sigmoid().unwrap();
    let state = normal(&[b, hv, dv, dk], 5).multiply(&Array::f32(0.1)).unwrap();
    [q, k, v, g, beta, state]
}

/// The recurrence in f64 from the f32 inputs: the outputs `[B, T, Hv, Dv]` and the state after every token
/// `[T, B, Hv, Dv, Dk]`, flattened.
fn recurrence_f64(inputs: &[Array; 6]) -> (Vec<f64>, Vec<f64>) {
    let [q, k, v, g, beta, state] = inputs;
    let (b, t, hk, dk) = (q.dim(0) as usize, q.dim(1) as usize, q.dim(2) as usize, q.dim(3) as usize);
    let (hv, dv) = (v.dim(2) as usize, v.dim(3) as usize);
    let f = |a: &Array| a.to_f32_vec().unwrap().into_iter().map(f64::from).collect::<Vec<_>>();
    let (q, k, v, g, beta) = (f(q), f(k), f(v), f(g), f(beta));
    let mut s = f(state);
    let (mut y, mut states) = (vec![0.0; b * t * hv * dv], Vec::with_capacity(t * s.len()));
    for step in 0..t {
        for bi in 0..b {
            for h in 0..hv {
                let bt = bi * t + step;
                let (kt, qt) = (&k[(bt * hk + h / (hv / hk)) * dk..][..dk], &q[(bt * hk + h / (hv / hk)) * dk..][..dk]);
                for r in 0..dv {
                    let row = &mut s[((bi * hv + h) * dv + r) * dk..][..dk];
                    row.iter_mut().for_each(|x| *x *= g[bt * hv + h]);
                    let kv: f64 = row.iter().zip(kt).map(|(a, b)| a * b).sum();
                    let delta = (v[(bt * hv + h) * dv + r] - kv) * beta[bt * hv + h];
                    row.iter_mut().zip(kt).for_each(|(x, kk)| *x += kk * delta);
                    y[(bt * hv + h) * dv + r] = row.iter().zip(qt).map(|(a, b)| a * b).sum();
                }
            }
        }
        states.extend_from_slice(&s);
    }
    (y, states)
}

/// ‖got - want‖ / ‖want‖.
fn relative(got: &Array, want: &[f64]) -> f64 {
    let got = got.to_f32_vec().unwrap();
    assert_eq!(got.len(), want.len());
    let num: f64 = got.iter().zip(want).map(|(g, w)| (*g as f64 - w).powi(2)).sum();
    let den: f64 = want.iter().map(|w| w * w).sum();
    (num / den).sqrt()
}

#[test]
fn host_gated_delta_matches_the_recurrence_in_f64_and_mlx_op() {
    // Dk with and without a tail past the eight lanes; key heads shared by 1 and 3 value heads; B of 1 and 2.
    for &(b, t, hk, hv, dk, dv) in
        &[(1, 1, 2, 2, 64, 32), (2, 4, 2, 6, 128, 64), (1, 9, 1, 3, 20, 5), (2, 12, 1, 1, 32, 8)]
    {
        let inputs = recurrence_inputs(b, t, hk, hv, dk, dv, 11 + t as u64);
        let [q, k, v, g, beta, state] = &inputs;
        let (y, states) = host::gated_delta(q, k, v, g, beta, state, true).unwrap();
        assert_eq!(y.shape(), [b, t, hv, dv]);
        assert_eq!(states.shape(), [t, b, hv, dv, dk]);
        let (y64, states64) = recurrence_f64(&inputs);
        let what = format!("B {b} T {t} Hk {hk} Hv {hv} Dk {dk} Dv {dv}");
        assert!(relative(&y, &y64) < 1e-6, "{what}: outputs {}", relative(&y, &y64));
        assert!(relative(&states, &states64) < 1e-6, "{what}: states {}", relative(&states, &states64));
        // MLX's own op (a loop of operations on the CPU), summing in another order: within 1e-5.
        let (my, mstate) = mlx::fast::gated_delta_update(q, k, v, g, beta, Some(state)).unwrap();
        let last = states.slice_axis(0, t - 1, t).unwrap().squeeze(&[0]).unwrap();
        let close = |a: &Array, b: &Array| {
            let want: Vec<f64> = b.to_f32_vec().unwrap().into_iter().map(f64::from).collect();
            relative(a, &want)
        };
        assert!(close(&y, &my) < 1e-5 && close(&last, &mstate) < 1e-5, "{what}: against MLX's op");
        // Only the last state: the same bits as the last of all.
        let (y1, final_only) = host::gated_delta(q, k, v, g, beta, state, false).unwrap();
        assert_eq!(final_only.shape(), [1, b, hv, dv, dk]);
        assert_eq!(final_only.squeeze(&[0]).unwrap().to_bytes().unwrap(), last.to_bytes().unwrap(), "{what}");
        assert_eq!(y1.to_bytes().unwrap(), y.to_bytes().unwrap(), "{what}");
    }
}

#[test]
fn host_gated_delta_gives_a_token_the_same_bits_as_decoding_it_alone() {
    // A verify of five tokens against five decode steps: every output and every step's state, bit for bit.
    let inputs = recurrence_inputs(2, 5, 2, 4, 128, 16, 5);
    let [q, k, v, g, beta, state] = &inputs;
    let (y, states) = host::gated_delta(q, k, v, g, beta, state, true).unwrap();
    let mut s = state.clone();
    for t in 0..5 {
        let at = |a: &Array| a.slice_axis(1, t, t + 1).unwrap();
        let (yt, st) = host::gated_delta(&at(q), &at(k), &at(v), &at(g), &at(beta), &s, true).unwrap();
        assert_eq!(yt.to_bytes().unwrap(), at(&y).to_bytes().unwrap(), "output of token {t}");
        let want = states.slice_axis(0, t, t + 1).unwrap();
        assert_eq!(st.to_bytes().unwrap(), want.to_bytes().unwrap(), "state after token {t}");
        s = st.squeeze(&[0]).unwrap();
    }
}

#[test]
fn host_gated_delta_reads_strided_inputs() {
    // q and k as transposed views, the state a slice of a wider batch: the same bits as packed copies.
    let [q, k, v, g, beta, state] = recurrence_inputs(1, 3, 2, 2, 32, 8, 9);
    let qt = q.transpose(&[0, 2, 1, 3]).unwrap().contiguous().unwrap().transpose(&[0, 2, 1, 3]).unwrap();
    let wide = mlx::ops::concatenate(&[&state, &state.multiply(&Array::f32(2.0)).unwrap()], 0).unwrap();
    let view = wide.slice_axis(0, 0, 1).unwrap();
    let a = host::gated_delta(&qt, &k, &v, &g, &beta, &view, true).unwrap();
    let b = host::gated_delta(&q, &k, &v, &g, &beta, &state, true).unwrap();
    assert_eq!(a.0.to_bytes().unwrap(), b.0.to_bytes().unwrap());
    assert_eq!(a.1.to_bytes().unwrap(), b.1.to_bytes().unwrap());
}

#[test]
fn host_gated_delta_names_bad_operands() {
    let [q, k, v, g, beta, state] = recurrence_inputs(1, 2, 2, 4, 32, 8, 3);
    let err = |r: mlx::Result<(Array, Array)>| r.err().map(|e| e.to_string()).unwrap_or_default();
    let half = q.as_dtype(Dtype::BF16).unwrap();
    assert!(err(host::gated_delta(&half, &k, &v, &g, &beta, &state, true)).contains("must be f32"));
    let bad_state = state.slice_axis(3, 0, 16).unwrap();
    let msg = err(host::gated_delta(&q, &k, &v, &g, &beta, &bad_state, true));
    assert!(msg.contains("state [1, 4, 8, 16]"), "{msg}");
    // Value heads not a multiple of key heads.
    let [q3, k3, ..] = recurrence_inputs(1, 2, 3, 4, 32, 8, 3);
    assert!(err(host::gated_delta(&q3, &k3, &v, &g, &beta, &state, true)).contains("multiple of Hk"));
}

// --- attention ---

/// Causal attention in f64 from the elements as stored: q `[1, Hq, T, D]` over the first `len` rows of
/// buffers `[1, Hkv, CAP, D]`, query t seeing `len - T + t + 1` keys; flattened `[Hq, T, D]`.
fn attention_f64(q: &Array, k: &Array, v: &Array, len: usize, scale: f64) -> Vec<f64> {
    let (hq, t, d) = (q.dim(1) as usize, q.dim(2) as usize, q.dim(3) as usize);
    let (hkv, cap) = (k.dim(1) as usize, k.dim(2) as usize);
    let f = |a: &Array| a.to_f32_vec().unwrap().into_iter().map(f64::from).collect::<Vec<_>>();
    let (q, k, v) = (f(q), f(k), f(v));
    let mut out = vec![0.0; hq * t * d];
    for h in 0..hq {
        let g = h / (hq / hkv);
        for i in 0..t {
            let n = len - t + i + 1;
            let qr = &q[(h * t + i) * d..][..d];
            let s: Vec<f64> = (0..n)
                .map(|j| qr.iter().zip(&k[(g * cap + j) * d..][..d]).map(|(a, b)| a * b).sum::<f64>() * scale)
                .collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let p: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
            let sum: f64 = p.iter().sum();
            for c in 0..d {
                out[(h * t + i) * d + c] = (0..n).map(|j| p[j] * v[(g * cap + j) * d + c]).sum::<f64>() / sum;
            }
        }
    }
    out
}

fn attention_inputs(hq: i32, hkv: i32, t: i32, d: i32, cap: i32, dtype: Dtype, seed: u64) -> [Array; 3] {
    let keys = random::split(&random::key(seed).unwrap(), 3).unwrap();
    let n = |shape: &[i32], i: usize| random::normal(shape, Dtype::F32, &keys[i]).unwrap().as_dtype(dtype).unwrap();
    [n(&[1, hq, t, d], 0), n(&[1, hkv, cap, d], 1), n(&[1, hkv, cap, d], 2)]
}

#[test]
fn host_attention_matches_the_exact_attention_in_every_dtype() {
    // D with and without a tail past the eight lanes; one and three query heads a key head; a decode step, a
    // verify, a prefill chunk over the whole cache; buffers longer than the valid keys.
    for dtype in [Dtype::F32, Dtype::BF16, Dtype::F16] {
        let half_ulp = match dtype {
            Dtype::BF16 => 2f64.powi(-8),
            Dtype::F16 => 2f64.powi(-11),
            _ => 1e-6,
        };
        for &(hq, hkv, t, d, cap, len) in
            &[(2, 2, 1, 64, 40, 33), (6, 2, 4, 64, 300, 257), (3, 1, 5, 20, 9, 9), (4, 2, 3, 256, 64, 3)]
        {
            let [q, k, v] = attention_inputs(hq, hkv, t, d, cap, dtype, 21 + d as u64);
            let scale = 1.0 / (d as f32).sqrt();
            let o = host::attention(&q, &k, &v, len, scale).unwrap();
            assert_eq!((o.shape(), o.dtype()), (vec![1, hq, t, d], dtype));
            let want = attention_f64(&q, &k, &v, len as usize, scale as f64);
            let e = relative(&o, &want);
            assert!(e <= half_ulp, "{dtype:?} Hq {hq} Hkv {hkv} T {t} D {d} len {len}: error {e:.2e}");
        }
    }
}

#[test]
fn host_attention_gives_a_query_the_bits_of_a_decode_step() {
    // A verify of four queries over 70 keys: query t alone over the first 67 + t keys gives the same bits.
    for dtype in [Dtype::F32, Dtype::BF16, Dtype::F16] {
        let [q, k, v] = attention_inputs(4, 2, 4, 64, 128, dtype, 8);
        let all = host::attention(&q, &k, &v, 70, 0.125).unwrap();
        for t in 0..4 {
            let alone = host::attention(&q.slice_axis(2, t, t + 1).unwrap(), &k, &v, 67 + t, 0.125).unwrap();
            let want = all.slice_axis(2, t, t + 1).unwrap();
            assert_eq!(alone.to_bytes().unwrap(), want.to_bytes().unwrap(), "{dtype:?} query {t}");
        }
    }
}

#[test]
fn host_attention_names_bad_operands() {
    let [q, k, v] = attention_inputs(4, 2, 3, 64, 16, Dtype::BF16, 4);
    let err = |r: mlx::Result<Array>| r.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err(host::attention(&q, &k.as_dtype(Dtype::F32).unwrap(), &v, 8, 1.0)).contains("must all be"));
    assert!(err(host::attention(&q, &k, &v, 2, 1.0)).contains("3 queries over 2 keys"));
    assert!(err(host::attention(&q, &k, &v, 17, 1.0)).contains("holding 16"));
    let [q3, ..] = attention_inputs(3, 2, 3, 64, 16, Dtype::BF16, 4);
    assert!(err(host::attention(&q3, &k, &v, 8, 1.0)).contains("multiple of Hkv"));
}
