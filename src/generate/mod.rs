//! Generation, in layers: options; prefill and the plain step; a [`Decoder`] (plain or MTP
//! speculative) stepped by the decode loop; the sampler; statistics.

pub mod batch;
pub mod constraint;
pub mod decode;
pub mod decoder;
pub mod error;
pub mod mtp;
pub mod options;
pub mod prefill;
pub mod sampler;
pub mod sequence;
pub mod stats;
pub mod step;

pub use constraint::{Constraint, GrammarSpec, Grammars};
pub use decode::{
    generate, generate_prompt, generate_resumed, Control, FinishReason, Kept, Output, Progress, Prompt, Resume,
};
pub use decoder::Decoder;
pub use error::GenerateError;
pub use mtp::oracle::Oracle;
pub use options::{CycleAhead, GenerateOptions, MtpOptions, MTP_DEPTHS, MTP_DEPTHS_TEXT};
pub use prefill::{prefill, prefill_images};
pub use sampler::{Sampler, SamplingParams, TokenLogprob};
pub use sequence::{Sequence, Starting};
pub use stats::{SpecStats, Stats};
