//! `repair`: a copy of a model whose MTP head disagrees with its body's norm convention (a raw head
//! re-attached to an MLX conversion, a zero-centred head under MLX names, a head shifted twice), with
//! the head's norms put in the body's convention and its tensors named like the body's. Every other
//! tensor is copied byte for byte (quantized ones too); config and side files are copied.

use std::path::{Path, PathBuf};
use std::time::Instant;

use mlx::Dtype;
use serde::Serialize;

use super::convert::{check_paths, check_space, copy_side_files, emit, Computer};
use super::head::{self, Verdict};
use super::plan::{self, Op, Plan, Unit};
use super::source::{self, Source};
use super::writer::{self, PartialDir};
use super::{Control, ConvertError, ConvertEvent};
use crate::model::qwen3_5::{self as arch, Role};
use crate::model::Layout;

#[derive(Debug, Clone, Serialize)]
pub struct RepairReport {
    pub src: PathBuf,
    pub dst: PathBuf,
    pub before: Verdict,
    pub after: Verdict,
    /// What changed, one line per head norm fixed or renamed group.
    pub fixed: Vec<String>,
    pub tensors: usize,
    pub bytes: u64,
    pub seconds: f64,
    pub message: String,
}

/// [`repair_with`] without replacing an existing destination and without progress events.
pub fn repair(src: &Path, dst: &Path) -> Result<RepairReport, ConvertError> {
    repair_with(src, dst, false, &mut |_| Control::Continue)
}

/// Writes a repaired copy of `src` to `dst` (replacing it when `force`). Fails with
/// [`ConvertError::NothingToRepair`] when the head is fine or missing.
pub fn repair_with(
    src: &Path,
    dst: &Path,
    force: bool,
    on_event: &mut dyn FnMut(&ConvertEvent) -> Control,
) -> Result<RepairReport, ConvertError> {
    let t0 = Instant::now();
    check_paths(src, dst, force)?;
    let source = Source::open(src, false)?;
    let mut head = head::analyse(&source)?;
    head::probe(&source, &mut head)?;
    if !matches!(head.verdict, Verdict::Repaired | Verdict::Inconsistent) {
        return Err(ConvertError::NothingToRepair {
            path: src.to_path_buf(),
            message: format!("MTP verdict {:?}: {}", head.verdict, head.message),
        });
    }
    emit(
        on_event,
        ConvertEvent::Validated {
            format: source.layout,
            tensors: source.tensors.len(),
            bytes: source.bytes(),
            mtp: "repair".into(),
        },
    )?;
    // The body decides: an MLX body gets a shifted head named `language_model.mtp.*`, a raw body a
    // zero-centred one named `mtp.*`.
    let target = if source.layout == Layout::Mlx { 1.0 } else { 0.0 };
    let mut fixed = Vec::new();
    let mut units = Vec::with_capacity(source.tensors.len());
    for (i, t) in source.tensors.iter().enumerate() {
        let is_head = arch::is_mtp(&t.name);
        let key = match (is_head, source.layout) {
            (false, _) => t.key.clone(),
            (true, Layout::Mlx) => arch::mlx_key(&t.name),
            (true, Layout::Hf) => t.name.clone(),
        };
        let mut op = Op::Copy;
        if is_head && arch::role(&t.name) == Role::ZeroCentredNorm {
            if let Some(stored) = head.stored(&t.name) {
                let add = target - stored.offset();
                if add != 0.0 {
                    let dtype = if t.tensor.dtype.is_float() { t.tensor.dtype } else { Dtype::F32 };
                    op = Op::Shift { add, dtype };
                    fixed.push(format!("{} -> {key}: {add:+} (was {stored:?})", t.key));
                }
            }
        }
        if is_head && key != t.key && op == Op::Copy && arch::role(&t.name) == Role::ZeroCentredNorm {
            fixed.push(format!("{} -> {key}: renamed", t.key));
        }
        let params = t.tensor.shape.iter().map(|&d| d as u64).product();
        let parts = plan::parts(&key, op, t.tensor.dtype, &t.tensor.shape);
        units.push(Unit { src: i, name: t.name.clone(), op, parts, params });
    }
    let renamed = source
        .tensors
        .iter()
        .filter(|t| arch::is_mtp(&t.name) && !t.key.starts_with("language_model.") && source.layout == Layout::Mlx)
        .count();
    if renamed > 0 {
        fixed.push(format!("{renamed} head tensors renamed from mtp.* to language_model.mtp.*"));
    }
    let plan = Plan::new(units, 2 << 30).map_err(|e| ConvertError::Internal(format!("safetensors header: {e}")))?;
    check_space(dst, plan.file_bytes())?;
    let partial = PartialDir::create(dst)?;
    // Repair runs alone (the CLI): its gate locks nothing.
    let gate = super::ComputeGate::default();
    let mut computer =
        Computer { src: &source, gate: &gate, on_event, total: plan.units.len(), bytes_total: plan.tensor_bytes() };
    writer::write(&plan, &partial.path, &mut computer)?;
    let on_event = computer.on_event;
    let config = crate::model::files::read(&src.join("config.json"))
        .map_err(|e| ConvertError::io(&src.join("config.json"), e))?;
    std::fs::write(partial.path.join("config.json"), config)
        .map_err(|e| ConvertError::io(&partial.path.join("config.json"), e))?;
    copy_side_files(src, &partial.path)?;
    let mut bytes = 0;
    for s in &plan.shards {
        let p = partial.path.join(&s.file);
        source::check_header(&p)?;
        bytes += std::fs::metadata(&p).map_err(|e| ConvertError::io(&p, e))?.len();
    }
    // The copy must come out consistent before it replaces anything.
    let copy = Source::open(&partial.path, false)?;
    let mut after = head::analyse(&copy)?;
    head::probe(&copy, &mut after)?;
    if after.verdict != Verdict::Ok {
        return Err(ConvertError::Mtp {
            path: src.to_path_buf(),
            message: format!("the repaired copy is still not consistent: {}", after.message),
        });
    }
    partial.commit(force)?;
    let seconds = t0.elapsed().as_secs_f64();
    let _ = on_event(&ConvertEvent::Finished {
        dst: dst.to_path_buf(),
        bytes,
        bpw: plan.bpw(),
        params: plan.params(),
        seconds,
    });
    Ok(RepairReport {
        src: src.to_path_buf(),
        dst: dst.to_path_buf(),
        before: head.verdict,
        after: after.verdict,
        fixed,
        tensors: plan.tensors(),
        bytes,
        seconds,
        message: format!("was: {}; now: {}", head.message, after.message),
    })
}
