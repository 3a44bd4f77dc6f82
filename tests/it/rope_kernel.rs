//! The host RoPE kernel (kernels/cpu/elementwise.cc, `rope`; src/kernels/rope.rs) against MLX's own CPU RoPE,
//! bit for bit.

use mlx::{fast, Array, Dtype};
use tandem::kernels::fused::differing_bits;
use tandem::kernels::rope;

/// Over f32 and bf16, heads read through transposed strides and packed, one offset for every row and one per
/// row (positions to 30,000, where the angles' f32 rounding and bf16's cos and sin show), RoPE on part of a
/// head (Qwen3.5's quarter) and on all of it, one token and a prompt's 33: every output has MLX's bits, and the
/// positions are used (a row moved by one position differs).
#[test]
fn host_rope_has_mlx_bits() {
    let mut cases = 0;
    for dtype in [Dtype::F32, Dtype::BF16] {
        for &(b, n, t, d, dims) in &[(1, 2, 1, 64, 16), (2, 3, 4, 32, 32), (3, 1, 33, 24, 6), (1, 4, 2, 256, 64)] {
            let x = rope::random_input(b, n, t, d, dtype, (b * 1000 + t * 10 + d) as u64).unwrap();
            for offsets in [vec![0], vec![29_000], (0..b).map(|i| 17 + 4_093 * i).collect::<Vec<_>>()] {
                let offsets = Array::from_slice(&offsets, &[offsets.len() as i32]).unwrap();
                assert!(rope::host_applicable(&x, &offsets, dims));
                let want = fast::rope_dynamic(&x, dims, false, 1e7, 1.0, &offsets).unwrap();
                for (name, input) in [("strided", x.clone()), ("packed", x.contiguous().unwrap())] {
                    let got = rope::host(&input, &offsets, dims, 1e7).unwrap();
                    assert_eq!((got.shape(), got.dtype()), (x.shape(), dtype));
                    let differ = differing_bits(&got, &want).unwrap();
                    assert_eq!(differ, 0, "{dtype:?} [{b}, {n}, {t}, {d}] dims {dims} offsets {offsets:?} {name}");
                    cases += 1;
                }
            }
        }
    }
    assert_eq!(rope::host_probe().unwrap(), 0, "the probe");
    let x = rope::random_input(1, 2, 3, 32, Dtype::F32, 5).unwrap();
    let at = |p: i32| rope::host(&x, &Array::from_slice(&[p], &[1]).unwrap(), 8, 1e4).unwrap();
    assert!(differing_bits(&at(10), &at(11)).unwrap() > 0, "positions unused");
    println!("host RoPE: {cases} cases bit-identical to MLX's CPU RoPE");
}

/// Which calls the host kernel takes, and the bridge's refusal of the rest naming the arrays.
#[test]
fn host_rope_selection_rules() {
    let x = rope::random_input(2, 3, 4, 32, Dtype::BF16, 1).unwrap();
    let one = Array::from_slice(&[5], &[1]).unwrap();
    let two = Array::from_slice(&[5, 9], &[2]).unwrap();
    assert!(rope::host_applicable(&x, &one, 8) && rope::host_applicable(&x, &two, 32));
    assert!(!rope::host_applicable(&x, &one, 7), "odd dims");
    assert!(!rope::host_applicable(&x, &one, 34), "dims past the head");
    assert!(!rope::host_applicable(&x, &one, 0), "no dims (MLX refuses them)");
    assert!(!rope::host_applicable(&x.as_dtype(Dtype::F16).unwrap(), &one, 8), "f16");
    assert!(!rope::host_applicable(&x, &Array::from_slice(&[1, 2, 3], &[3]).unwrap(), 8), "three offsets, two rows");
    assert!(!rope::host_applicable(&x, &one.as_dtype(Dtype::F32).unwrap(), 8), "f32 offsets");
    assert!(!rope::host_applicable(&x.reshape(&[6, 4, 32]).unwrap(), &one, 8), "3-D x");
    let err = rope::host(&x, &Array::from_slice(&[1, 2, 3], &[3]).unwrap(), 8, 1e4).unwrap_err().to_string();
    assert!(err.contains("host rope") && err.contains("offsets [3]"), "{err}");
}
