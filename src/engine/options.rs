//! A model's settings (models.toml) and a caller's overrides turned into the options of one
//! generation: the one place this happens, for the engine's requests and the CLI's chat alike.

use crate::generate::{GenerateOptions, MtpOptions, SamplingParams};
use crate::registry::{ModelEntry, MtpSettings, SamplingSettings};

use super::{EngineError, Result};

/// Per-request sampling: what is `None` comes from the model's settings in models.toml.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SamplingOverrides {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<usize>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub seed: Option<u64>,
}

/// Per-request MTP: what is `None` comes from the model's settings in models.toml.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MtpOverrides {
    pub enabled: Option<bool>,
    pub depth: Option<usize>,
    /// Whether the adaptive controller may park drafting (`mtp.adaptive`).
    pub adaptive: Option<bool>,
}

/// What a caller asks of one generation beyond the prompt.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Overrides {
    pub sampling: SamplingOverrides,
    pub mtp: MtpOverrides,
    /// None: the model's `max_tokens` setting, shortened to fit the context.
    pub max_tokens: Option<usize>,
}

/// The generation options in force: the model's settings, then the overrides; checked. `context`
/// is the model's context length when known: a prompt plus `max_tokens` beyond it is refused, and
/// the default `max_tokens` is shortened to fit. `stop_ids` end the generation (none: to the end).
pub fn generate_options(
    entry: &ModelEntry,
    overrides: &Overrides,
    prompt_len: usize,
    context: Option<usize>,
    stop_ids: Vec<u32>,
) -> Result<GenerateOptions> {
    let s = &entry.sampling;
    let o = &overrides.sampling;
    let sampling = SamplingParams {
        temperature: o.temperature.unwrap_or(s.temperature),
        top_p: o.top_p.unwrap_or(s.top_p),
        top_k: o.top_k.unwrap_or(s.top_k as usize),
        min_p: o.min_p.unwrap_or(s.min_p),
        repetition_penalty: o.repetition_penalty.unwrap_or(s.repetition_penalty),
        presence_penalty: o.presence_penalty.unwrap_or(0.0),
        frequency_penalty: o.frequency_penalty.unwrap_or(0.0),
        seed: o.seed,
        ..SamplingParams::default()
    };
    // A request's values stay in the ranges of models.toml's settings.
    let merged = SamplingSettings {
        temperature: sampling.temperature,
        top_p: sampling.top_p,
        min_p: sampling.min_p,
        repetition_penalty: sampling.repetition_penalty,
        ..*s
    };
    merged.check().map_err(|e| EngineError::InvalidRequest(e.to_string()))?;
    sampling.validate().map_err(EngineError::InvalidRequest)?;
    let mtp = MtpOptions {
        enabled: overrides.mtp.enabled.unwrap_or(entry.mtp.enabled),
        depth: overrides.mtp.depth.unwrap_or(entry.mtp.depth as usize),
        adaptive: overrides.mtp.adaptive.unwrap_or(entry.mtp.adaptive),
        ..MtpOptions::default()
    };
    if mtp.enabled {
        MtpSettings::check_depth(u32::try_from(mtp.depth).unwrap_or(u32::MAX))
            .map_err(|e| EngineError::InvalidRequest(e.to_string()))?;
    }
    let too_long = |max_tokens| EngineError::ContextLength {
        model: entry.name.clone(),
        prompt: prompt_len,
        max_tokens,
        context: context.unwrap_or(0),
    };
    let max_tokens = match (overrides.max_tokens, context) {
        (Some(0), _) => return Err(EngineError::InvalidRequest("max_tokens must be at least 1".into())),
        // Compared without adding: a client's `max_tokens` near usize::MAX must not wrap past the check.
        (Some(n), Some(context)) if n > context.saturating_sub(prompt_len) => return Err(too_long(n)),
        (Some(n), _) => n,
        (None, Some(context)) if prompt_len >= context => return Err(too_long(1)),
        // The model's default shortened to what fits.
        (None, Some(context)) => (s.max_tokens as usize).min(context - prompt_len),
        (None, None) => s.max_tokens as usize,
    };
    Ok(GenerateOptions { max_tokens, sampling, stop_ids, mtp, ..Default::default() })
}

#[cfg(test)]
mod tests;
