//! The attention kernel (kernels/cuda/attention*.cu{,h}, src/kernels/attention.rs) against its fp32
//! reference and MLX's attention, and its exactness across the number of queries. The CUDA tests print why
//! they are skipped elsewhere (this CPU machine, CI); benches/gpu/issue16_bench.sh's `rust` phase runs them
//! on the H200.

use mlx::device::{backend, cuda_compute_capability, Backend};
use mlx::{Array, Dtype};
use tandem::kernels::attention as attn;
use tandem::model::layers::{causal_attention, per_query_causal_attention};

fn cuda_or_skip(test: &str) -> bool {
    if backend() == Backend::Cuda {
        return true;
    }
    println!("{test}: SKIPPED: MLX's backend here is {:?}, not CUDA (kernels/README.md)", backend());
    false
}

fn rel(a: &Array, b: &Array) -> f32 {
    tandem::kernels::quantized_matmul::relative_error(a, b).unwrap()
}

/// Which calls the kernel takes: one sequence, q's dtype in the buffers, whole key heads per query head,
/// head sizes to 256, at least as many valid keys as queries and no more than the buffer holds.
#[test]
fn attention_selection_rules() {
    let [q, k, v] = attn::random_inputs(24, 4, 4, 256, 768, Dtype::BF16, 1).unwrap();
    assert!(attn::applicable(&q, &k, &v, 600), "the 27B shape at depth 3");
    assert!(attn::applicable(&q.slice_axis(2, 0, 1).unwrap(), &k, &v, 1), "decode over one key");
    assert!(!attn::applicable(&q, &k, &v, 3), "fewer keys than queries");
    let [q17, ..] = attn::random_inputs(24, 4, 17, 256, 8, Dtype::BF16, 2).unwrap();
    assert!(!attn::applicable(&q17, &k, &v, 600), "17 queries: a prefill's, MLX's fused attention");
    assert!(!attn::applicable(&q, &k, &v, 769), "more keys than the buffer holds");
    assert!(!attn::applicable(&q, &k.as_dtype(Dtype::F16).unwrap(), &v, 600), "buffers of another dtype");
    let [q5, ..] = attn::random_inputs(20, 4, 4, 256, 8, Dtype::BF16, 2).unwrap();
    assert!(attn::applicable(&q5, &k, &v, 600), "5 query heads per key head");
    let [q6, ..] = attn::random_inputs(6, 4, 4, 256, 8, Dtype::BF16, 2).unwrap();
    assert!(!attn::applicable(&q6, &k, &v, 600), "query heads not a multiple of key heads");
    let [qd, kd, vd] = attn::random_inputs(4, 2, 2, 80, 64, Dtype::F32, 3).unwrap();
    assert!(!attn::applicable(&qd, &kd, &vd, 10), "head size 80");
    let two = mlx::concatenate(&[&q, &q], 0).unwrap();
    assert!(!attn::applicable(&two, &k, &v, 600), "two sequences in one call");
    if backend() != Backend::Cuda {
        assert!(!attn::selected(&q, &k, &v, 600), "selected without CUDA");
    }
}

/// The reference the CUDA tests hold the kernel to is attention: on any backend it matches MLX's own
/// (the fused kernel where MLX has one, the query-by-query path) over the valid prefix.
#[test]
fn attention_reference_is_mlx_attention() {
    for (hq, hkv, t, d, len) in [(4, 2, 1, 64, 9), (6, 2, 4, 128, 70), (8, 8, 3, 64, 3)] {
        let [q, k, v] = attn::random_inputs(hq, hkv, t, d, len + 5, Dtype::F32, 7).unwrap();
        let scale = 1.0 / (d as f32).sqrt();
        let ours = attn::reference(&q, &k, &v, len, scale).unwrap();
        let (kv, vv) = (k.slice_axis(2, 0, len).unwrap(), v.slice_axis(2, 0, len).unwrap());
        let theirs = causal_attention(&q, &kv, &vv, scale).unwrap();
        let per_query = per_query_causal_attention(&q, &kv, &vv, scale).unwrap();
        let case = format!("Hq {hq} Hkv {hkv} T {t} D {d} len {len}");
        assert_eq!(ours.shape(), vec![1, hq, t, d], "{case}");
        assert!(rel(&ours, &theirs) < 1e-5, "{case}: {:.2e} from MLX's attention", rel(&ours, &theirs));
        assert!(rel(&ours, &per_query) < 1e-5, "{case}: {:.2e} from the query-by-query path", rel(&ours, &per_query));
    }
}

/// On CUDA: the kernel within its tolerance of the fp32 reference for bf16, f16 and f32, head sizes 64, 128
/// and 256, GQA 6:1 and 1:1, 1 to 9 queries (9 queries of 6 heads split into groups), key lengths inside
/// one chunk, on chunk edges and over many chunks; not further from MLX's attention than the two errors
/// allow; and each query's bits those of a one-query call over its own prefix (a verify's attention is
/// decoding's).
#[test]
fn attention_cuda_parity() {
    if !cuda_or_skip("attention_cuda_parity") {
        return;
    }
    for dtype in [Dtype::BF16, Dtype::F16, Dtype::F32] {
        let tol = attn::tolerance_for(dtype);
        let mut worst = (0.0f32, 0.0f32);
        for (hq, hkv, d) in [(24, 4, 256), (8, 8, 128), (12, 2, 64)] {
            for (t, len) in [(1, 1), (1, 64), (1, 65), (4, 4), (4, 67), (4, 600), (2, 128), (9, 200), (3, 2100)] {
                let [q, k, v] = attn::random_inputs(hq, hkv, t, d, len + 40, dtype, (t * 1000 + len) as u64).unwrap();
                let scale = 1.0 / (d as f32).sqrt();
                let case = format!("{dtype:?} Hq {hq} Hkv {hkv} D {d} T {t} len {len}");
                let y = attn::cuda(&q, &k, &v, len, scale).unwrap();
                assert_eq!(y.shape(), vec![1, hq, t, d], "{case}");
                assert_eq!(y.dtype(), dtype, "{case}");
                let reference = attn::reference(&q, &k, &v, len, scale).unwrap();
                let (kv, vv) = (k.slice_axis(2, 0, len).unwrap(), v.slice_axis(2, 0, len).unwrap());
                let mlx_path = per_query_causal_attention(&q, &kv, &vv, scale).unwrap();
                let (e_ref, e_mlx, e_fb) = (rel(&y, &reference), rel(&mlx_path, &reference), rel(&y, &mlx_path));
                worst = (worst.0.max(e_ref), worst.1.max(e_mlx));
                assert!(e_ref <= tol, "{case}: {e_ref:.2e} from fp32 over {tol:.1e}");
                assert!(e_fb <= e_ref + e_mlx + tol, "{case}: {e_fb:.2e} from MLX's attention");
                for i in 0..t {
                    let alone =
                        attn::cuda(&q.slice_axis(2, i, i + 1).unwrap(), &k, &v, len - t + i + 1, scale).unwrap();
                    let row = y.slice_axis(2, i, i + 1).unwrap();
                    assert_eq!(row.to_bytes().unwrap(), alone.to_bytes().unwrap(), "{case}: query {i} differs alone");
                }
            }
        }
        println!(
            "attention parity {dtype:?}: kernel/fp32 {:.2e}, MLX/fp32 {:.2e} (worst; tolerance {tol:.1e}); \
             every query bit-identical to its one-query call",
            worst.0, worst.1
        );
    }
}

/// On CUDA: the kernel is selected exactly on tested machine classes (or with `TANDEM_KERNELS=on`), not
/// with `-attention`; its probe passes in each dtype; and through the model (tandem-tiny in bf16, head size
/// 64, where it runs at every attention layer) greedy MTP output equals plain greedy output at depths 1-3.
#[test]
fn attention_cuda_selected_and_lossless() {
    use tandem::kernels::{disabled, policy, Policy};
    if !cuda_or_skip("attention_cuda_selected_and_lossless") {
        return;
    }
    let cc = cuda_compute_capability();
    let tested = cc.is_some_and(|c| attn::TESTED_CLASSES.contains(&c));
    let on = (tested && policy() == Policy::Auto || policy() == Policy::On) && !disabled(attn::NAME);
    println!("compute capability {cc:?}, tested class {tested}, attention kernel on {on}");
    for dtype in [Dtype::BF16, Dtype::F16, Dtype::F32] {
        let err = attn::probe(dtype).unwrap();
        assert!(err <= attn::tolerance_for(dtype), "{dtype:?}: probe error {err:.2e}");
        let [q, k, v] = attn::random_inputs(6, 2, 2, 128, 64, dtype, 4).unwrap();
        assert_eq!(attn::selected(&q, &k, &v, 40), on, "{dtype:?}");
    }
    crate::common::tiny_mtp_matches_plain(Dtype::BF16, true);
}

/// On any machine with a C++ compiler: the CUDA source itself, run by a CPU emulation
/// (tests/it/emulate/attention.cpp: a thread per CUDA thread, barriers for `__syncthreads` and warp
/// shuffles), against a double-precision reference, and each query of a 5-query call bit-identical to
/// its one-query call, over one chunk, a chunk edge and three chunks. CI has no GPU: this is what checks
/// the kernel's indexing and masking there.
#[test]
fn attention_source_emulated_on_cpu() {
    let defines = [("ATTENTION_CUH", "attention.cuh"), ("ATTENTION_PARTIAL", "attention_partial.cu")];
    if let Some(out) = crate::common::run_emulation("attention", &defines) {
        assert_eq!(out.matches("every query identical alone").count(), 4, "{out}");
    }
}

/// The host kernel's rule: one sequence's queries over its cache buffers in one float dtype, Hq a multiple of
/// Hkv, any number of queries up to the valid keys (prefill chunks too), any head size; selected on MLX's CPU
/// unless `-cpu_attention`.
#[test]
fn attention_host_selection_rules() {
    use tandem::kernels::{disabled, policy, Policy};
    let [q, k, v] = attn::random_inputs(6, 2, 4, 80, 64, Dtype::BF16, 2).unwrap();
    assert!(attn::host_applicable(&q, &k, &v, 40), "head size 80");
    assert!(attn::host_applicable(&q, &k, &v, 4) && !attn::host_applicable(&q, &k, &v, 3), "T <= len");
    assert!(!attn::host_applicable(&q, &k, &v, 65), "more keys than the buffers hold");
    assert!(!attn::host_applicable(&q, &k.as_dtype(Dtype::F32).unwrap(), &v, 40), "buffers of another dtype");
    let [q40, ..] = attn::random_inputs(6, 2, 40, 80, 64, Dtype::BF16, 2).unwrap();
    assert!(attn::host_applicable(&q40, &k, &v, 64), "a 40-query prefill chunk");
    let [q5, ..] = attn::random_inputs(5, 2, 4, 80, 64, Dtype::BF16, 2).unwrap();
    assert!(!attn::host_applicable(&q5, &k, &v, 40), "query heads not a multiple of key heads");
    let two = mlx::concatenate(&[&q, &q], 0).unwrap();
    assert!(!attn::host_applicable(&two, &k, &v, 40), "two sequences in one call");
    if mlx::device::default_device() == mlx::device::Device::Cpu {
        let on = policy() != Policy::Off && !disabled(attn::HOST_NAME);
        assert_eq!(attn::host_selected(&q, &k, &v, 40), on);
    }
}

/// On the CPU: the host kernel within its tolerance of the fp32 reference and of MLX's attention (the path
/// it replaces) for bf16, f16 and f32, head sizes 64, 128 and 256, GQA 6:1 and 1:1, decode, verify and
/// prefill widths and key lengths from 1 to 2,100; each query's bits those of a one-query call over its own
/// prefix; its probe passes.
#[test]
fn attention_host_parity() {
    if mlx::device::default_device() != mlx::device::Device::Cpu {
        println!("attention_host_parity: SKIPPED: MLX computes on the GPU here");
        return;
    }
    for dtype in [Dtype::BF16, Dtype::F16, Dtype::F32] {
        let tol = attn::tolerance_for(dtype);
        let err = attn::host_probe(dtype).unwrap();
        assert!(err <= tol, "{dtype:?}: probe error {err:.2e}");
        let mut worst = (0.0f32, 0.0f32);
        for (hq, hkv, d) in [(12, 2, 64), (8, 8, 128), (6, 1, 256)] {
            for (t, len) in [(1, 1), (1, 65), (4, 4), (4, 67), (3, 2100), (33, 40)] {
                let [q, k, v] = attn::random_inputs(hq, hkv, t, d, len + 24, dtype, (t * 1000 + len) as u64).unwrap();
                let scale = 1.0 / (d as f32).sqrt();
                let case = format!("{dtype:?} Hq {hq} Hkv {hkv} D {d} T {t} len {len}");
                let y = attn::host(&q, &k, &v, len, scale).unwrap();
                assert_eq!((y.shape(), y.dtype()), (vec![1, hq, t, d], dtype), "{case}");
                let reference = attn::reference(&q, &k, &v, len, scale).unwrap();
                let (kv, vv) = (k.slice_axis(2, 0, len).unwrap(), v.slice_axis(2, 0, len).unwrap());
                let mlx_path = causal_attention(&q, &kv, &vv, scale).unwrap();
                let (e_ref, e_mlx, e_fb) = (rel(&y, &reference), rel(&mlx_path, &reference), rel(&y, &mlx_path));
                worst = (worst.0.max(e_ref), worst.1.max(e_mlx));
                assert!(e_ref <= tol, "{case}: {e_ref:.2e} from fp32 over {tol:.1e}");
                assert!(e_fb <= e_ref + e_mlx + tol, "{case}: {e_fb:.2e} from MLX's attention");
                for i in [0, t - 1] {
                    let alone =
                        attn::host(&q.slice_axis(2, i, i + 1).unwrap(), &k, &v, len - t + i + 1, scale).unwrap();
                    let row = y.slice_axis(2, i, i + 1).unwrap();
                    assert_eq!(row.to_bytes().unwrap(), alone.to_bytes().unwrap(), "{case}: query {i} differs alone");
                }
            }
        }
        println!("attention host parity {dtype:?}: kernel/fp32 {:.2e}, MLX/fp32 {:.2e} (worst)", worst.0, worst.1);
    }
}
