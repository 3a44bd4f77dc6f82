//! Tandem's engine: loads Qwen3.5-family models, converts and quantizes them, and decodes with
//! MTP speculative decoding, computing with MLX.

pub mod atomic_file;
pub mod cache;
pub mod chat;
pub mod engine;
pub mod generate;
pub mod hub;
pub mod kernels;
pub mod model;
pub mod quant;
pub mod registry;
pub mod server;
pub(crate) mod sync;
