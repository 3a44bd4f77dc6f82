//! `convert`: checks the source, decides every tensor's output (recipe, calibration for `auto`),
//! reports the exact predicted size, then streams the tensors into a temporary folder beside the
//! destination and renames it into place.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use mlx::{Array, Dtype, QuantMode};
use serde::Serialize;

use super::head::{self, HeadAnalysis};
use super::options::{ConvertOptions, MtpMode, Recipe, SUPPORTED_BITS, SUPPORTED_GROUP_SIZES};
use super::plan::{self, Op, Plan, Unit};
use super::recipe::{self, Module, QuantParams, Sensitivity};
use super::source::{self, Source};
use super::writer::{self, PartialDir, UnitSource};
use super::{calibrate, inspect, ComputeGate, Control, ConvertError, ConvertEvent};
use crate::model::mtp_head::probe::{self, ProbeReport};
use crate::model::qwen3_5::{self as arch, LinearKind, Role};
use crate::model::store::Provenance;
use crate::model::Layout;

/// What happened to the MTP head.
#[derive(Debug, Clone, Serialize)]
pub struct MtpOutcome {
    pub kept: bool,
    /// Tensors written for the head (15 logical, plus 2 per quantized linear).
    pub tensors: usize,
    /// Head linears quantized (of 8; `mtp.fc` never is).
    pub quantized_linears: usize,
    pub message: String,
    /// What the probe measured of the written head (also in its config.json, `tandem.mtp`).
    pub probe: Option<ProbeReport>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ConvertReport {
    pub src: PathBuf,
    pub dst: PathBuf,
    pub source_format: Layout,
    pub recipe: Recipe,
    pub params: u64,
    /// Bytes of every written safetensors file (headers included).
    pub bytes: u64,
    pub bpw: f64,
    pub predicted_bytes: u64,
    pub predicted_bpw: f64,
    pub tensors: usize,
    pub shards: usize,
    /// Per module group: how many modules at which bits.
    pub quantization: Option<inspect::QuantSummary>,
    pub mtp: MtpOutcome,
    /// For `auto`: each module's measured errors and chosen bits (None = full precision).
    pub allocation: Option<Vec<(Sensitivity, Option<u8>)>>,
    /// MLX's peak memory while writing, in bytes.
    pub peak_memory: u64,
    pub seconds: f64,
    pub notes: Vec<String>,
}

pub(crate) fn emit(on_event: &mut dyn FnMut(&ConvertEvent) -> Control, e: ConvertEvent) -> Result<(), ConvertError> {
    match on_event(&e) {
        Control::Continue => Ok(()),
        Control::Cancel => Err(ConvertError::Cancelled),
    }
}

pub fn check_options(opts: &ConvertOptions) -> Result<(), ConvertError> {
    let bad = |option: &'static str, message: String| Err(ConvertError::Option { option, message });
    if !SUPPORTED_GROUP_SIZES.contains(&opts.group_size) {
        return bad("group_size", format!("{} (expected 32, 64 or 128)", opts.group_size));
    }
    if let Some(b) = opts.bits {
        if !SUPPORTED_BITS.contains(&b) {
            return bad("bits", format!("{b} (expected 2, 3, 4, 5, 6 or 8)"));
        }
    }
    if let Some(super::MtpBits::Bits(b)) = opts.mtp_bits {
        if !SUPPORTED_BITS.contains(&b) {
            return bad("mtp_bits", format!("{b} (expected 2, 3, 4, 5, 6, 8 or none)"));
        }
    }
    if let Some((low, _)) = recipe::mixed_bits(opts.recipe) {
        if opts.bits.is_some_and(|b| b != low) {
            return bad(
                "bits",
                format!(
                    "{} conflicts with recipe {} ({low} bits, 6 for sensitive layers); leave bits unset",
                    opts.bits.unwrap_or(0),
                    opts.recipe
                ),
            );
        }
    }
    match (opts.recipe, opts.target_bpw) {
        (Recipe::Auto, None) => return bad("target_bpw", "the auto recipe needs a target bits per weight".into()),
        (Recipe::Auto, Some(t)) if !(1.0..=32.0).contains(&t) => {
            return bad("target_bpw", format!("{t} is outside 1..32"))
        }
        (r, Some(_)) if r != Recipe::Auto => {
            return bad("target_bpw", format!("only the auto recipe takes a target (recipe is {r})"))
        }
        _ => {}
    }
    if opts.recipe == Recipe::Uniform && opts.bits.is_none() && opts.mtp_bits.is_some() && opts.mtp == MtpMode::Drop {
        return bad("mtp_bits", "the MTP head is dropped".into());
    }
    if opts.shard_bytes == 0 {
        return bad("shard_bytes", "must be positive".into());
    }
    Ok(())
}

/// Refuses a destination that exists (without force) or that overlaps the source.
pub(crate) fn check_paths(src: &Path, dst: &Path, force: bool) -> Result<(), ConvertError> {
    let src_abs = src.canonicalize().map_err(|e| ConvertError::io(src, e))?;
    let parent = writer::parent_of(dst);
    let parent_abs = parent.canonicalize().map_err(|e| ConvertError::Destination {
        path: dst.to_path_buf(),
        message: format!("its folder {} is not usable: {e}", parent.display()),
    })?;
    let dst_abs =
        parent_abs.join(dst.file_name().ok_or_else(|| ConvertError::Destination {
            path: dst.to_path_buf(),
            message: "has no folder name".into(),
        })?);
    if dst_abs.starts_with(&src_abs) || src_abs.starts_with(&dst_abs) {
        return Err(ConvertError::Destination {
            path: dst.to_path_buf(),
            message: format!("overlaps the source {}", src.display()),
        });
    }
    if dst.exists() && !force {
        return Err(ConvertError::DestinationExists(dst.to_path_buf()));
    }
    Ok(())
}

/// Fails when the destination's file system lacks room for `need` bytes (plus a small margin).
pub(crate) fn check_space(dst: &Path, need: u64) -> Result<(), ConvertError> {
    let dir = writer::parent_of(dst);
    let available = fs4::available_space(&dir).map_err(|e| ConvertError::io(&dir, e))?;
    let need = need + need / 100 + (16 << 20);
    if available < need {
        return Err(ConvertError::DiskSpace { path: dir, need, available });
    }
    Ok(())
}

/// The linear modules that will be written.
fn modules(src: &Source, keep_mtp: bool) -> Vec<Module> {
    let tied = src.model.tie_word_embeddings;
    src.tensors
        .iter()
        .filter_map(|t| match arch::role(&t.name) {
            Role::Linear { module, kind } if t.tensor.shape.len() == 2 => {
                let is_mtp = arch::is_mtp(&module);
                if (is_mtp && !keep_mtp) || (kind == LinearKind::LmHead && tied) {
                    return None;
                }
                Some(Module {
                    layer: arch::layer_index(&t.name),
                    name: module,
                    kind,
                    out: t.tensor.shape[0],
                    inp: t.tensor.shape[1],
                    is_mtp,
                })
            }
            _ => None,
        })
        .collect()
}

/// The output units: one per written source tensor.
fn units(
    src: &Source,
    opts: &ConvertOptions,
    head: &HeadAnalysis,
    keep_mtp: bool,
    assignment: &BTreeMap<String, Option<QuantParams>>,
) -> Result<Vec<Unit>, ConvertError> {
    let dt = opts.dtype.dtype();
    let tied = src.model.tie_word_embeddings;
    let mut out = Vec::new();
    for (i, t) in src.tensors.iter().enumerate() {
        let name = &t.name;
        let is_mtp = arch::is_mtp(name);
        if (is_mtp && !keep_mtp) || (tied && arch::is_lm_head(name)) {
            continue;
        }
        let role = arch::role(name);
        let op = match role {
            Role::Linear { ref module, .. } => match assignment.get(module).copied().flatten() {
                Some(q) => Op::Quantize { dtype: dt, bits: q.bits, group_size: q.group_size },
                None => Op::Cast(dt),
            },
            Role::ZeroCentredNorm => {
                let add = if is_mtp {
                    1.0 - head
                        .stored(name)
                        .map_or(if t.provenance == Provenance::Hf { 0.0 } else { 1.0 }, |s| s.offset())
                } else if t.provenance == Provenance::Hf {
                    1.0
                } else {
                    0.0
                };
                if add == 0.0 {
                    Op::Cast(dt)
                } else {
                    Op::Shift { add, dtype: dt }
                }
            }
            Role::Conv1d if t.tensor.shape.len() == 3 && t.tensor.shape[2] != 1 => Op::ConvLayout(dt),
            ref r => Op::Cast(arch::cast_predicate(r).unwrap_or(dt)),
        };
        let op = match op {
            Op::Cast(d) if t.tensor.dtype == d || !t.tensor.dtype.is_float() => Op::Copy,
            op => op,
        };
        if let Op::Quantize { group_size, .. } = op {
            let s = &t.tensor.shape;
            if s.len() != 2 || s[1] % group_size as i32 != 0 {
                return Err(ConvertError::Internal(format!(
                    "`{name}` of shape {s:?} cannot be quantized with group size {group_size}"
                )));
            }
        }
        let params = t.tensor.shape.iter().map(|&d| d as u64).product();
        let parts = plan::parts(&arch::mlx_key(name), op, t.tensor.dtype, &t.tensor.shape);
        out.push(Unit { src: i, name: name.clone(), op, parts, params });
    }
    Ok(out)
}

/// Computes units from the source and reports progress.
pub(crate) struct Computer<'a, 'e> {
    pub src: &'a Source,
    pub gate: &'a ComputeGate,
    pub on_event: &'a mut (dyn FnMut(&ConvertEvent) -> Control + 'e),
    pub total: usize,
    pub bytes_total: u64,
}

fn check_finite(a: &Array) -> mlx::Result<bool> {
    let bad = a.isnan()?.logical_or(&a.isinf()?)?.any(&[], false)?;
    Ok(!bad.item::<bool>()?)
}

impl Computer<'_, '_> {
    fn compute_arrays(&mut self, unit: &Unit) -> Result<Vec<Vec<u8>>, ConvertError> {
        let t = &self.src.tensors[unit.src];
        let fail =
            |message: String| ConvertError::Tensor { file: t.file().to_path_buf(), tensor: t.key.clone(), message };
        let mlx_e = |e: mlx::Error| fail(e.to_string());
        let a = t.tensor.to_array()?;
        if a.dtype().is_float() && !check_finite(&a).map_err(mlx_e)? {
            return Err(fail("holds NaN or infinite values (corrupt file?)".into()));
        }
        let arrays: Vec<Array> = match unit.op {
            Op::Copy => return Ok(vec![t.tensor.bytes().to_vec()]),
            Op::Cast(d) => vec![if a.dtype().is_float() { a.as_dtype(d).map_err(mlx_e)? } else { a }],
            Op::Shift { add, dtype } => {
                let dtype = if a.dtype().is_float() { dtype } else { a.dtype() };
                vec![a
                    .as_dtype(Dtype::F32)
                    .and_then(|x| x.add(&Array::f32(add)))
                    .and_then(|x| x.as_dtype(dtype))
                    .map_err(mlx_e)?]
            }
            Op::ConvLayout(d) => vec![a.swapaxes(-1, -2).and_then(|x| x.as_dtype(d)).map_err(mlx_e)?],
            Op::Quantize { dtype, bits, group_size } => {
                let w = a.as_dtype(dtype).map_err(mlx_e)?;
                let q =
                    mlx::quantized::quantize(&w, group_size as i32, bits as i32, QuantMode::Affine).map_err(mlx_e)?;
                let biases = q.biases.ok_or_else(|| fail("affine quantization returned no biases".into()))?;
                vec![q.scales, biases, q.weight]
            }
        };
        let mut out = Vec::with_capacity(arrays.len());
        for (x, part) in arrays.iter().zip(&unit.parts) {
            let x = x.contiguous().map_err(mlx_e)?;
            x.eval().map_err(mlx_e)?;
            if x.dtype() != part.dtype || x.shape() != part.shape {
                return Err(ConvertError::Internal(format!(
                    "`{}` computed as {:?} {}, planned {:?} {}",
                    part.key,
                    x.shape(),
                    x.dtype(),
                    part.shape,
                    part.dtype
                )));
            }
            out.push(x.to_bytes().map_err(mlx_e)?);
        }
        Ok(out)
    }
}

impl UnitSource for Computer<'_, '_> {
    /// One tensor is one unit of MLX work: the gate is held while it is computed (its arrays made,
    /// evaluated, read back and freed), not while it is written or reported.
    fn compute(&mut self, unit: &Unit) -> Result<Vec<Vec<u8>>, ConvertError> {
        let _hold = self.gate.hold();
        let bytes = self.compute_arrays(unit);
        mlx::device::clear_cache();
        bytes
    }

    fn written(&mut self, unit: &Unit, index: usize, bytes_done: u64) -> bool {
        let e = ConvertEvent::Tensor {
            name: unit.name.clone(),
            index,
            total: self.total,
            bytes_done,
            bytes_total: self.bytes_total,
        };
        (self.on_event)(&e) == Control::Continue
    }
}

/// The config of the written model: the source's, with the quantization block, the MTP layer count
/// and the dtype updated.
fn out_config(
    src: &Source,
    opts: &ConvertOptions,
    modules: &[Module],
    assignment: &BTreeMap<String, Option<QuantParams>>,
    keep_mtp: bool,
) -> serde_json::Value {
    let mut config = src.config.clone();
    if let Some(obj) = config.as_object_mut() {
        obj.remove("quantization");
        // What an earlier conversion verified of its head is rewritten for this output.
        obj.remove("tandem");
        obj.remove("quantization_config");
        for key in ["torch_dtype", "dtype"] {
            if obj.contains_key(key) {
                obj.insert(key.into(), opts.dtype.config_name().into());
            }
        }
        // A text-only source (transformers' `qwen3_5_text`): mlx-lm has no module of that name but
        // reads a flat `qwen3_5` config as its text config, and so does Tandem.
        if obj.get("model_type").and_then(|t| t.as_str()) == Some("qwen3_5_text") {
            obj.insert("model_type".into(), "qwen3_5".into());
        }
        // The two levels disagreed on tying and the checkpoint settled it: write one answer, the
        // one the written tensors follow, where every reader looks.
        if src.model.tie_conflict {
            let tied = serde_json::Value::Bool(src.model.tie_word_embeddings);
            obj.insert("tie_word_embeddings".into(), tied.clone());
            if let Some(t) = obj.get_mut("text_config").and_then(|t| t.as_object_mut()) {
                t.insert("tie_word_embeddings".into(), tied);
            }
        }
        let text = match obj.get_mut("text_config").and_then(|t| t.as_object_mut()) {
            Some(t) => t,
            None => obj,
        };
        for key in ["torch_dtype", "dtype"] {
            if text.contains_key(key) {
                text.insert(key.into(), opts.dtype.config_name().into());
            }
        }
        text.remove("quantization_config");
        if !keep_mtp {
            text.insert("mtp_num_hidden_layers".into(), 0.into());
        }
    }
    let quantized: Vec<(&Module, QuantParams)> =
        modules.iter().filter_map(|m| assignment.get(&m.name).copied().flatten().map(|q| (m, q))).collect();
    if quantized.is_empty() {
        return config;
    }
    // The global entry takes the most common width; other modules get an entry of their own, and
    // quantizable modules kept in full precision are marked `false`.
    let mut counts: BTreeMap<u8, usize> = BTreeMap::new();
    for (_, q) in &quantized {
        *counts.entry(q.bits).or_default() += 1;
    }
    let default_bits = match (opts.recipe, opts.bits) {
        (Recipe::Uniform, Some(b)) => b,
        _ => recipe::mixed_bits(opts.recipe)
            .map(|(low, _)| low)
            .unwrap_or_else(|| counts.iter().max_by_key(|(b, n)| (**n, **b)).map(|(b, _)| *b).unwrap_or(4)),
    };
    let g = opts.group_size;
    let mut q = serde_json::Map::new();
    q.insert("group_size".into(), g.into());
    q.insert("bits".into(), default_bits.into());
    q.insert("mode".into(), "affine".into());
    for m in modules {
        let path = arch::mlx_key(&m.name);
        match assignment.get(&m.name).copied().flatten() {
            Some(p) if p.bits != default_bits || p.group_size != g => {
                q.insert(path, serde_json::json!({ "group_size": p.group_size, "bits": p.bits, "mode": "affine" }));
            }
            None if m.quantizable(g) || m.kind == LinearKind::MtpFc => {
                q.insert(path, false.into());
            }
            _ => {}
        }
    }
    if let Some(obj) = config.as_object_mut() {
        obj.insert("quantization".into(), serde_json::Value::Object(q.clone()));
        obj.insert("quantization_config".into(), serde_json::Value::Object(q));
    }
    config
}

/// Copies the non-weight files (tokenizer, chat template, generation and preprocessor configs,
/// license, readme) from `src` to `dst`.
pub(crate) fn copy_side_files(src: &Path, dst: &Path) -> Result<Vec<String>, ConvertError> {
    const WEIGHTS: &[&str] = &["safetensors", "bin", "pt", "pth", "gguf", "ckpt", "h5", "msgpack", "onnx", "npz"];
    let mut copied = Vec::new();
    let mut entries: Vec<PathBuf> = std::fs::read_dir(src)
        .map_err(|e| ConvertError::io(src, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    entries.sort();
    for p in entries {
        let Some(name) = p.file_name().and_then(|n| n.to_str()) else { continue };
        let ext = p.extension().and_then(|e| e.to_str()).unwrap_or("");
        if name.starts_with('.')
            || name == "config.json"
            || name == "model.safetensors.index.json"
            || WEIGHTS.contains(&ext)
        {
            continue;
        }
        std::fs::copy(&p, dst.join(name)).map_err(|e| ConvertError::io(&p, e))?;
        copied.push(name.to_string());
    }
    Ok(copied)
}

/// Replaces the copied model card: the source's describes the source's files (sizes, dtype, layout),
/// which the conversion changed. Its front matter (license, base model, tags) is kept as it was, so
/// the terms the source is published under travel with the conversion.
fn write_model_card(
    src: &Path,
    dst: &Path,
    opts: &ConvertOptions,
    bpw: f64,
    keep_mtp: bool,
) -> Result<(), ConvertError> {
    let card = src.join("README.md");
    let Ok(text) = std::fs::read_to_string(&card) else { return Ok(()) };
    let front =
        text.strip_prefix("---\n").and_then(|rest| rest.find("\n---\n").map(|end| &text[..4 + end + 5])).unwrap_or("");
    let name = src.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let what = match opts.bits {
        _ if opts.recipe != Recipe::Uniform => format!("recipe {}", opts.recipe),
        Some(bits) => format!("{bits}-bit, group size {}", opts.group_size),
        None => format!("{} (not quantized)", opts.dtype.config_name()),
    };
    let mtp = if keep_mtp { "its MTP head kept (and probed)" } else { "without its MTP head" };
    let body = format!(
        "# {name} (converted)\n\nConverted by Tandem from `{name}`: {what}, {bpw:.2} bits per weight, {mtp}.\n\n\
         The source's model card describes the source's files and is not copied; read it where the source \
         is published. Its license applies to this conversion too.\n"
    );
    let out = dst.join("README.md");
    std::fs::write(&out, format!("{front}{body}")).map_err(|e| ConvertError::io(&out, e))
}

/// Converts the model in `src` into a new MLX-layout folder `dst` (see the module docs).
pub fn convert(
    src: &Path,
    dst: &Path,
    opts: &ConvertOptions,
    on_event: &mut dyn FnMut(&ConvertEvent) -> Control,
) -> Result<ConvertReport, ConvertError> {
    let t0 = Instant::now();
    check_options(opts)?;
    check_paths(src, dst, opts.force)?;
    // MLX work happens under `opts.gate`, one unit at a time (see `gate.rs`).
    let gate = &opts.gate;
    let source = gate.run(|| Source::open(src, true))?;
    let quantized = source.quantized_modules();
    if let Some(example) = quantized.first() {
        return Err(ConvertError::AlreadyQuantized {
            path: src.to_path_buf(),
            modules: quantized.len(),
            example: example.clone(),
        });
    }
    let mut head = gate.run(|| head::analyse(&source))?;
    if opts.mtp == MtpMode::Keep {
        // Names and statistics are claims: what the probe measures of the source's head decides
        // which convention is written (with `repair`) or whether conversion stops.
        gate.run(|| head::probe(&source, &mut head))?;
    }
    let mut notes = Vec::new();
    let keep_mtp = opts.mtp == MtpMode::Keep && head.complete;
    if opts.mtp == MtpMode::Keep && head.declared_layers > 0 && !head.complete {
        return Err(ConvertError::Mtp {
            path: src.to_path_buf(),
            message: format!("{}; convert with mtp drop to write the model without it", head.message),
        });
    }
    if keep_mtp && head.needs_repair() && !opts.repair {
        return Err(ConvertError::Mtp {
            path: src.to_path_buf(),
            message: format!("{}; pass repair to fix it while converting, or drop the head", head.message),
        });
    }
    if keep_mtp && head.needs_repair() {
        notes.push(format!("MTP head repaired: {}", head.message));
    }
    if head.declared_layers == 0 && head.tensors_found > 0 {
        notes.push(head.message.clone());
    }
    let vision = source.tensors.iter().filter(|t| arch::part(&t.name) == arch::Part::Vision).count();
    if vision > 0 {
        notes.push(format!(
            "vision tower kept as vision_tower.* ({vision} tensors, cast to {}, not quantized)",
            opts.dtype.config_name()
        ));
    }
    let mtp_state = if keep_mtp {
        "keep".to_string()
    } else if head.declared_layers == 0 {
        "none".into()
    } else {
        "drop".into()
    };
    emit(
        on_event,
        ConvertEvent::Validated {
            format: source.layout,
            tensors: source.tensors.len(),
            bytes: source.bytes(),
            mtp: mtp_state,
        },
    )?;

    let mods = modules(&source, keep_mtp);
    let n_layers = source.model.text.num_hidden_layers;
    let tied = source.model.tie_word_embeddings;
    let mut allocation = None;
    let assignment = if opts.recipe == Recipe::Auto {
        let (assignment, alloc) = auto_assign(&source, opts, &head, keep_mtp, &mods, on_event)?;
        allocation = Some(alloc);
        assignment
    } else {
        recipe::assign(&mods, opts, n_layers, tied, None)
    };
    let plan = Plan::new(units(&source, opts, &head, keep_mtp, &assignment)?, opts.shard_bytes)
        .map_err(|e| ConvertError::Internal(format!("safetensors header: {e}")))?;
    let quantized_modules = assignment.values().filter(|q| q.is_some()).count();
    let (predicted_bytes, predicted_bpw) = (plan.file_bytes(), plan.bpw());
    emit(
        on_event,
        ConvertEvent::Planned {
            tensors: plan.tensors(),
            shards: plan.shards.len(),
            params: plan.params(),
            predicted_bytes,
            predicted_bpw,
            quantized_modules,
            dense_modules: assignment.len() - quantized_modules,
        },
    )?;
    check_space(dst, predicted_bytes)?;

    // With a locking gate, other MLX work may run between tensors and count in the peak.
    gate.run(mlx::device::reset_peak_memory);
    let partial = PartialDir::create(dst)?;
    let mut computer =
        Computer { src: &source, gate, on_event, total: plan.units.len(), bytes_total: plan.tensor_bytes() };
    writer::write(&plan, &partial.path, &mut computer)?;
    let on_event = computer.on_event;
    let mut config = out_config(&source, opts, &mods, &assignment, keep_mtp);
    writer::write_json(&partial.path.join("config.json"), &config)?;
    copy_side_files(src, &partial.path)?;
    write_model_card(src, &partial.path, opts, predicted_bpw, keep_mtp)?;
    // The written head is measured before the output is put in place; the verified convention
    // and figure go into its config.json.
    let mut written_probe = None;
    if keep_mtp {
        let status = gate.run(|| crate::model::load(&partial.path, &crate::model::LoadOptions::default()))?.mtp_status;
        if let Some(report) = &status.probe {
            if status.loaded {
                probe::record(&mut config, report);
                writer::write_json(&partial.path.join("config.json"), &config)?;
            } else if !report.inconclusive {
                let why = status.reason.clone().unwrap_or_default();
                if !opts.force {
                    return Err(ConvertError::Mtp {
                        path: dst.to_path_buf(),
                        message: format!(
                            "the written head does not pass the probe: {why}; pass force to write it anyway, repair to fix the source's convention, or drop the head"
                        ),
                    });
                }
                tracing::warn!("{}: {why}", dst.display());
                notes.push(format!("written anyway (force): {why}"));
            }
        }
        written_probe = status.probe;
    }
    // What was written must read back: every header against its file.
    let mut bytes = 0;
    for s in &plan.shards {
        let p = partial.path.join(&s.file);
        source::check_header(&p)?;
        bytes += std::fs::metadata(&p).map_err(|e| ConvertError::io(&p, e))?.len();
    }
    let peak_memory = gate.run(mlx::device::memory_stats).peak as u64;
    partial.commit(opts.force)?;

    let seconds = t0.elapsed().as_secs_f64();
    let bpw = plan.bpw();
    let _ = on_event(&ConvertEvent::Finished { dst: dst.to_path_buf(), bytes, bpw, params: plan.params(), seconds });
    let mtp_parts: Vec<&Unit> = plan.units.iter().filter(|u| arch::is_mtp(&u.name)).collect();
    let mtp = MtpOutcome {
        kept: keep_mtp,
        tensors: mtp_parts.iter().map(|u| u.parts.len()).sum(),
        quantized_linears: mtp_parts.iter().filter(|u| matches!(u.op, Op::Quantize { .. })).count(),
        probe: written_probe,
        message: if keep_mtp {
            "MTP head kept as language_model.mtp.* (norms shifted, mtp.fc in full precision)".into()
        } else if opts.mtp == MtpMode::Drop && head.declared_layers > 0 {
            "MTP head dropped; mtp_num_hidden_layers set to 0".into()
        } else {
            head.message.clone()
        },
    };
    Ok(ConvertReport {
        src: src.to_path_buf(),
        dst: dst.to_path_buf(),
        source_format: source.layout,
        recipe: opts.recipe,
        params: plan.params(),
        bytes,
        bpw,
        predicted_bytes,
        predicted_bpw,
        tensors: plan.tensors(),
        shards: plan.shards.len(),
        quantization: inspect::summarise(
            mods.iter().map(|m| (m.name.as_str(), m.kind, assignment.get(&m.name).copied().flatten())),
        ),
        mtp,
        allocation,
        peak_memory,
        seconds,
        notes,
    })
}

type Allocation = (BTreeMap<String, Option<QuantParams>>, Vec<(Sensitivity, Option<u8>)>);

/// `auto`: measures the modules the recipe decides, then allocates bits to reach the target.
fn auto_assign(
    source: &Source,
    opts: &ConvertOptions,
    head: &HeadAnalysis,
    keep_mtp: bool,
    mods: &[Module],
    on_event: &mut dyn FnMut(&ConvertEvent) -> Control,
) -> Result<Allocation, ConvertError> {
    let g = opts.group_size;
    let target = opts.target_bpw.unwrap_or(4.5);
    // Modules whose width auto decides: quantizable, and not MTP linears with a fixed width.
    let free: Vec<Module> =
        mods.iter().filter(|m| m.quantizable(g) && !(m.is_mtp && opts.mtp_bits.is_some())).cloned().collect();
    let n_layers = source.model.text.num_hidden_layers;
    let tied = source.model.tie_word_embeddings;
    // Everything else is fixed: plan with the free modules in full precision to price it.
    let dense: BTreeMap<String, Option<u8>> = free.iter().map(|m| (m.name.clone(), None)).collect();
    let base = recipe::assign(mods, opts, n_layers, tied, Some(&dense));
    let base_units = units(source, opts, head, keep_mtp, &base)?;
    let free_names: std::collections::BTreeSet<String> = free.iter().map(|m| format!("{}.weight", m.name)).collect();
    let params: u64 = base_units.iter().map(|u| u.params).sum();
    let fixed_bits: f64 =
        base_units.iter().filter(|u| !free_names.contains(&u.name)).map(|u| 8.0 * u.nbytes() as f64).sum();
    let budget = target * params as f64 - fixed_bits;
    let dense_bits = 8 * opts.dtype.dtype().size() as u32;
    let floor: f64 = free.iter().map(|m| m.params() as f64 * recipe::bits_per_weight(2, g, dense_bits)).sum();
    if budget < floor {
        let reachable = (fixed_bits + floor) / params.max(1) as f64;
        return Err(ConvertError::Option {
            option: "target_bpw",
            message: format!(
                "{target} is below the smallest reachable {reachable:.3} bits per weight (every layer at 2 bits)"
            ),
        });
    }
    let total = free.len();
    let sens = calibrate::measure(source, &free, opts, &mut |module, done, total, tokens| {
        on_event(&ConvertEvent::Calibrating { module: module.to_string(), done, total, tokens }) == Control::Continue
    })?;
    debug_assert_eq!(sens.len(), total);
    let (chosen, _) = recipe::allocate(&sens, g, dense_bits, budget);
    let assignment = recipe::assign(mods, opts, n_layers, tied, Some(&chosen));
    let alloc = sens.into_iter().map(|s| {
        let b = chosen.get(&s.module).copied().flatten();
        (s, b)
    });
    Ok((assignment, alloc.collect()))
}
