//! The MTP head of a checkpoint: is it complete, and which convention do its seven norms follow?
//!
//! The decision is the loader's own (`model::mtp_head::convention`): a head written with its body follows
//! its names; a re-attached head's names are checked against the statistics, for the head as a
//! whole; a head shifted twice (`2 + w`) fits neither convention and does not run.

use serde::Serialize;

use super::source::Source;
use super::ConvertError;
use crate::model::mtp_head::convention::NormStat;
use crate::model::mtp_head::probe::ProbeReport;
use crate::model::mtp_head::{self, HeadFiles};
use crate::model::store::Provenance;
use crate::model::Layout;
use crate::model::{self, LoadOptions};

pub use crate::model::mtp_head::convention::Stored;

/// One MTP norm as found.
#[derive(Debug, Clone, Serialize)]
pub struct HeadNorm {
    /// Canonical name (`mtp.norm.weight`).
    pub name: String,
    /// Key in the file.
    pub key: String,
    pub mean: f32,
    /// What the key's provenance declares.
    pub declared: Stored,
    /// What the values are, after the statistics check (and the probe, see [`probe`]).
    pub stored: Stored,
    /// What this norm's statistics say alone.
    #[serde(skip)]
    pub vote: Stored,
}

/// The verdict `inspect` reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Complete, with names and values that agree with each other and with the body.
    Ok,
    /// No complete head (or none declared).
    Missing,
    /// Complete, but names and values (or head and body) disagree in a way Tandem's loader fixes at
    /// load time; `repair` writes a consistent copy.
    Repaired,
    /// The head cannot run as stored (shifted twice): the loader turns MTP off; `repair` fixes it.
    Inconsistent,
}

#[derive(Debug, Clone, Serialize)]
pub struct HeadAnalysis {
    pub declared_layers: usize,
    /// How many of the 15 logical head tensors are present.
    pub tensors_found: usize,
    pub complete: bool,
    pub norms: Vec<HeadNorm>,
    /// The provenance of the head's names (None without a head).
    pub head_provenance: Option<Provenance>,
    pub verdict: Verdict,
    pub message: String,
    /// What the load-time probe measured (set by [`probe`]).
    pub probe: Option<ProbeReport>,
}

impl HeadAnalysis {
    /// Whether writing the head consistently needs more than following its names (statistics
    /// overrule the names: a mislabelled or twice-shifted head).
    pub fn needs_repair(&self) -> bool {
        self.norms.iter().any(|n| n.stored != n.declared)
    }

    pub fn stored(&self, name: &str) -> Option<Stored> {
        self.norms.iter().find(|n| n.name == name).map(|n| n.stored)
    }
}

pub fn analyse(src: &Source) -> Result<HeadAnalysis, ConvertError> {
    let present = src.tensors.iter().filter(|t| crate::model::qwen3_5::is_mtp(&t.name)).count();
    let files = HeadFiles::judge(&src.model.text, &|n| src.has(n), present);
    let head_provenance = src.get("mtp.fc.weight").or_else(|| src.get("mtp.norm.weight")).map(|t| t.provenance);
    let mut a = HeadAnalysis {
        declared_layers: files.declared_layers,
        tensors_found: files.tensors_found,
        complete: files.complete(),
        norms: Vec::new(),
        head_provenance,
        verdict: Verdict::Missing,
        message: files.reason.clone().unwrap_or_default(),
        probe: None,
    };
    if !files.complete() {
        return Ok(a);
    }
    let stat = |name: &str| -> Result<NormStat, ConvertError> {
        let t = src.get(name).ok_or_else(|| ConvertError::Source {
            path: src.dir.clone(),
            message: format!("missing tensor `{name}`"),
        })?;
        Ok(NormStat {
            name: name.to_string(),
            key: t.key.clone(),
            file: t.file().to_path_buf(),
            provenance: t.provenance,
            mean: src.mean(name)?,
        })
    };
    let entries = src.tensors.iter().map(|t| (t.name.as_str(), t.provenance, t.tensor.file.as_ref()));
    let decision = mtp_head::norm_decision(src.layout, entries, &stat)?;
    a.norms = decision
        .norms
        .iter()
        .map(|n| HeadNorm {
            name: n.stat.name.clone(),
            key: n.stat.key.clone(),
            mean: n.stat.mean,
            declared: n.declared,
            stored: n.stored,
            vote: n.vote,
        })
        .collect();

    let body_layout = src.layout;
    let mislabelled: Vec<&str> = a
        .norms
        .iter()
        .filter(|n| n.stored != n.declared && n.stored != Stored::ShiftedTwice)
        .map(|n| n.key.as_str())
        .collect();
    let grafted = match (head_provenance, body_layout) {
        (Some(Provenance::Hf), Layout::Mlx) => {
            Some("a raw (zero-centred) head under top-level `mtp.*` names on an MLX-converted body")
        }
        (Some(Provenance::Mlx), Layout::Hf) => {
            Some("a converted (shifted) head under `language_model.mtp.*` names on a raw body")
        }
        _ => None,
    };
    let (verdict, message) = if let Some(why) = &decision.refused {
        (
            Verdict::Inconsistent,
            format!("{why}: the head cannot run as stored and the loader turns MTP off; `repair` writes a fixed copy"),
        )
    } else if let (Some(fixed), false) = (&decision.repaired, mislabelled.is_empty()) {
        (Verdict::Repaired, format!("{fixed}: the loader repairs them at load time; `repair` writes a consistent copy"))
    } else if let Some(what) = grafted {
        (
            Verdict::Repaired,
            format!("{what}: Tandem's loader follows the names and loads it correctly, other tools may not; `repair` writes a consistent copy"),
        )
    } else {
        let conv = if head_provenance == Some(Provenance::Hf) { "zero-centred (raw)" } else { "shifted (MLX)" };
        (Verdict::Ok, format!("complete MTP head (15 tensors), norms {conv} like the body"))
    };
    a.verdict = verdict;
    a.message = message;
    Ok(a)
}

/// Runs the loader's acceptance probe on the folder of `a` (a complete head only) and folds what it
/// found into the analysis: the convention it chose becomes the norms' `stored` (so `repair` and
/// `convert --repair` write that fix), a head it refuses is `inconsistent`, and `a.probe` holds the
/// figures. A folder that does not load keeps the analysis and gets no figures.
pub fn probe(src: &Source, a: &mut HeadAnalysis) -> Result<(), ConvertError> {
    if !a.complete {
        return Ok(());
    }
    let status = match model::load(&src.dir, &LoadOptions::default()) {
        Ok(m) => m.mtp_status,
        Err(e) => {
            tracing::warn!("{}: MTP probe skipped: the model does not load: {e}", src.dir.display());
            return Ok(());
        }
    };
    a.probe = status.probe.clone();
    let Some(report) = &status.probe else { return Ok(()) };
    if report.inconclusive {
        return Ok(());
    }
    if let Some(plan) = &status.plan {
        for n in a.norms.iter_mut() {
            if let Some(s) = plan.get(&n.name) {
                n.stored = *s;
            }
        }
    }
    if !status.loaded {
        a.verdict = Verdict::Inconsistent;
        a.message = status.reason.unwrap_or_default();
    } else if let (Some(fix), Verdict::Ok) = (&status.repaired, a.verdict) {
        a.verdict = Verdict::Repaired;
        a.message = format!("{fix}: the loader repairs it at load time; `repair` writes a consistent copy");
    }
    Ok(())
}
