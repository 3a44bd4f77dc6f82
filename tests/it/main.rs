//! All integration tests in one binary: MLX is linked once, and one process runs every module.

mod cli;
mod common;
mod constrained;
mod convert;
mod engine_load;
mod family;
mod forward_reference;
mod fuzz;
mod hostile_folders;
mod hub;
mod inspect;
mod kernels;
mod load_errors;
mod load_layouts;
mod mtp_decode;
mod mtp_probe;
mod mtp_regression;
mod prefix_cache;
mod relocate;
mod server_api;
mod server_conversations;
mod server_images;
mod server_limits;
mod tiny_reference;
mod vision;
mod wire_types;
