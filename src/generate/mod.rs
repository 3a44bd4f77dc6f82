//! Generation: the sampler, the decode loop (plain and MTP speculative), and statistics.

pub mod decode;
pub mod mtp;
pub mod sampler;
pub mod stats;

pub use decode::{
    generate, generate_prompt, Control, FinishReason, GenerateError, GenerateOptions, MtpOptions, Output, Progress,
    Prompt,
};
pub use sampler::{Sampler, SamplingParams};
pub use stats::{SpecStats, Stats};
