use super::*;
use crate::registry::{ModelSource, SamplingSettings};

fn entry() -> ModelEntry {
    ModelEntry {
        name: "m".into(),
        path: "m".into(),
        source: ModelSource::Path,
        mtp: MtpSettings { enabled: true, depth: 3, adaptive: true },
        sampling: SamplingSettings { temperature: 0.5, max_tokens: 100, ..SamplingSettings::default() },
        prefix_cache_bytes: None,
        batch: Default::default(),
        prefix_cache_disk: None,
        system_prompt: None,
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
