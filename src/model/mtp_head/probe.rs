//! The MTP head's acceptance probe: names are claims, measurements are facts.
//!
//! The body runs once over a short built-in text (`assets/probe/mtp-probe.txt`, at most
//! [`MAX_TOKENS`] tokens of the model's own tokenizer, or a fixed token sequence without one), then
//! decodes [`CONTINUATION`] tokens of its own greedily. The head is then fed, teacher-forced, each
//! position's post-norm hidden `h_t` with the next token `x_{t+1}`, and its top-1 prediction is
//! compared with the body's own top-1 at `t + 1`, over the positions a greedy decode would meet
//! (the continuation, and the text where it follows the body's greedy choice): the acceptance a
//! depth-1 greedy draft gets there. Prose alone read low: a model's greedy text repeats itself,
//! which its head predicts more easily than human prose. Where the head's provenance is not a
//! fact (a re-attached head, a sidecar, norms the statistics flag) or the head as decided probes
//! poorly, each candidate convention of its seven norms is measured and the best is taken.
//!
//! The figure only means something where the body itself reads the text: its own top-1 agreement
//! with the text (`body_agreement`) must reach [`MIN_BODY_AGREEMENT`]. A random test model (or a
//! fixed token sequence) cannot judge a head, and the loader's decision then stands unmeasured.
//! A body that can judge turns MTP off when even the best head is below [`FLOOR`], or below
//! [`RELATIVE_FLOOR`] times the body's own agreement: a sound head agrees with its body more often
//! than the body guesses the text.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use mlx::Array;
use serde::{Deserialize, Serialize};

use super::convention::{HeadDecision, Stored};
use super::{plan_of, provenance_is_fact, MtpHead, NormPlan, MTP_NORMS};
use crate::cache::KvCache;
use crate::model::layers::Observer;
use crate::model::qwen3_5::{Config, Qwen35};
use crate::model::store::Store;
use crate::model::LoadError;

/// The probe text shipped with Tandem (public-domain prose).
pub const PROBE_TEXT: &str = include_str!("../../../assets/probe/mtp-probe.txt");
/// At most this many tokens of the text are probed.
pub const MAX_TOKENS: usize = 256;
/// Then this many tokens of the body's own greedy continuation.
pub const CONTINUATION: usize = 128;
/// Below this, the body does not read the text well enough to judge a head.
pub const MIN_BODY_AGREEMENT: f64 = 0.1;
/// A head below this acceptance does not run (where the body can judge).
pub const FLOOR: f64 = 0.1;
/// ... nor one below this fraction of the body's own agreement with the text.
pub const RELATIVE_FLOOR: f64 = 0.5;
/// Fewer positions than this where the text follows the body's greedy choice: all are measured.
pub const MIN_GREEDY_POSITIONS: usize = 32;
/// Another convention replaces the decided one only when it probes better by this much.
pub const MARGIN: f64 = 0.05;

/// One convention measured.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ts_rs::TS)]
pub struct Tried {
    /// `shifted` (the stored values are the scales), `zero_centred` (+1), `shifted_twice` (-1) or
    /// `per_norm` (each norm as its own statistics say).
    pub convention: String,
    pub acceptance: f64,
}

/// What the probe measured (`inspect --json`'s `mtp.probe`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ts_rs::TS)]
pub struct ProbeReport {
    /// The chosen head's teacher-forced top-1 agreement with the body (None when no head ran).
    pub acceptance: Option<f64>,
    pub tried: Vec<Tried>,
    /// The convention the head runs with (None when MTP is off).
    pub chosen: Option<String>,
    pub seconds: f64,
    /// Tokens probed.
    pub tokens: usize,
    /// The body's own top-1 agreement with the probe text: whether the probe can judge a head.
    pub body_agreement: f64,
    /// The probe could not judge (the body does not read the text): the decision stands unmeasured.
    pub inconclusive: bool,
}

/// The probe's verdict on a head.
pub struct Judgement {
    /// The head to run (None: MTP off).
    pub head: Option<MtpHead>,
    pub report: ProbeReport,
    /// Why MTP is off (names the file and the figures).
    pub refused: Option<String>,
    /// Set when the probe chose another convention than the names and statistics decided.
    pub repaired: Option<String>,
    /// How the chosen head's norms are read.
    pub plan: Option<NormPlan>,
}

/// The probe's tokens: the built-in text through the model's tokenizer, or without a usable one a
/// fixed pseudo-random sequence over the vocabulary.
pub fn probe_tokens(dir: &Path, vocab: i32) -> Vec<i32> {
    let mut ids: Vec<i32> = Vec::new();
    if dir.join("tokenizer.json").exists() {
        match crate::chat::Tokenizer::from_dir(dir).and_then(|t| t.encode(PROBE_TEXT, false)) {
            Ok(enc) => ids = enc.into_iter().filter(|&t| (t as i64) < vocab as i64).map(|t| t as i32).collect(),
            Err(e) => {
                tracing::warn!("{}: MTP probe: tokenizer unusable ({e}); probing a fixed sequence", dir.display())
            }
        }
    }
    if ids.len() < 16 {
        let mut state: u64 = 0x2545F4914F6CDD1D;
        ids = (0..MAX_TOKENS)
            .map(|_| {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((state >> 33) % vocab.max(1) as u64) as i32
            })
            .collect();
    }
    ids.truncate(MAX_TOKENS);
    ids
}

/// The body's pass over the probe text.
pub struct BodyRun {
    /// Post-norm hidden states `[1, T, D]`.
    hidden: Array,
    tokens: Array,
    ids: Vec<i32>,
    /// The body's top-1 at each position (its prediction of the next token).
    body_next: Vec<u32>,
    pub body_agreement: f64,
}

fn top1(logits: &Array) -> mlx::Result<Vec<u32>> {
    logits.argmax(-1, false)?.reshape(&[-1])?.to_vec::<u32>()
}

/// Runs the body once over `ids`, then (where it reads them) decodes [`CONTINUATION`] tokens greedily
/// after them: the text a greedy decode meets, where the head's agreement is the depth-1 acceptance
/// itself.
pub fn run_body(model: &Qwen35, ids: &[i32]) -> mlx::Result<BodyRun> {
    let t = ids.len() as i32;
    let mut cache = model.make_cache();
    let prose = model.forward(&Array::from_slice(ids, &[1, t])?, &mut cache)?;
    let mut body_next = top1(&model.logits(&prose)?)?;
    let hits = ids[1..].iter().zip(&body_next).filter(|(x, p)| **x as u32 == **p).count();
    let body_agreement = hits as f64 / (ids.len() - 1).max(1) as f64;
    let mut ids = ids.to_vec();
    let mut hiddens = vec![prose];
    // A body that does not read the text cannot judge a head (see `judge`): no continuation then.
    let continuation = if body_agreement >= MIN_BODY_AGREEMENT { CONTINUATION } else { 0 };
    for _ in 0..continuation {
        let Some(&next) = body_next.last() else { break };
        ids.push(next as i32);
        let h = model.forward(&Array::from_slice(&[next as i32], &[1, 1])?, &mut cache)?;
        body_next.extend(top1(&model.logits(&h)?)?);
        hiddens.push(h);
    }
    let hidden = mlx::concatenate(&hiddens.iter().collect::<Vec<_>>(), 1)?;
    let tokens = Array::from_slice(&ids, &[1, ids.len() as i32])?;
    Ok(BodyRun { hidden, tokens, ids, body_next, body_agreement })
}

/// The head's teacher-forced top-1 agreement with the body: `argmax head(h_t, x_{t+1})` against the
/// body's top-1 at `t + 1`, over the positions where `x_{t+1}` is the body's own top-1 at `t` (as
/// in greedy decoding), or over every position when fewer than [`MIN_GREEDY_POSITIONS`] are.
pub fn agreement(model: &Qwen35, head: &MtpHead, run: &BodyRun) -> mlx::Result<f64> {
    let t = run.tokens.dim(1);
    if t < 3 {
        return Ok(0.0);
    }
    let h = run.hidden.slice_axis(1, 0, t - 1)?;
    let next = run.tokens.slice_axis(1, 1, t)?;
    let out = head.forward(&model.embed(&next)?, &h, &mut KvCache::default())?;
    let draft = top1(&model.logits(&out)?)?;
    // Positions where the text's next token is the body's own greedy choice are the ones a greedy
    // decode meets (the head is fed the body's token there); they are measured when there are
    // enough of them, every position otherwise.
    let pairs: Vec<(u32, u32, bool)> =
        (0..draft.len()).map(|t| (draft[t], run.body_next[t + 1], run.body_next[t] == run.ids[t + 1] as u32)).collect();
    let greedy: Vec<&(u32, u32, bool)> = pairs.iter().filter(|p| p.2).collect();
    let rate = |ps: &[&(u32, u32, bool)]| ps.iter().filter(|p| p.0 == p.1).count() as f64 / ps.len().max(1) as f64;
    if greedy.len() >= MIN_GREEDY_POSITIONS {
        Ok(rate(&greedy))
    } else {
        Ok(rate(&pairs.iter().collect::<Vec<_>>()))
    }
}

fn uniform(stored: Stored) -> NormPlan {
    MTP_NORMS.iter().map(|n| (format!("mtp.{n}"), stored)).collect()
}

fn label(plan: &NormPlan) -> String {
    let mut kinds: Vec<Stored> = plan.values().copied().collect();
    kinds.dedup();
    match kinds[..] {
        [Stored::Shifted] => "shifted".into(),
        [Stored::ZeroCentred] => "zero_centred".into(),
        [Stored::ShiftedTwice] => "shifted_twice".into(),
        _ => "per_norm".into(),
    }
}

/// The candidate plans: the decided one first, then the uniform conventions and the per-norm votes.
fn candidates(decision: &HeadDecision) -> Vec<NormPlan> {
    let mut out = vec![plan_of(decision)];
    let votes: NormPlan = decision.norms.iter().map(|n| (n.stat.name.clone(), n.vote)).collect();
    for plan in [uniform(Stored::Shifted), uniform(Stored::ZeroCentred), uniform(Stored::ShiftedTwice), votes] {
        if !out.contains(&plan) {
            out.push(plan);
        }
    }
    out
}

fn mlx_err(e: mlx::Error) -> LoadError {
    LoadError::Mlx { context: "MTP probe".into(), error: e }
}

/// Probes the head the loader decided (`current`, None when the decision refused it) and, where
/// provenance is not a fact or it probes poorly, the other candidate conventions; decides which
/// head runs. `file` names the head's file for messages.
pub fn judge(
    model: &Qwen35,
    current: Option<MtpHead>,
    store: &Store,
    config: &Config,
    decision: &HeadDecision,
    dir: &Path,
) -> Result<Judgement, LoadError> {
    let t0 = Instant::now();
    let plans = candidates(decision);
    // Candidate heads need no separate observer: they never run under calibration.
    let observer = Arc::new(Observer::default());
    let fingerprint = memo::Fingerprint::of(dir, store.dtype);
    let mut heads: Vec<Option<MtpHead>> = Vec::new();
    let measured = match fingerprint.as_ref().and_then(memo::get) {
        Some(m) => {
            heads.push(current);
            m
        }
        None => {
            let ids = probe_tokens(dir, config.text.vocab_size);
            let run = run_body(model, &ids).map_err(mlx_err)?;
            let can_judge = run.body_agreement >= MIN_BODY_AGREEMENT;
            let floor = FLOOR.max(RELATIVE_FLOOR * run.body_agreement);
            let mut tried = Vec::new();
            let mut current = current;
            for (i, plan) in plans.iter().enumerate() {
                let head = match (i, current.take()) {
                    (0, Some(h)) => h,
                    _ => MtpHead::load(store, config, plan, &observer)?,
                };
                let acceptance = agreement(model, &head, &run).map_err(mlx_err)?;
                tried.push(Tried { convention: label(plan), acceptance });
                heads.push(Some(head));
                // The decided head of a head whose provenance is a fact, probing well: nothing to compare.
                let settled = decision.refused.is_none() && provenance_is_fact(decision) && acceptance >= floor;
                if i == 0 && (settled || !can_judge) {
                    break;
                }
            }
            let m = memo::Measured { tried, tokens: run.ids.len(), body_agreement: run.body_agreement };
            if let Some(f) = fingerprint {
                memo::put(f, m.clone());
            }
            m
        }
    };
    let memo::Measured { tried, tokens, body_agreement } = measured;
    let can_judge = body_agreement >= MIN_BODY_AGREEMENT;
    let floor = FLOOR.max(RELATIVE_FLOOR * body_agreement);
    // The head of plan `i`: loaded by the measurement, or (figures remembered) now.
    let mut head_of = |i: usize| -> Result<Option<MtpHead>, LoadError> {
        match heads.get_mut(i).and_then(Option::take) {
            Some(h) => Ok(Some(h)),
            None => plans.get(i).map(|plan| MtpHead::load(store, config, plan, &observer)).transpose(),
        }
    };
    let decided_runs = decision.refused.is_none();
    let best = (0..tried.len()).max_by(|&a, &b| tried[a].acceptance.total_cmp(&tried[b].acceptance)).unwrap_or(0);
    // The decided head stays unless another is clearly better; a refused decision has no head.
    let pick = if decided_runs && tried[best].acceptance < tried[0].acceptance + MARGIN { 0 } else { best };
    let pick = if !can_judge { 0 } else { pick };
    let where_ = decision
        .norms
        .first()
        .map(|n| format!("{}: `{}`", n.stat.file.display(), n.stat.key))
        .unwrap_or_else(|| dir.display().to_string());
    let figures = tried.iter().map(|t| format!("{} {:.3}", t.convention, t.acceptance)).collect::<Vec<_>>().join(", ");
    let mut report = ProbeReport {
        acceptance: None,
        tried: tried.clone(),
        chosen: None,
        seconds: 0.0,
        tokens,
        body_agreement,
        inconclusive: !can_judge,
    };
    let mut j = Judgement { head: None, report: report.clone(), refused: None, repaired: None, plan: None };
    let accepted = tried[pick].acceptance;
    if !can_judge {
        if decided_runs {
            j.head = head_of(0)?;
            j.plan = Some(plans[0].clone());
            report.acceptance = Some(accepted);
            report.chosen = Some(tried[0].convention.clone());
        }
    } else if accepted < floor {
        j.refused = Some(format!(
            "the MTP head ({where_}) probes at best {accepted:.3} top-1 agreement with its body on {} tokens \
             (tried: {figures}), below the floor {floor:.3} (the body itself agrees {body_agreement:.3} with the text); MTP is off",
            tokens,
        ));
    } else {
        j.head = head_of(pick)?;
        j.plan = Some(plans[pick].clone());
        report.acceptance = Some(accepted);
        report.chosen = Some(tried[pick].convention.clone());
        if pick != 0 || !decided_runs {
            j.repaired = Some(format!(
                "MTP norm convention chosen by the probe: {} ({accepted:.3} top-1 agreement on {} tokens; tried: {figures}) \
                 for the head in {where_}",
                tried[pick].convention,
                tokens
            ));
        }
    }
    report.seconds = t0.elapsed().as_secs_f64();
    j.report = report;
    Ok(j)
}

/// What the probe measured of a folder's files, remembered for this process: loading the same files
/// again (a model unloaded and loaded, a source converted twice) reuses the figures instead of running
/// the body again. Files are known by name, size, modification time and inode, so a file written since
/// is measured anew.
pub mod memo {
    use std::path::{Path, PathBuf};
    use std::sync::Mutex;
    use std::time::SystemTime;

    use super::Tried;

    /// Folders remembered at most (the oldest is forgotten first).
    const CAPACITY: usize = 64;

    #[derive(Clone, PartialEq)]
    pub struct Fingerprint {
        dir: PathBuf,
        dtype: Option<mlx::Dtype>,
        files: Vec<(std::ffi::OsString, u64, SystemTime, u64)>,
    }

    #[derive(Clone)]
    pub struct Measured {
        pub tried: Vec<Tried>,
        pub tokens: usize,
        pub body_agreement: f64,
    }

    static MEMO: Mutex<Vec<(Fingerprint, Measured)>> = Mutex::new(Vec::new());

    impl Fingerprint {
        /// None when the folder cannot be listed (then nothing is remembered).
        pub fn of(dir: &Path, dtype: Option<mlx::Dtype>) -> Option<Fingerprint> {
            let dir = dir.canonicalize().ok()?;
            let mut files = Vec::new();
            for entry in std::fs::read_dir(&dir).ok()? {
                let entry = entry.ok()?;
                let meta = std::fs::metadata(entry.path()).ok()?;
                if meta.is_file() {
                    files.push((entry.file_name(), meta.len(), meta.modified().ok()?, inode(&meta)));
                }
            }
            files.sort();
            Some(Fingerprint { dir, dtype, files })
        }
    }

    #[cfg(unix)]
    fn inode(meta: &std::fs::Metadata) -> u64 {
        std::os::unix::fs::MetadataExt::ino(meta)
    }

    #[cfg(not(unix))]
    fn inode(_: &std::fs::Metadata) -> u64 {
        0
    }

    /// Whether the folder's files as they are now have figures remembered.
    pub fn remembered(dir: &Path, dtype: Option<mlx::Dtype>) -> bool {
        Fingerprint::of(dir, dtype).is_some_and(|f| get(&f).is_some())
    }

    pub fn get(f: &Fingerprint) -> Option<Measured> {
        let memo = MEMO.lock().unwrap_or_else(|p| p.into_inner());
        memo.iter().find(|(k, _)| k == f).map(|(_, m)| m.clone())
    }

    pub fn put(f: Fingerprint, m: Measured) {
        let mut memo = MEMO.lock().unwrap_or_else(|p| p.into_inner());
        memo.retain(|(k, _)| k.dir != f.dir || k.dtype != f.dtype);
        if memo.len() >= CAPACITY {
            memo.remove(0);
        }
        memo.push((f, m));
    }
}

/// Writes `report` into a config.json as `{"tandem": {"mtp": {"convention", "probe"}}}`: what the
/// conversion that wrote the folder verified of its head (other readers ignore the key).
pub fn record(config: &mut serde_json::Value, report: &ProbeReport) {
    if let Some(obj) = config.as_object_mut() {
        let entry = serde_json::json!({ "convention": report.chosen, "probe": report });
        let tandem = obj.entry("tandem").or_insert_with(|| serde_json::json!({}));
        if let Some(t) = tandem.as_object_mut() {
            t.insert("mtp".into(), entry);
        }
    }
}

/// The probe a config.json records (see [`record`]), if any.
pub fn recorded(config: &serde_json::Value) -> Option<ProbeReport> {
    serde_json::from_value(config.get("tandem")?.get("mtp")?.get("probe")?.clone()).ok()
}
