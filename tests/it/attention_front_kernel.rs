//! The gated attention layer's front and gate kernels (kernels/cuda/attention_front.cuh,
//! src/kernels/attention_front.rs): which calls they take, their CUDA parity against MLX's operations (skipped
//! where MLX's backend is not CUDA; benches/gpu/issue16_bench.sh's `rust` phase runs them on a GPU), and their
//! source run by a CPU emulation on every machine.

use mlx::device::{backend, Backend};
use mlx::{Array, Dtype};
use tandem::kernels::attention_front::{self as af, Front};

fn rel(a: &Array, b: &Array) -> f32 {
    tandem::kernels::quantized_matmul::relative_error(a, b).unwrap()
}

/// Which calls the front and gate kernels take: the projection's parts of one float dtype with whole heads,
/// f32 scales of a head's size, int32 positions per row, an even RoPE count up to the head size; never
/// selected without CUDA; a launch the rules refuse is an error naming the arrays, before any kernel is made.
#[test]
fn attention_front_cuda_selection_rules() {
    let (qg, k, v, pos, qw, kw) = af::random_inputs((2, 3, 4, 2, 64), 10, Dtype::BF16, 1).unwrap();
    let f = Front { q_scale: &qw, k_scale: &kw, eps: 1e-6, rope_dims: 16, rope_theta: 1e7 };
    assert!(af::applicable(&qg, &k, &v, &pos, &f), "slices of one projection");
    assert!(af::applicable(&qg, &k, &v, &pos, &Front { rope_dims: 64, ..f }), "RoPE on whole heads");
    assert!(!af::applicable(&qg, &k, &v, &pos, &Front { rope_dims: 15, ..f }), "an odd RoPE count");
    assert!(!af::applicable(&qg, &k, &v, &pos, &Front { rope_dims: 66, ..f }), "RoPE past the head");
    assert!(!af::applicable(&qg, &k, &v, &pos, &Front { rope_dims: 0, ..f }), "no RoPE (MLX's fallback refuses it)");
    assert!(!af::applicable(&qg, &k.as_dtype(Dtype::F16).unwrap(), &v, &pos, &f), "k of another dtype");
    assert!(!af::applicable(&qg.slice_axis(2, 0, 500).unwrap(), &k, &v, &pos, &f), "a query part of no whole heads");
    assert!(!af::applicable(&qg, &k, &v.slice_axis(2, 0, 64).unwrap(), &pos, &f), "v narrower than k");
    assert!(!af::applicable(&qg, &k, &v, &pos.slice_axis(0, 0, 1).unwrap(), &f), "a position short");
    assert!(!af::applicable(&qg, &k, &v, &pos.as_dtype(Dtype::F32).unwrap(), &f), "f32 positions");
    let bf16_scale = qw.as_dtype(Dtype::BF16).unwrap();
    assert!(!af::applicable(&qg, &k, &v, &pos, &Front { q_scale: &bf16_scale, ..f }), "a bf16 scale");
    let o = Array::zeros(&[2, 4, 3, 64], Dtype::BF16).unwrap();
    assert!(af::gate_applicable(&o, &qg), "o [B, Hq, T, D] against its projection");
    assert!(af::gate_applicable(&o.swapaxes(1, 2).unwrap().swapaxes(1, 2).unwrap(), &qg), "a strided o");
    assert!(!af::gate_applicable(&o.slice_axis(1, 0, 3).unwrap(), &qg), "fewer heads than the projection's");
    assert!(!af::gate_applicable(&o.as_dtype(Dtype::F32).unwrap(), &qg), "o of another dtype");
    if backend() != Backend::Cuda {
        assert!(!af::selected(&qg, &k, &v, &pos, &f) && !af::gate_selected(&o, &qg), "selected without CUDA");
    }
    let short = k.slice_axis(2, 0, 64).unwrap();
    let err = af::cuda(&qg, &short, &v, &pos, &f).unwrap_err().to_string();
    assert!(err.contains("attention front kernel") && err.contains("k [2, 3, 64]"), "{err}");
    let err = af::gate_cuda(&o.slice_axis(1, 0, 3).unwrap(), &qg).unwrap_err().to_string();
    assert!(err.contains("attention gate kernel") && err.contains("o [2, 3, 3, 64]"), "{err}");
}

/// The front's fallback at a batch's per-row positions is each row's alone at its position: what the layer
/// relies on when a batch's rows sit at different places (CPU and GPU alike).
#[test]
fn attention_front_fallback_rows_are_their_own() {
    let (qg, k, v, pos, qw, kw) = af::random_inputs((3, 2, 2, 1, 32), 40, Dtype::F32, 9).unwrap();
    let f = Front { q_scale: &qw, k_scale: &kw, eps: 1e-6, rope_dims: 8, rope_theta: 1e4 };
    let (q, k_rot, v_heads) = af::fallback(&qg, &k, &v, &pos, &f).unwrap();
    let positions = pos.to_vec::<i32>().unwrap();
    assert_eq!(positions, [40, 47, 54]);
    for (i, &p) in positions.iter().enumerate() {
        let i = i as i32;
        let row = |x: &Array| x.slice_axis(0, i, i + 1).unwrap();
        let at = Array::from_slice(&[p], &[1]).unwrap();
        let (q1, k1, v1) = af::fallback(&row(&qg), &row(&k), &row(&v), &at, &f).unwrap();
        assert_eq!(row(&q).to_bytes().unwrap(), q1.to_bytes().unwrap(), "row {i}: q");
        assert_eq!(row(&k_rot).to_bytes().unwrap(), k1.to_bytes().unwrap(), "row {i}: k");
        assert_eq!(row(&v_heads).to_bytes().unwrap(), v1.to_bytes().unwrap(), "row {i}: v");
        // At another position the rotated heads differ (the positions are used).
        let moved = af::fallback(&row(&qg), &row(&k), &row(&v), &Array::from_slice(&[p + 1], &[1]).unwrap(), &f);
        assert_ne!(moved.unwrap().0.to_bytes().unwrap(), q1.to_bytes().unwrap(), "row {i}: q at p + 1");
    }
}

/// On CUDA: the front and gate kernels within the host kernels' tolerance of MLX's operations for bf16, f16 and
/// f32 at the 27B slice's layer (24 query and 4 key heads of 256, RoPE on 64) and odd shapes, each token
/// bit-identical to that token alone at its position, the parts sliced or packed alike; then tandem-tiny's MTP
/// decoding matches plain decoding with every kernel on.
#[test]
fn attention_front_cuda_parity() {
    use tandem::kernels::quantized_matmul::host_tolerance;
    if backend() != Backend::Cuda {
        println!("attention_front_cuda_parity: SKIPPED: MLX's backend here is {:?}, not CUDA", backend());
        return;
    }
    for dtype in [Dtype::BF16, Dtype::F16, Dtype::F32] {
        let tol = host_tolerance(dtype);
        assert!(af::front_probe(dtype).unwrap() <= tol, "{dtype:?}: front probe");
        assert!(af::gate_probe(dtype).unwrap() <= tol, "{dtype:?}: gate probe");
        let mut worst = (0.0f32, 0.0f32);
        for &(shape, rope_dims) in
            &[((1, 1, 24, 4, 256), 64), ((1, 4, 24, 4, 256), 64), ((4, 4, 24, 4, 256), 64), ((2, 3, 3, 1, 36), 20)]
        {
            let (b, t, hq, _, d) = shape;
            let case = format!("{dtype:?} {shape:?} RoPE {rope_dims}");
            let (qg, k, v, pos, qw, kw) = af::random_inputs(shape, 3_000, dtype, (b * 10 + t) as u64).unwrap();
            let f = Front { q_scale: &qw, k_scale: &kw, eps: 1e-6, rope_dims, rope_theta: 1e7 };
            let (q, kr, vh) = af::cuda(&qg, &k, &v, &pos, &f).unwrap();
            let (q0, k0, v0) = af::fallback(&qg, &k, &v, &pos, &f).unwrap();
            assert_eq!(v0.contiguous().unwrap().to_bytes().unwrap(), vh.to_bytes().unwrap(), "{case}: v moved");
            let e = rel(&q, &q0).max(rel(&kr, &k0));
            let packed = af::cuda(&qg.contiguous().unwrap(), &k.contiguous().unwrap(), &v, &pos, &f).unwrap();
            assert_eq!(q.to_bytes().unwrap(), packed.0.to_bytes().unwrap(), "{case}: parts packed");
            let o = mlx::random::normal(&[b, hq, t, d], Dtype::F32, &mlx::random::key(7).unwrap()).unwrap();
            let o = o.as_dtype(dtype).unwrap();
            let eg = rel(&af::gate_cuda(&o, &qg).unwrap(), &af::gate_fallback(&o, &qg).unwrap());
            worst = (worst.0.max(e), worst.1.max(eg));
            assert!(e <= tol && eg <= tol, "{case}: front {e:.2e}, gate {eg:.2e}");
            for i in [0, t - 1] {
                let tok = |x: &Array| x.slice_axis(1, i, i + 1).unwrap();
                let row = |x: &Array| x.slice_axis(2, i, i + 1).unwrap();
                let at = pos.add(&Array::from_slice(&[i], &[1]).unwrap()).unwrap();
                let alone = af::cuda(&tok(&qg), &tok(&k), &tok(&v), &at, &f).unwrap();
                assert_eq!(row(&q).to_bytes().unwrap(), alone.0.to_bytes().unwrap(), "{case}: token {i} alone");
                assert_eq!(row(&kr).to_bytes().unwrap(), alone.1.to_bytes().unwrap(), "{case}: token {i}'s k");
            }
        }
        println!("attention front parity {dtype:?}: front {:.2e}, gate {:.2e} (tolerance {tol:.2e})", worst.0, worst.1);
    }
    crate::common::tiny_mtp_matches_plain(Dtype::BF16, true);
}

/// On any machine with a C++ compiler: the front and gate kernels' CUDA source run by a CPU emulation
/// (tests/it/emulate/attention_front.cpp): the 27B slice's layer and odd shapes (a head past the norm kernel's
/// block, RoPE on counts that are no multiple of 32, on whole heads, none), the parts read as slices of one
/// projection, o through transposed strides; within 1e-5 of double precision, every token bit-identical alone at
/// its position, the normed heads the norm kernel's bits.
#[test]
fn attention_front_source_emulated_on_cpu() {
    let defines = [
        ("NORM_CUH", "rms_norm.cuh"),
        ("FRONT_CUH", "attention_front.cuh"),
        ("FRONT_BODY", "attention_front.cu"),
        ("GATE_BODY", "attention_gate.cu"),
    ];
    if let Some(out) = crate::common::run_emulation("attention_front", &defines) {
        assert_eq!(out.matches("every token identical alone").count(), 6, "{out}");
        assert_eq!(out.matches("bit-identical to the norm kernel").count(), 2, "{out}");
        assert_eq!(out.matches("gate [").count(), 3, "{out}");
    }
}
