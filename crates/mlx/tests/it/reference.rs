//! Parity with Python MLX (the same version, from the test venv): `quantize` must give packed
//! weights, scales and biases bit-identical to `mx.quantize` for every bits and group size.

use std::path::PathBuf;
use std::process::Command;

use mlx::{Array, Dtype, QuantMode};

fn python() -> PathBuf {
    let p = std::env::var_os("TANDEM_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/python"));
    assert!(p.exists(), "reference Python not found at {} (run `make setup`)", p.display());
    p
}

fn to_array(view: &safetensors::tensor::TensorView<'_>) -> Array {
    let dtype = Dtype::from_safetensors_name(&format!("{:?}", view.dtype())).expect("dtype");
    let shape: Vec<i32> = view.shape().iter().map(|&d| d as i32).collect();
    Array::from_bytes(view.data(), &shape, dtype).unwrap()
}

#[test]
fn quantize_is_bit_identical_to_python_mlx() {
    let dir = std::env::temp_dir().join(format!("mlx-quant-ref-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("cases.safetensors");
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/reference/quantize_cases.py");
    let out = Command::new(python()).arg(&script).arg(&file).output().expect("run python");
    assert!(out.status.success(), "reference script failed: {}", String::from_utf8_lossy(&out.stderr));

    let bytes = std::fs::read(&file).unwrap();
    let (_, header) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let cases = header.metadata().clone().expect("metadata");
    assert!(cases.len() >= 100, "expected the full matrix of cases, got {}", cases.len());
    let mut seen_bits = std::collections::BTreeSet::new();
    for (key, params) in &cases {
        let (bits, group) = params.split_once(',').unwrap();
        let (bits, group): (i32, i32) = (bits.parse().unwrap(), group.parse().unwrap());
        seen_bits.insert((bits, group));
        let w = to_array(&st.tensor(&format!("{key}.w")).unwrap());
        let q = mlx::quantized::quantize(&w, group, bits, QuantMode::Affine).unwrap();
        for (name, got) in [("q", &q.weight), ("scales", &q.scales), ("biases", q.biases.as_ref().unwrap())] {
            let want = st.tensor(&format!("{key}.{name}")).unwrap();
            let want_shape: Vec<i32> = want.shape().iter().map(|&d| d as i32).collect();
            assert_eq!(got.shape(), want_shape, "{key}.{name} shape (bits {bits}, group {group}, {})", w.dtype());
            assert_eq!(
                got.to_bytes().unwrap(),
                want.data(),
                "{key}.{name} differs (bits {bits}, group {group}, {})",
                w.dtype()
            );
        }
    }
    assert_eq!(seen_bits.len(), 6 * 3, "every bits x group combination is covered");
    std::fs::remove_dir_all(&dir).ok();
}
