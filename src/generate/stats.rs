//! The statistics of one generation: one JSON shape for the CLI (`--json`), HTTP and the UI
//! (docs/ARCHITECTURE.md §4.3).

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, ts_rs::TS)]
pub struct Stats {
    pub prompt_tokens: usize,
    /// Prompt tokens restored from the prefix cache instead of prefilled (part of `prompt_tokens`).
    #[serde(default)]
    pub cached_tokens: usize,
    pub completion_tokens: usize,
    pub ttft_ms: f64,
    pub prefill_tok_s: f64,
    pub decode_tok_s: f64,
    pub spec: Option<SpecStats>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, ts_rs::TS)]
pub struct DepthStats {
    pub depth: usize,
    pub drafted: usize,
    pub accepted: usize,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, ts_rs::TS)]
pub struct PhaseMs {
    pub draft: f64,
    pub verify: f64,
    pub sample: f64,
    pub rollback: f64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, ts_rs::TS)]
pub struct SpecStats {
    pub method: String,
    pub depth: usize,
    pub cycles: usize,
    pub drafted: usize,
    pub accepted: usize,
    pub acceptance: f64,
    pub tok_per_cycle: f64,
    pub by_depth: Vec<DepthStats>,
    /// `accepted_hist[i]`: cycles that accepted exactly `i` drafts.
    pub accepted_hist: Vec<usize>,
    pub parked_cycles: usize,
    pub ms: PhaseMs,
    /// Why MTP is not running (None while it runs).
    pub fallback: Option<String>,
}

impl SpecStats {
    pub fn new(depth: usize) -> SpecStats {
        SpecStats {
            method: "mtp".into(),
            depth,
            by_depth: (1..=depth).map(|d| DepthStats { depth: d, ..Default::default() }).collect(),
            accepted_hist: vec![0; depth + 1],
            ..Default::default()
        }
    }

    /// A stats block for a run where MTP was asked for but could not run.
    pub fn fallback(depth: usize, why: impl Into<String>) -> SpecStats {
        SpecStats { fallback: Some(why.into()), ..SpecStats::new(depth) }
    }

    /// Records one cycle that drafted `drafted` tokens and accepted the first `accepted` of them.
    pub fn record_cycle(&mut self, drafted: usize, accepted: usize) {
        self.cycles += 1;
        self.drafted += drafted;
        self.accepted += accepted;
        for d in 0..drafted {
            if let Some(slot) = self.by_depth.get_mut(d) {
                slot.drafted += 1;
                if d < accepted {
                    slot.accepted += 1;
                }
            }
        }
        if let Some(h) = self.accepted_hist.get_mut(accepted) {
            *h += 1;
        }
        // Kept current after every cycle: streamed snapshots are read mid-generation. A cycle emits
        // its accepted drafts and one more token.
        self.acceptance = if self.drafted > 0 { self.accepted as f64 / self.drafted as f64 } else { 0.0 };
        self.tok_per_cycle = (self.accepted + self.cycles) as f64 / self.cycles as f64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The derived figures are right after every cycle, not only at the end (streamed interim stats
    /// used to say 0.0 while `accepted` and `drafted` were not).
    #[test]
    fn acceptance_and_tokens_per_cycle_hold_after_each_cycle() {
        let mut s = SpecStats::new(3);
        s.record_cycle(3, 2);
        assert_eq!((s.acceptance, s.tok_per_cycle), (2.0 / 3.0, 3.0));
        s.record_cycle(3, 0);
        assert_eq!((s.acceptance, s.tok_per_cycle), (2.0 / 6.0, 2.0));
        s.record_cycle(1, 1);
        assert_eq!((s.acceptance, s.tok_per_cycle, s.accepted_hist.clone()), (3.0 / 7.0, 6.0 / 3.0, vec![1, 1, 1, 0]));
    }
}
