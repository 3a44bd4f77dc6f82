//! Times the host dense matmul (kernels/cpu/) against MLX's matmul on the CPU, per dtype and shape:
//! `cargo run -p mlx --release --example host_matmul` (figures in kernels/README.md).

use mlx::{host, random, Array, Dtype};

fn main() -> mlx::Result<()> {
    let shapes = [(1, 4096, 256), (4, 4096, 256), (8, 4096, 256), (32, 4096, 256), (128, 1024, 256), (1, 5120, 5120)];
    for dtype in [Dtype::BF16, Dtype::F32, Dtype::F16] {
        for &(m, n, k) in &shapes {
            let keys = random::split(&random::key(1)?, 2)?;
            let x = random::normal(&[m, k], Dtype::F32, &keys[0])?.as_dtype(dtype)?;
            let w = random::normal(&[n, k], Dtype::F32, &keys[1])?.multiply(&Array::f32(0.05))?.as_dtype(dtype)?;
            mlx::device::eval(&[&x, &w])?;
            let time = |f: &dyn Fn() -> mlx::Result<Array>| -> mlx::Result<f64> {
                for _ in 0..3 {
                    f()?.eval()?;
                }
                let start = std::time::Instant::now();
                for _ in 0..20 {
                    f()?.eval()?;
                }
                Ok(start.elapsed().as_secs_f64() / 20.0 * 1e6)
            };
            let ours = time(&|| host::dense_matmul(&x, &w))?;
            let mlx = time(&|| x.matmul(&w.t()?))?;
            println!("{dtype:?} M {m} N {n} K {k}: host kernel {ours:.0} us, MLX {mlx:.0} us ({:.1}x)", mlx / ours);
        }
    }
    Ok(())
}
