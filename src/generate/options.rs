//! What a generation is asked to do, and the checks of a request against the model.

use super::constraint::Constraint;
use super::error::{GenerateError, Result};
use super::mtp::oracle::Oracle;
use super::sampler::SamplingParams;
use crate::model::Qwen35;

/// Valid MTP draft depths: the one definition (models.toml, the CLI and requests check against it).
pub const MTP_DEPTHS: std::ops::RangeInclusive<usize> = 1..=8;
/// [`MTP_DEPTHS`] as messages write it.
pub const MTP_DEPTHS_TEXT: &str = "1..=8";

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct MtpOptions {
    pub enabled: bool,
    /// Drafts per cycle, within [`MTP_DEPTHS`].
    pub depth: usize,
    /// Park at depth 0 when drafting does not pay.
    pub adaptive: bool,
    /// Verify drafts one token at a time, so that verify logits are bit-identical to plain decoding.
    pub exact_verify: bool,
    /// Whether to build the next cycle while a verify runs, on the guess that all its drafts are kept
    /// (greedy decoding alone; the same tokens either way).
    #[serde(default = "CycleAhead::from_env")]
    pub cycle_ahead: CycleAhead,
}

/// Building the next MTP cycle while a verify runs (docs/MODEL.md §4.9): it can pay where the device
/// idles while the host builds a graph, and costs where the device is the bottleneck (a CPU) or drafts
/// are often rejected. Off by default: on the machines measured so far it lost (docs/PERF.md, session 19).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CycleAhead {
    Off,
    /// Tried both ways in turn; the faster per token kept for a while, then tried again.
    Judged,
    Always,
}

impl CycleAhead {
    /// `TANDEM_CYCLE_AHEAD` = `judged` | `always` | `off` (benchmarks' A/B); off when unset.
    pub fn from_env() -> CycleAhead {
        match std::env::var("TANDEM_CYCLE_AHEAD").as_deref() {
            Ok("judged") => CycleAhead::Judged,
            Ok("always") => CycleAhead::Always,
            _ => CycleAhead::Off,
        }
    }
}

impl Default for MtpOptions {
    fn default() -> Self {
        MtpOptions { enabled: true, depth: 3, adaptive: true, exact_verify: false, cycle_ahead: CycleAhead::from_env() }
    }
}

#[derive(Debug, Clone)]
pub struct GenerateOptions {
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub stop_ids: Vec<u32>,
    pub mtp: MtpOptions,
    /// Prompt tokens per prefill forward.
    pub prefill_chunk: usize,
    /// Benchmarks only: draft from a known continuation instead of the head's guesses (`tandem
    /// bench --oracle-acceptance`).
    pub oracle: Option<Oracle>,
    /// What the output must match (a compiled grammar), if anything.
    pub constraint: Option<Constraint>,
    /// Record each token's log-probability and this many alternatives.
    pub logprobs: Option<usize>,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions {
            max_tokens: 256,
            sampling: SamplingParams::default(),
            stop_ids: vec![],
            mtp: MtpOptions::default(),
            prefill_chunk: 512,
            oracle: None,
            constraint: None,
            logprobs: None,
        }
    }
}

impl GenerateOptions {
    /// Whether decoding runs MTP: asked for, the model has a head, and more than one token wanted.
    pub fn runs_mtp(&self, model: &Qwen35) -> bool {
        self.mtp.enabled && model.has_mtp() && self.max_tokens > 1
    }

    /// Checks the prompt and these options against `model` before anything is computed.
    pub fn check(&self, model: &Qwen35, prompt: &[u32]) -> Result<()> {
        if prompt.is_empty() {
            return Err(GenerateError::EmptyPrompt);
        }
        let vocab = model.config.text.vocab_size;
        if let Some(&id) = prompt.iter().find(|&&id| id as i64 >= vocab as i64) {
            return Err(GenerateError::BadToken { id, vocab });
        }
        if let Some(context) = model.config.text.max_position_embeddings {
            let context = context as usize;
            // Compared without adding, so a huge `max_tokens` cannot wrap past the check.
            if self.max_tokens > context.saturating_sub(prompt.len()) {
                return Err(GenerateError::ContextExceeded {
                    prompt: prompt.len(),
                    max_tokens: self.max_tokens,
                    context,
                });
            }
        }
        self.sampling.validate().map_err(GenerateError::Sampling)?;
        if self.mtp.enabled && !MTP_DEPTHS.contains(&self.mtp.depth) {
            return Err(GenerateError::Depth(self.mtp.depth));
        }
        if let Some(o) = &self.oracle {
            if !(0.0..=1.0).contains(&o.acceptance) {
                return Err(GenerateError::Oracle(format!("acceptance {} is outside 0..=1", o.acceptance)));
            }
            if !self.sampling.is_greedy() {
                return Err(GenerateError::Oracle("oracle drafts need greedy sampling (temperature 0)".into()));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_depth_range_reads_as_it_is() {
        assert_eq!(MTP_DEPTHS_TEXT, format!("{}..={}", MTP_DEPTHS.start(), MTP_DEPTHS.end()));
    }
}
