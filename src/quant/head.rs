//! The MTP head of a checkpoint: is it complete, and which convention do its seven norms follow?
//!
//! The decision is the loader's own (`model::convention`): a head written with its body follows
//! its names; a re-attached head's names are checked against the statistics, for the head as a
//! whole; a head shifted twice (`2 + w`) fits neither convention and does not run.

use serde::Serialize;

use super::source::Source;
use super::ConvertError;
use crate::model::convention::{self, NormStat, Reference};
use crate::model::qwen3_5::{MTP_NORMS, MTP_TENSORS};
use crate::model::store::Provenance;
use crate::model::Layout;

pub use crate::model::convention::Stored;

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
    /// What the values are, after the statistics check.
    pub stored: Stored,
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
    let declared_layers = src.model.text.mtp_num_hidden_layers;
    let present: Vec<&str> =
        src.tensors.iter().filter(|t| t.name.starts_with("mtp.")).map(|t| t.name.as_str()).collect();
    let tensors_found = MTP_TENSORS.iter().filter(|n| src.has(&format!("mtp.{n}"))).count();
    let complete = declared_layers == 1 && tensors_found == MTP_TENSORS.len();
    let head_provenance = src.get("mtp.fc.weight").or_else(|| src.get("mtp.norm.weight")).map(|t| t.provenance);
    let mut a = HeadAnalysis {
        declared_layers,
        tensors_found,
        complete,
        norms: Vec::new(),
        head_provenance,
        verdict: Verdict::Missing,
        message: String::new(),
    };
    if declared_layers == 0 {
        a.message = if present.is_empty() {
            "the model has no MTP head (mtp_num_hidden_layers is 0)".into()
        } else {
            format!("config declares no MTP layers; {} mtp.* tensors are ignored", present.len())
        };
        return Ok(a);
    }
    if declared_layers > 1 || src.model.text.mtp_use_dedicated_embeddings {
        a.message = format!(
            "unsupported MTP head ({declared_layers} layers, dedicated embeddings {})",
            src.model.text.mtp_use_dedicated_embeddings
        );
        return Ok(a);
    }
    if !complete {
        let missing: Vec<&str> = MTP_TENSORS.iter().filter(|n| !src.has(&format!("mtp.{n}"))).copied().collect();
        a.message = format!(
            "config declares {declared_layers} MTP layer(s) but the files hold {tensors_found} of its 15 tensors (missing e.g. mtp.{}); MTP is off",
            missing.first().copied().unwrap_or("?")
        );
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
    let body = stat("norm.weight")?;
    let scale = body.mean + 1.0 - Stored::declared_by(body.provenance).offset();
    let reference = Reference { key: body.key, file: body.file, scale };
    let norms = MTP_NORMS.iter().map(|n| stat(&format!("mtp.{n}"))).collect::<Result<Vec<_>, _>>()?;
    let origin = convention::head_origin(
        src.layout,
        src.tensors.iter().map(|t| (t.name.as_str(), t.provenance, t.tensor.file.as_ref())),
    );
    let decision = convention::decide(origin, norms, &reference);
    a.norms = decision
        .norms
        .iter()
        .map(|n| HeadNorm {
            name: n.stat.name.clone(),
            key: n.stat.key.clone(),
            mean: n.stat.mean,
            declared: n.declared,
            stored: n.stored,
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
