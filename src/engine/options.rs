//! A model's settings (models.toml) and a caller's overrides turned into the options of one
//! generation: the one place this happens, for the engine's requests and the CLI's chat alike.

use crate::generate::{GenerateOptions, MtpOptions, SamplingParams};
use crate::registry::{ModelEntry, MtpSettings};

use super::{EngineError, Result};

/// Per-request sampling: what is `None` comes from the model's settings in models.toml.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SamplingOverrides {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<usize>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
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
        seed: o.seed,
        ..SamplingParams::default()
    };
    sampling.validate().map_err(EngineError::InvalidRequest)?;
    let mtp = MtpOptions {
        enabled: overrides.mtp.enabled.unwrap_or(entry.mtp.enabled),
        depth: overrides.mtp.depth.unwrap_or(entry.mtp.depth as usize),
        // A seed pins the output: the adaptive controller picks depths from wall-clock costs, and with
        // sampling the depth decides which random draws a token uses, so a seeded sampled generation
        // runs at a fixed depth.
        adaptive: overrides.mtp.adaptive.unwrap_or(entry.mtp.adaptive)
            && !(sampling.seed.is_some() && sampling.temperature > 0.0),
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
mod tests {
    use super::*;
    use crate::registry::{ModelSource, SamplingSettings};

    fn entry() -> ModelEntry {
        ModelEntry {
            name: "m".into(),
            path: "m".into(),
            source: ModelSource::Path,
            mtp: MtpSettings { enabled: true, depth: 3, adaptive: true },
            sampling: SamplingSettings { temperature: 0.5, max_tokens: 100, ..SamplingSettings::default() },
        }
    }

    #[test]
    fn settings_then_overrides() {
        let o = generate_options(&entry(), &Overrides::default(), 10, None, vec![7]).unwrap();
        assert_eq!((o.sampling.temperature, o.max_tokens, o.mtp.enabled, o.mtp.depth), (0.5, 100, true, 3));
        assert_eq!(o.stop_ids, vec![7]);
        let overrides = Overrides {
            sampling: SamplingOverrides { temperature: Some(0.0), seed: Some(4), ..Default::default() },
            mtp: MtpOverrides { enabled: Some(false), depth: Some(99), adaptive: None },
            max_tokens: Some(5),
        };
        let o = generate_options(&entry(), &overrides, 10, Some(20), vec![]).unwrap();
        assert_eq!((o.sampling.temperature, o.sampling.seed, o.max_tokens, o.mtp.enabled), (0.0, Some(4), 5, false));
    }

    #[test]
    fn out_of_range_values_are_refused_by_name() {
        let depth = |d| Overrides { mtp: MtpOverrides { depth: Some(d), ..Default::default() }, ..Default::default() };
        for bad in [0, 9, usize::MAX] {
            let e = generate_options(&entry(), &depth(bad), 1, None, vec![]).unwrap_err().to_string();
            assert!(e.contains("mtp.depth = ") && e.contains("must be in 1..=8"), "{e}");
        }
        let e = generate_options(&entry(), &Overrides { max_tokens: Some(0), ..Default::default() }, 1, None, vec![]);
        assert!(matches!(e, Err(EngineError::InvalidRequest(_))));
    }

    #[test]
    fn a_seeded_sampled_generation_runs_at_a_fixed_depth() {
        let sampled = |seed| Overrides {
            sampling: SamplingOverrides { temperature: Some(0.8), seed, ..Default::default() },
            ..Default::default()
        };
        let o = generate_options(&entry(), &sampled(Some(7)), 1, None, vec![]).unwrap();
        assert!(o.mtp.enabled && !o.mtp.adaptive, "{:?}", o.mtp);
        let o = generate_options(&entry(), &sampled(None), 1, None, vec![]).unwrap();
        assert!(o.mtp.adaptive, "unseeded sampling keeps the model's setting");
    }

    #[test]
    fn the_context_bounds_max_tokens() {
        let o = generate_options(&entry(), &Overrides::default(), 90, Some(120), vec![]).unwrap();
        assert_eq!(o.max_tokens, 30, "the default, shortened to fit");
        let asked = Overrides { max_tokens: Some(31), ..Default::default() };
        let e = generate_options(&entry(), &asked, 90, Some(120), vec![]).unwrap_err();
        assert!(matches!(e, EngineError::ContextLength { max_tokens: 31, context: 120, prompt: 90, .. }), "{e}");
        let e = generate_options(&entry(), &Overrides::default(), 120, Some(120), vec![]).unwrap_err();
        assert!(matches!(e, EngineError::ContextLength { max_tokens: 1, .. }), "{e}");
        // Numbers that would wrap a sum are refused, not let through.
        for huge in [usize::MAX, usize::MAX - 89, usize::MAX / 2 + 1] {
            let asked = Overrides { max_tokens: Some(huge), ..Default::default() };
            let e = generate_options(&entry(), &asked, 90, Some(120), vec![]).unwrap_err();
            assert!(matches!(e, EngineError::ContextLength { .. }), "{huge}: {e}");
        }
    }
}
