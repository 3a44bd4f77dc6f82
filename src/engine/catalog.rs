//! What a model folder holds, read without loading it: format, size, quantization, whether it can
//! read images and whether its MTP head can run. Cheap: only config.json and safetensors headers.

use std::path::Path;

use serde::Serialize;
use ts_rs::TS;

use crate::model::mtp_head::HeadFiles;
use crate::model::qwen3_5::{self, Config};
use crate::model::weights::Checkpoint;
use crate::model::Layout;

/// A model folder as found on disk.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct FolderInfo {
    /// "hf" or "mlx"; None when the folder could not be read.
    pub format: Option<Layout>,
    /// Bytes of the weight files (`*.safetensors`).
    pub size_bytes: u64,
    /// config.json's `quantization` block, summarized: `{"bits", "group_size", "mode"?, "mixed"}`
    /// (`mixed`: some modules have their own bits; `bits` is then the default), or null.
    pub quantization: Option<QuantizationSummary>,
    /// The checkpoint's declared dtype (`torch_dtype` / `dtype`), when it names one.
    pub dtype: Option<String>,
    /// The config declares a vision tower.
    pub vision: bool,
    /// Whether the files hold a complete MTP head, and if not, why.
    pub mtp_available: bool,
    pub mtp_reason: Option<String>,
    /// What the conversion that wrote the folder measured of its head (config.json's
    /// `tandem.mtp.probe`, see `quant::convert`).
    pub mtp_probe: Option<crate::model::mtp_head::probe::ProbeReport>,
    /// The model's context length, when its config states one.
    pub context_length: Option<u64>,
    /// The model card's `base_model` (README.md's front matter): for a conversion, the repo it came from.
    pub base_model: Option<String>,
    /// Why the folder could not be read (the other fields are then partial).
    pub error: Option<String>,
}

/// Reads what can be known of the model in `dir` without loading it.
pub fn inspect_folder(dir: &Path) -> FolderInfo {
    let mut info = FolderInfo { size_bytes: weight_bytes(dir), base_model: card_base_model(dir), ..Default::default() };
    let config = match crate::model::read_config(dir) {
        Ok(config) => config,
        Err(e) => {
            info.error = Some(e.to_string());
            return info;
        }
    };
    let text = config.get("text_config").unwrap_or(&config);
    let field = |name: &str| text.get(name).or_else(|| config.get(name));
    info.quantization =
        config.get("quantization").or_else(|| config.get("quantization_config")).and_then(summarize_quantization);
    info.dtype = ["torch_dtype", "dtype"].iter().find_map(|k| field(k).and_then(|v| v.as_str()).map(str::to_owned));
    info.vision = config.get("vision_config").is_some();
    info.context_length = field("max_position_embeddings").and_then(|v| v.as_u64());
    info.mtp_probe = crate::model::mtp_head::probe::recorded(&config);

    let checkpoint = match Checkpoint::open(dir) {
        Ok(c) => c,
        Err(e) => {
            info.error = Some(e.to_string());
            info.mtp_reason = Some("the weights could not be read".into());
            return info;
        }
    };
    info.format = match checkpoint.layout() {
        Ok(layout) => Some(layout),
        Err(e) => {
            info.error = Some(e.to_string());
            None
        }
    };
    let layout = info.format.unwrap_or(Layout::Hf);
    let names: std::collections::BTreeSet<String> =
        checkpoint.tensors.keys().map(|k| qwen3_5::sanitize(k, layout).0).collect();
    let present = names.iter().filter(|n| qwen3_5::is_mtp(n)).count();
    info.mtp_reason = match Config::from_json(&config) {
        Ok(c) => HeadFiles::judge(&c.text, &|n| names.contains(n), present).reason,
        Err(e) => Some(e.to_string()),
    };
    info.mtp_available = info.mtp_reason.is_none();
    info
}

/// `base_model` of a model card's front matter (`base_model: ORG/NAME`, or the first of a list), when
/// it names a Hugging Face repo.
pub fn card_base_model(dir: &Path) -> Option<String> {
    let text = crate::model::files::read_if_present(&dir.join("README.md")).ok()??;
    let front = text.strip_prefix("---")?.split("\n---").next()?;
    let mut lines = front.lines().skip_while(|l| !l.starts_with("base_model:"));
    let first = lines.next()?.trim_start_matches("base_model:").trim();
    let value =
        if first.is_empty() { lines.next()?.trim().strip_prefix("- ")?.trim().to_owned() } else { first.to_owned() };
    let value = value.trim_matches(|c| c == '"' || c == '\'').to_owned();
    value.parse::<crate::hub::RepoRef>().ok().filter(|_| !value.contains('@')).map(|_| value)
}

/// A quantization block (`quantization` or `quantization_config` of config.json), summarized.
#[derive(Debug, Clone, Default, Serialize, PartialEq, TS)]
pub struct QuantizationSummary {
    /// The default bit width (mixed models give some modules their own).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[ts(optional)]
    pub bits: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[ts(optional)]
    pub group_size: Option<u64>,
    /// MLX's quantization mode (`affine`), when the block names one.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[ts(optional)]
    pub mode: Option<String>,
    /// Some modules have their own bits.
    pub mixed: bool,
    /// The smallest and largest bit widths of any module, the default included (a mixed recipe's
    /// range, e.g. 4 and 6).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[ts(optional)]
    pub bits_range: Option<(u64, u64)>,
    /// The block's other plain values as written (e.g. `quant_method` of a Hugging Face checkpoint).
    #[serde(flatten)]
    #[ts(skip)]
    pub other: serde_json::Map<String, serde_json::Value>,
}

/// The block's defaults, without mlx-lm's per-module entries (objects keyed by module path).
/// A block that is not an object says nothing usable: None.
fn summarize_quantization(block: &serde_json::Value) -> Option<QuantizationSummary> {
    let mut out = QuantizationSummary::default();
    let map = block.as_object()?;
    let mut widths = Vec::new();
    for (k, v) in map {
        if v.is_object() || v.is_boolean() && k.contains('.') {
            out.mixed |= v.is_object();
            if let Some(b) = v.get("bits").and_then(|b| b.as_u64()) {
                widths.push(b);
            }
            continue;
        }
        match (k.as_str(), v) {
            ("bits", v) if v.is_u64() => out.bits = v.as_u64(),
            ("group_size", v) if v.is_u64() => out.group_size = v.as_u64(),
            ("mode", serde_json::Value::String(mode)) => out.mode = Some(mode.clone()),
            _ => {
                out.other.insert(k.clone(), v.clone());
            }
        }
    }
    widths.extend(out.bits);
    out.bits_range = widths.iter().min().zip(widths.iter().max()).map(|(&lo, &hi)| (lo, hi));
    Some(out)
}

/// Total size of the `*.safetensors` files directly in `dir` (0 when unreadable).
pub fn weight_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "safetensors"))
        .filter_map(|e| e.metadata().ok())
        .filter(|m| m.is_file())
        .map(|m| m.len())
        .sum()
}

/// Tokens of context a fit makes room for (capped by the model's own context length): enough for a
/// long chat or a coding agent's prompt; a person who needs more sees the figure grow with it.
pub const PLANNED_CONTEXT: u64 = 32_768;

/// What one sequence's caches take at a context of `tokens`, from config.json: K and V of every
/// full-attention layer and of the MTP head's layers, in bf16 (the activations' dtype whatever the
/// weights' quantization), plus the fixed-size state of every linear-attention layer (the recurrent state
/// in fp32, the convolution's window in bf16). None when the config is not one Tandem reads.
pub fn state_bytes(config: &serde_json::Value, tokens: u64) -> Option<u64> {
    let c = Config::from_json(config).ok()?;
    let t = &c.text;
    let full = c.full_attention.iter().filter(|&&f| f).count() as u64 + t.mtp_num_hidden_layers as u64;
    let linear = c.full_attention.iter().filter(|&&f| !f).count() as u64;
    let kv_per_token = 2 * t.num_key_value_heads as u64 * t.head_dim as u64 * 2;
    let (hk, hv, dk, dv) = (
        t.linear_num_key_heads as u64,
        t.linear_num_value_heads as u64,
        t.linear_key_head_dim as u64,
        t.linear_value_head_dim as u64,
    );
    let conv_dim = 2 * hk * dk + hv * dv;
    let linear_state = hv * dk * dv * 4 + conv_dim * (t.linear_conv_kernel_dim.max(1) as u64 - 1) * 2;
    Some(full * kv_per_token * tokens + linear * linear_state)
}

/// The context a fit plans for: [`PLANNED_CONTEXT`], or less when the model's own is shorter.
pub fn planned_context(config: &serde_json::Value) -> u64 {
    let text = config.get("text_config").unwrap_or(config);
    let own = text.get("max_position_embeddings").or_else(|| config.get("max_position_embeddings"));
    own.and_then(|v| v.as_u64()).map_or(PLANNED_CONTEXT, |n| n.min(PLANNED_CONTEXT))
}

/// Memory a model needs once loaded: its weights and the caches of its context (`state_bytes`), plus a
/// margin for activations and MLX's buffers.
pub fn memory_needed(weight_bytes: u64, state_bytes: u64) -> u64 {
    const MARGIN_FIXED: u64 = 256 << 20;
    weight_bytes + weight_bytes / 10 + state_bytes + MARGIN_FIXED
}

/// Whether weights of `weight_bytes` run on a machine of `total_memory` bytes, and, for unquantized
/// (bf16) weights that do not, the widest quantization that would: a download's answer to "does this
/// fit my machine?" before its 17 GB arrive.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, ts_rs::TS)]
pub struct Fit {
    /// Memory the model needs loaded as it is ([`memory_needed`]).
    pub need: u64,
    pub fits: bool,
    /// For bf16 weights that do not fit: the most bits (8, 6, 5, 4, 3) whose conversion would.
    pub recommended_bits: Option<u8>,
    /// Of `need`, what the caches of `context_tokens` of context take (0 when the model's shape was
    /// not known: the figure is then the weights' alone).
    pub state_bytes: u64,
    pub context_tokens: u64,
}

/// At most this share of the machine's memory goes to one model: the system and the app need the rest.
const MEMORY_SHARE: f64 = 0.75;

/// The fit of weights alone (the shape unknown: no room counted for the context).
pub fn fit(weight_bytes: u64, unquantized: bool, total_memory: u64) -> Fit {
    fit_with_state(weight_bytes, unquantized, total_memory, 0, 0)
}

/// The fit of a model whose config.json is known: its weights and the caches of [`planned_context`].
pub fn fit_for_config(weight_bytes: u64, config: &serde_json::Value, total_memory: u64) -> Fit {
    let unquantized = config.get("quantization").is_none() && config.get("quantization_config").is_none();
    let context = planned_context(config);
    match state_bytes(config, context) {
        Some(state) => fit_with_state(weight_bytes, unquantized, total_memory, state, context),
        None => fit(weight_bytes, unquantized, total_memory),
    }
}

fn fit_with_state(weight_bytes: u64, unquantized: bool, total_memory: u64, state: u64, context: u64) -> Fit {
    let budget = (total_memory as f64 * MEMORY_SHARE) as u64;
    let need = memory_needed(weight_bytes, state);
    let fits = total_memory == 0 || need <= budget;
    // bf16: 16 bits a weight; an affine width b with groups of 64 costs b + 0.5 (a bf16 scale and bias).
    let recommended_bits = (!fits && unquantized).then(|| {
        [8u8, 6, 5, 4, 3].into_iter().find(|&b| memory_needed(quantized_bytes(weight_bytes, b), state) <= budget)
    });
    Fit { need, fits, recommended_bits: recommended_bits.flatten(), state_bytes: state, context_tokens: context }
}

/// What bf16 weights of `bf16_bytes` take affine-quantized to `bits` with groups of 64.
pub fn quantized_bytes(bf16_bytes: u64, bits: u8) -> u64 {
    (bf16_bytes as f64 * (bits as f64 + 0.5) / 16.0) as u64
}

/// Memory the model in `dir` needs loaded: its weights, plus the caches of [`planned_context`] when
/// its config.json is readable.
pub fn folder_need(dir: &Path) -> u64 {
    let weights = weight_bytes(dir);
    let state = crate::model::read_config(dir).ok().and_then(|c| state_bytes(&c, planned_context(&c)));
    memory_needed(weights, state.unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_fit_recommends_the_widest_quantization_that_runs() {
        const GB: u64 = 1_000_000_000;
        // 54 GB of bf16 (a 27B model) on a 64 GB machine: 48 GB usable; 8 bits needs ~31.8 GB with its margins.
        let f = fit(54 * GB, true, 64 * GB);
        assert!(!f.fits && f.need > 54 * GB, "{f:?}");
        assert_eq!(f.recommended_bits, Some(8));
        // On 32 GB (24 usable): 6 bits needs ~24.4 GB, too much; 5 bits (~20.7 GB) runs.
        assert_eq!(fit(54 * GB, true, 32 * GB).recommended_bits, Some(5));
        // On 16 GB (12 usable): even 3 bits needs ~13.3 GB: nothing runs.
        assert_eq!(fit(54 * GB, true, 16 * GB).recommended_bits, None);
        // Already quantized weights get no recommendation; weights that fit need none.
        assert_eq!(fit(54 * GB, false, 32 * GB).recommended_bits, None);
        assert!(fit(8 * GB, true, 32 * GB).fits);
        // Unknown memory is no reason to refuse.
        assert!(fit(54 * GB, true, 0).fits);
    }

    #[test]
    fn a_card_names_its_base_model_inline_or_as_a_list() {
        let dir = tempfile::tempdir().unwrap();
        let card = |text: &str| {
            std::fs::write(dir.path().join("README.md"), text).unwrap();
            card_base_model(dir.path())
        };
        assert_eq!(
            card("---\nlicense: apache-2.0\nbase_model: Qwen/Qwen3.5-27B\ntags:\n- mlx\n---\n# x"),
            Some("Qwen/Qwen3.5-27B".into())
        );
        assert_eq!(card("---\nbase_model:\n- 'Qwen/Qwen3.5-4B'\n- other/one\n---\n"), Some("Qwen/Qwen3.5-4B".into()));
        assert_eq!(card("# no front matter\nbase_model: Qwen/Qwen3.5-4B\n"), None);
        assert_eq!(card("---\nbase_model: not a repo\n---\n"), None);
        // A key further down the card (after the front matter) is not the card's.
        assert_eq!(card("---\nlicense: mit\n---\nbase_model: Qwen/Qwen3.5-4B\n"), None);
    }

    #[test]
    fn state_grows_with_the_context_and_counts_every_layer_kind() {
        // The 27B shape (docs/MODEL.md): 16 full-attention layers of 4 KV heads of 256, 48 linear ones, one MTP layer.
        let config = json!({"text_config": {
            "hidden_size": 5120, "intermediate_size": 17408, "num_hidden_layers": 64, "vocab_size": 248320,
            "full_attention_interval": 4, "linear_num_key_heads": 16, "linear_num_value_heads": 48,
            "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
            "num_attention_heads": 24, "num_key_value_heads": 4, "head_dim": 256, "mtp_num_hidden_layers": 1,
            "max_position_embeddings": 262144}});
        let kv_per_token = 17 * 2 * 4 * 256 * 2; // K and V in bf16, 16 layers + the head's
        let linear = 48 * (48 * 128 * 128 * 4 + (2 * 16 * 128 + 48 * 128) * 3 * 2);
        assert_eq!(state_bytes(&config, 0), Some(linear));
        assert_eq!(state_bytes(&config, 1000), Some(linear + 1000 * kv_per_token));
        assert_eq!(planned_context(&config), PLANNED_CONTEXT);
        let f = fit_for_config(15_000_000_000, &config, 32_000_000_000);
        assert_eq!((f.context_tokens, f.state_bytes), (PLANNED_CONTEXT, linear + PLANNED_CONTEXT * kv_per_token));
        assert_eq!(f.need, memory_needed(15_000_000_000, f.state_bytes));
        assert!(f.state_bytes > 2_000_000_000, "a 32k context of the 27B shape takes ~2.3 GB: {f:?}");
        // A short model context caps the planned one; not a Qwen3.5 config: weights only.
        let short = json!({"text_config": {"max_position_embeddings": 4096}});
        assert_eq!(planned_context(&short), 4096);
        assert_eq!(fit_for_config(1 << 30, &short, 1 << 40).state_bytes, 0);
    }

    #[test]
    fn quantization_blocks_are_summarized_keeping_their_other_values() {
        // mlx-lm's mixed block: defaults plus per-module objects.
        let mixed = json!({"group_size": 64, "bits": 4, "mode": "affine", "model.layers.0.mlp.up_proj": {"bits": 6, "group_size": 64}});
        let q = summarize_quantization(&mixed).unwrap();
        assert_eq!((q.bits, q.group_size, q.mode.as_deref(), q.mixed), (Some(4), Some(64), Some("affine"), true));
        assert_eq!(q.bits_range, Some((4, 6)), "the default and the module's own bits");
        assert!(q.other.is_empty(), "{:?}", q.other);
        // A Hugging Face block: what it names besides bits stays in the JSON as written.
        let hf = json!({"quant_method": "awq", "bits": 4});
        let q = summarize_quantization(&hf).unwrap();
        assert_eq!((q.bits, q.mixed), (Some(4), false));
        assert_eq!(
            serde_json::to_value(&q).unwrap(),
            json!({"bits": 4, "mixed": false, "bits_range": [4, 4], "quant_method": "awq"})
        );
        // Not an object: nothing to show.
        assert_eq!(summarize_quantization(&json!("4bit")), None);
        assert_eq!(summarize_quantization(&json!(null)), None);
    }
}
