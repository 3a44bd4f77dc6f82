//! Times the host kernels (kernels/cpu/) against MLX's ops on the CPU, per dtype and shape:
//! `cargo run -p mlx --release --example host_matmul` (figures in kernels/README.md). The quantized matmul is
//! timed against MLX's op as called (bf16 x) and in fp32 (x, scales and biases cast: Tandem's path before the
//! kernel).

use mlx::quantized::{quantize, quantized_matmul};
use mlx::{host, random, Array, Dtype, QuantMode};

/// Microseconds a call, evaluated, after three warm-up calls.
fn time(f: &dyn Fn() -> mlx::Result<Array>) -> mlx::Result<f64> {
    for _ in 0..3 {
        f()?.eval()?;
    }
    let start = std::time::Instant::now();
    for _ in 0..20 {
        f()?.eval()?;
    }
    Ok(start.elapsed().as_secs_f64() / 20.0 * 1e6)
}

fn operands(m: i32, n: i32, k: i32, dtype: Dtype) -> mlx::Result<(Array, Array)> {
    let keys = random::split(&random::key(1)?, 2)?;
    let x = random::normal(&[m, k], Dtype::F32, &keys[0])?.as_dtype(dtype)?;
    let w = random::normal(&[n, k], Dtype::F32, &keys[1])?.multiply(&Array::f32(0.05))?.as_dtype(dtype)?;
    mlx::device::eval(&[&x, &w])?;
    Ok((x, w))
}

fn main() -> mlx::Result<()> {
    let shapes = [(1, 4096, 256), (4, 4096, 256), (8, 4096, 256), (32, 4096, 256), (128, 1024, 256), (1, 5120, 5120)];
    let only = std::env::args().nth(1);
    if only.as_deref() != Some("quantized") {
        for dtype in [Dtype::BF16, Dtype::F32, Dtype::F16] {
            for &(m, n, k) in &shapes {
                let (x, w) = operands(m, n, k, dtype)?;
                let ours = time(&|| host::dense_matmul(&x, &w))?;
                let mlx = time(&|| x.matmul(&w.t()?))?;
                println!("{dtype:?} M {m} N {n} K {k}: host kernel {ours:.0} us, MLX {mlx:.0} us ({:.1}x)", mlx / ours);
            }
        }
    }
    for bits in [4, 8, 2] {
        for &(m, n, k) in &shapes {
            let (x, w) = operands(m, n, k, Dtype::BF16)?;
            let q = quantize(&w, 64, bits, QuantMode::Affine)?;
            let b = q.biases.clone().expect("affine biases");
            let ours = time(&|| host::quantized_matmul(&x, &q.weight, &q.scales, &b, 64, bits))?;
            let mlx = time(&|| q.matmul(&x, true))?;
            let f32 = |a: &Array| a.as_dtype(Dtype::F32);
            let fp32 = time(&|| {
                let y =
                    quantized_matmul(&f32(&x)?, &q.weight, &f32(&q.scales)?, Some(&f32(&b)?), true, 64, bits, q.mode)?;
                y.as_dtype(Dtype::BF16)
            })?;
            println!(
                "{bits}-bit bf16 M {m} N {n} K {k}: host kernel {ours:.0} us, MLX in fp32 {fp32:.0} us ({:.1}x), MLX in bf16 {mlx:.0} us ({:.1}x)",
                fp32 / ours,
                mlx / ours
            );
        }
    }
    Ok(())
}
