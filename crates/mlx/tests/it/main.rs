//! crates/mlx's integration tests in one binary (MLX linked once): ops against hand-computed values
//! and error paths, and parity with Python MLX.

mod compile;
mod distributed;
mod host;
mod kernel;
mod ops;
mod reference;
