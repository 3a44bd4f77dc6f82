//! `inspect`: what a model folder holds (JSON shape: docs/ARCHITECTURE.md §4.1): format, architecture, parameter
//! count and bytes, quantization per module group, and the MTP head's state.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;

use super::head::{self, Verdict};
use super::recipe::QuantParams;
use super::source::Source;
use super::ConvertError;
use crate::model::layers::NormConvention;
use crate::model::mtp_head::probe::ProbeReport;
use crate::model::qwen3_5::{self as arch, LinearKind, Role};
use crate::model::Layout;

#[derive(Debug, Clone, Serialize)]
pub struct InspectReport {
    pub format: Layout,
    pub architecture: String,
    /// Logical parameters (a packed quantized weight counts as its unpacked size).
    pub params: u64,
    /// Bytes of the weight files.
    pub bytes: u64,
    /// None when nothing is quantized.
    pub quantization: Option<QuantSummary>,
    pub mtp: MtpReport,
}

/// Quantization per module group (`embed_tokens`, `lm_head`, `self_attn`, `linear_attn`, `mlp`, `mtp`).
#[derive(Debug, Clone, Serialize)]
pub struct QuantSummary {
    /// The config's global entry, when it has one.
    pub default: Option<QuantParams>,
    pub groups: BTreeMap<String, GroupQuant>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct GroupQuant {
    pub modules: usize,
    /// Modules kept in full precision.
    pub dense: usize,
    /// bits -> number of modules.
    pub bits: BTreeMap<u8, usize>,
    pub group_sizes: Vec<u32>,
}

#[derive(Debug, Clone, Serialize)]
pub struct MtpReport {
    pub declared_layers: usize,
    pub tensors_found: usize,
    pub complete: bool,
    pub norms: Vec<NormReport>,
    pub verdict: Verdict,
    pub message: String,
    /// The acceptance probe: `{acceptance, tried: [{convention, acceptance}], chosen, seconds, ...}`
    /// (null without a complete head).
    pub probe: Option<ProbeReport>,
}

#[derive(Debug, Clone, Serialize)]
pub struct NormReport {
    /// The key as stored.
    pub name: String,
    pub mean: f32,
    /// How the values are stored (a twice-shifted norm reports `shifted`; the verdict says more).
    pub convention: NormConvention,
}

/// Groups modules' storage by module group; None when none is quantized.
pub fn summarise<'a>(
    modules: impl Iterator<Item = (&'a str, LinearKind, Option<QuantParams>)>,
) -> Option<QuantSummary> {
    let mut groups: BTreeMap<String, GroupQuant> = BTreeMap::new();
    let mut any = false;
    for (name, kind, q) in modules {
        let group = if arch::is_mtp(name) { "mtp" } else { kind.group() };
        let g = groups.entry(group.to_string()).or_default();
        g.modules += 1;
        match q {
            Some(q) => {
                any = true;
                *g.bits.entry(q.bits).or_default() += 1;
                if !g.group_sizes.contains(&q.group_size) {
                    g.group_sizes.push(q.group_size);
                }
            }
            None => g.dense += 1,
        }
    }
    any.then_some(QuantSummary { default: None, groups })
}

fn config_default(config: &serde_json::Value) -> Option<QuantParams> {
    let q = config.get("quantization").or_else(|| config.get("quantization_config"))?;
    let bits = q.get("bits")?.as_u64()?;
    let group_size = q.get("group_size")?.as_u64()?;
    Some(QuantParams { bits: u8::try_from(bits).ok()?, group_size: u32::try_from(group_size).ok()? })
}

/// Reports on the model in `path`: headers and the seven MTP norms are read, and a complete head is
/// loaded and probed (one forward pass of the body over the probe text).
pub fn inspect(path: &Path) -> Result<InspectReport, ConvertError> {
    let src = Source::open(path, false)?;
    let architecture = src
        .config
        .get("architectures")
        .and_then(|a| a.get(0))
        .and_then(|a| a.as_str())
        .or_else(|| src.config.get("model_type").and_then(|m| m.as_str()))
        .unwrap_or("unknown")
        .to_string();
    let mut params = 0u64;
    let mut modules: Vec<(String, LinearKind, Option<QuantParams>)> = Vec::new();
    for t in &src.tensors {
        let shape = &t.tensor.shape;
        let count: u64 = shape.iter().map(|&d| d as u64).product();
        let packed_aux = t.name.ends_with(".scales")
            || (t.name.ends_with(".biases") && src.has(&format!("{}.scales", t.name.trim_end_matches(".biases"))));
        if packed_aux {
            continue;
        }
        if let Role::Linear { module, kind } = arch::role(&t.name) {
            let inp = src.model.linear_in(kind);
            let q = src.get(&format!("{module}.scales")).and_then(|s| {
                let (packed, groups) = (*shape.get(1)?, *s.tensor.shape.get(1)?);
                (groups > 0 && inp > 0)
                    .then(|| QuantParams { bits: (packed * 32 / inp) as u8, group_size: (inp / groups) as u32 })
            });
            params += match q {
                Some(_) => shape.first().map_or(0, |&o| o as u64 * inp as u64),
                None => count,
            };
            modules.push((module, kind, q));
        } else {
            params += count;
        }
    }
    let mut bytes = 0;
    for f in crate::model::weights::weight_files(path)? {
        bytes += std::fs::metadata(&f).map_err(|e| ConvertError::io(&f, e))?.len();
    }
    let mut quantization = summarise(modules.iter().map(|(n, k, q)| (n.as_str(), *k, *q)));
    if let Some(q) = quantization.as_mut() {
        q.default = config_default(&src.config);
    }
    let mut head = head::analyse(&src)?;
    head::probe(&src, &mut head)?;
    let mtp = MtpReport {
        declared_layers: head.declared_layers,
        tensors_found: head.tensors_found,
        complete: head.complete,
        norms: head
            .norms
            .iter()
            .map(|n| NormReport { name: n.key.clone(), mean: n.mean, convention: n.stored.convention() })
            .collect(),
        verdict: head.verdict,
        message: head.message,
        probe: head.probe,
    };
    Ok(InspectReport { format: src.layout, architecture, params, bytes, quantization, mtp })
}
