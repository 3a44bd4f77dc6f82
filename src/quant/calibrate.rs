//! Sensitivity of each linear layer to quantization, for the `auto` recipe: the calibration text is
//! run through the source model, and for every linear layer the relative output error
//! `||x W^T - x Ŵ^T|| / ||x W^T||` is measured on its actual inputs `x`, at each bit width. The
//! inputs come from the model's own forward pass (recorded by `Qwen35::observer`); each layer's errors are
//! computed as soon as its input is seen, so only one layer's activations are held at a time.

use std::collections::BTreeMap;
use std::path::Path;

use mlx::{Array, Dtype, QuantMode};

use super::options::{ConvertOptions, SUPPORTED_BITS};
use super::recipe::{Module, Sensitivity};
use super::source::Source;
use super::ConvertError;
use crate::model::qwen3_5::LinearKind;
use crate::model::{self, LoadOptions};

/// Rows of activations used per layer (a random-free, evenly spaced subset when there are more).
const MAX_ROWS: i32 = 256;

/// Token ids for calibration: the text through the model's tokenizer when it has one, else ids
/// drawn from a fixed pseudo-random sequence.
pub fn calibration_tokens(dir: &Path, opts: &ConvertOptions, vocab: i32) -> Result<Vec<i32>, ConvertError> {
    let text = match &opts.calibration {
        Some(p) => std::fs::read_to_string(p).map_err(|e| ConvertError::io(p, e))?,
        None => super::DEFAULT_CALIBRATION.to_string(),
    };
    let n = opts.calibration_tokens.max(8);
    let mut ids: Vec<i32> = Vec::new();
    if dir.join("tokenizer.json").exists() {
        let tok = crate::chat::Tokenizer::from_dir(dir)
            .map_err(|e| ConvertError::Calibration(format!("{}: {e}", dir.display())))?;
        let enc = tok
            .encode(&text, false)
            .map_err(|e| ConvertError::Calibration(format!("tokenizing the calibration text: {e}")))?;
        ids = enc.into_iter().filter(|&t| (t as i64) < vocab as i64).map(|t| t as i32).take(n).collect();
    }
    if ids.len() < 8 {
        // No usable tokenizer: a deterministic LCG over the vocabulary.
        let mut state: u64 = 0x5DEECE66D;
        ids = (0..n)
            .map(|_| {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((state >> 33) % vocab.max(1) as u64) as i32
            })
            .collect();
    }
    Ok(ids)
}

/// Measures every module in `modules` (canonical names; all quantizable at `group_size`).
/// `progress(module, done, total, tokens)` (tokens: the calibration text each module is measured over) returns false to cancel; it is called with `opts.gate` let go,
/// so each measured module is one unit of MLX work.
pub fn measure(
    src: &Source,
    modules: &[Module],
    opts: &ConvertOptions,
    progress: &mut dyn FnMut(&str, usize, usize, usize) -> bool,
) -> Result<Vec<Sensitivity>, ConvertError> {
    // Declared first, so it is let go last: the model's arrays are freed while it is held.
    let mut hold = opts.gate.hold();
    let dtype = opts.dtype.dtype();
    let group = opts.group_size as i32;
    let model = model::load(&src.dir, &LoadOptions { probe: false, ..Default::default() })?;
    let vocab = model.config.text.vocab_size;
    let tied = model.config.tie_word_embeddings;
    let ids = calibration_tokens(&src.dir, opts, vocab)?;
    let tokens = Array::from_slice(&ids, &[1, ids.len() as i32]).map_err(|e| mlx_err("calibration tokens", e))?;
    let wanted: BTreeMap<&str, &Module> = modules.iter().map(|m| (m.name.as_str(), m)).collect();
    let total = modules.len();
    let mut found: BTreeMap<String, Vec<(u8, f64)>> = BTreeMap::new();
    let mut failure: Option<ConvertError> = None;
    let mut cancelled = false;

    let weight = |module: &str| -> Result<Array, ConvertError> {
        let name = format!("{module}.weight");
        let t = src.get(&name).ok_or_else(|| ConvertError::Calibration(format!("no tensor `{name}`")))?;
        t.tensor.to_array()?.as_dtype(dtype).map_err(|e| mlx_err(&name, e))
    };

    {
        let mut observe = |name: &str, x: &Array| {
            if failure.is_some() || cancelled || found.contains_key(name) || !wanted.contains_key(name) {
                return;
            }
            let r = weight(name).and_then(|w| errors(x, &w, group).map_err(|e| mlx_err(name, e)));
            match r {
                Ok(e) => {
                    found.insert(name.to_string(), e);
                    if !hold.unlocked(|| progress(name, found.len(), total, ids.len())) {
                        cancelled = true;
                    }
                }
                Err(e) => failure = Some(e),
            }
        };
        // The model's observer records each linear layer's (lazy) input; each is evaluated and
        // measured in turn, so the gate is let go between modules.
        let mut cache = model.make_cache();
        model.observer().start();
        let hidden = model.forward(&tokens, &mut cache);
        let seen = model.observer().finish();
        let hidden = hidden.map_err(|e| mlx_err("calibration forward", e))?;
        for (name, x) in &seen {
            observe(name, x);
        }
        let heads: Vec<(&str, Array)> = wanted
            .values()
            .filter(|m| m.kind == LinearKind::LmHead || (m.kind == LinearKind::Embedding && tied))
            .map(|m| (m.name.as_str(), hidden.clone()))
            .collect();
        for (name, h) in heads {
            observe(name, &h);
        }
        let want_mtp = wanted.keys().any(|k| crate::model::qwen3_5::is_mtp(k));
        if want_mtp && model.has_mtp() && ids.len() > 1 {
            let t = ids.len() as i32;
            let h = hidden.slice_axis(1, 0, t - 1).map_err(|e| mlx_err("calibration", e))?;
            let next = tokens.slice_axis(1, 1, t).map_err(|e| mlx_err("calibration", e))?;
            if let Some(mut mc) = model.make_mtp_cache() {
                model.observer().start();
                let out = model.mtp_forward(&h, &next, &mut mc);
                let seen = model.observer().finish();
                out.map_err(|e| mlx_err("calibration MTP forward", e))?;
                for (name, x) in &seen {
                    observe(name, x);
                }
            }
        }
    }
    if let Some(e) = failure {
        return Err(e);
    }
    if cancelled {
        return Err(ConvertError::Cancelled);
    }
    // A tied embedding is also the output head: weigh its row-lookup error with the head error.
    let embed = modules.iter().find(|m| m.kind == LinearKind::Embedding);
    if let Some(m) = embed {
        let rows = embedding_errors(&weight(&m.name)?, &tokens, group).map_err(|e| mlx_err(&m.name, e))?;
        let merged = match found.get(&m.name) {
            Some(head) => head.iter().zip(&rows).map(|(&(b, h), &(_, r))| (b, 0.5 * (h + r))).collect(),
            None => rows,
        };
        found.insert(m.name.clone(), merged);
    }
    let mut out = Vec::with_capacity(modules.len());
    for m in modules {
        let errors = found
            .remove(&m.name)
            .ok_or_else(|| ConvertError::Calibration(format!("the forward pass never reached `{}`", m.name)))?;
        out.push(Sensitivity { module: m.name.clone(), params: m.params(), errors });
    }
    Ok(out)
}

fn mlx_err(context: &str, e: mlx::Error) -> ConvertError {
    ConvertError::Mlx { context: context.to_string(), error: e }
}

/// At most `MAX_ROWS` evenly spaced rows of `x` flattened to `[rows, in]`, in f32.
fn rows_of(x: &Array) -> mlx::Result<Array> {
    let inp = x.dim(-1);
    let x = x.reshape(&[-1, inp])?;
    let n = x.dim(0);
    let x = if n > MAX_ROWS {
        let step = n / MAX_ROWS;
        x.slice(&[0, 0], &[step * MAX_ROWS, inp], &[step, 1])?
    } else {
        x
    };
    x.as_dtype(Dtype::F32)
}

fn norm(a: &Array) -> mlx::Result<f64> {
    Ok(a.square()?.sum(&[], false)?.sqrt()?.item::<f32>()? as f64)
}

/// Relative output error of `x W^T` at every supported width.
fn errors(x: &Array, w: &Array, group: i32) -> mlx::Result<Vec<(u8, f64)>> {
    let x = rows_of(x)?;
    let y = x.matmul(&w.as_dtype(Dtype::F32)?.t()?)?;
    y.eval()?;
    let ny = norm(&y)?.max(1e-30);
    SUPPORTED_BITS
        .iter()
        .map(|&b| {
            let q = mlx::quantized::quantize(w, group, b as i32, QuantMode::Affine)?;
            let yq = x.matmul(&q.dequantize()?.as_dtype(Dtype::F32)?.t()?)?;
            Ok((b, norm(&yq.subtract(&y)?)? / ny))
        })
        .collect()
}

/// Relative error of the embedding rows the calibration tokens look up.
fn embedding_errors(w: &Array, tokens: &Array, group: i32) -> mlx::Result<Vec<(u8, f64)>> {
    let ids = tokens.reshape(&[-1])?;
    let rows = w.take(&ids, 0)?.as_dtype(Dtype::F32)?;
    let nr = norm(&rows)?.max(1e-30);
    SUPPORTED_BITS
        .iter()
        .map(|&b| {
            let q = mlx::quantized::quantize(w, group, b as i32, QuantMode::Affine)?;
            let rq = q.dequantize()?.take(&ids, 0)?.as_dtype(Dtype::F32)?;
            Ok((b, norm(&rq.subtract(&rows)?)? / nr))
        })
        .collect()
}
