//! The Qwen3.5 vision tower (`visual.*`): a Conv3d patch embedding (a linear map, since its stride is
//! its kernel), the learned position grid bilinearly resampled to each image, pre-LN ViT blocks with
//! 2-D rotary attention inside each image, and the merger that folds 2x2 patches into one token of the
//! text model's width. Also the M-RoPE position ids of a prompt that holds images.
//! Math: docs/MODEL.md §2.6 and §3.5; transformers' `Qwen3_5VisionModel`.

use mlx::fast::{self, Mask};
use mlx::{concatenate, Array, Dtype};
use serde::Deserialize;

use super::layers::{rotate_half, Embedding, Linear, Result};
use super::store::{Provenance, Store};
use super::LoadError;

/// An image's grid in patches: `[t, h, w]` (t = frames / temporal_patch_size, 1 for a still image).
pub type GridThw = [u32; 3];

fn default_channels() -> i32 {
    3
}
fn default_patch() -> i32 {
    16
}
fn default_two() -> i32 {
    2
}
fn default_positions() -> i32 {
    2304
}
fn default_act() -> String {
    "gelu_pytorch_tanh".into()
}

#[derive(Debug, Clone, Deserialize)]
struct VisionRope {
    #[serde(default)]
    rope_theta: Option<f32>,
}

/// `vision_config`, plus the image token id from the top level of config.json.
#[derive(Debug, Clone, Deserialize)]
pub struct VisionConfig {
    pub depth: usize,
    pub hidden_size: i32,
    pub intermediate_size: i32,
    pub num_heads: i32,
    #[serde(default = "default_channels")]
    pub in_channels: i32,
    #[serde(default = "default_patch")]
    pub patch_size: i32,
    #[serde(default = "default_two")]
    pub temporal_patch_size: i32,
    #[serde(default = "default_two")]
    pub spatial_merge_size: i32,
    pub out_hidden_size: i32,
    #[serde(default = "default_positions")]
    pub num_position_embeddings: i32,
    #[serde(default = "default_act")]
    pub hidden_act: String,
    #[serde(default)]
    pub deepstack_visual_indexes: Vec<i32>,
    #[serde(default)]
    rope_parameters: Option<VisionRope>,
    /// `image_token_id` (top level); None when config.json does not say.
    #[serde(skip)]
    pub image_token_id: Option<u32>,
}

impl VisionConfig {
    /// Reads `vision_config` of a config.json; None when there is none.
    pub fn from_json(v: &serde_json::Value) -> std::result::Result<Option<VisionConfig>, LoadError> {
        let Some(vc) = v.get("vision_config") else { return Ok(None) };
        let mut c: VisionConfig =
            serde_json::from_value(vc.clone()).map_err(|e| LoadError::Config(format!("vision_config: {e}")))?;
        c.image_token_id = v.get("image_token_id").and_then(|t| t.as_u64()).and_then(|t| u32::try_from(t).ok());
        let bad = |msg: String| Err(LoadError::Config(format!("vision_config: {msg}")));
        if !c.deepstack_visual_indexes.is_empty() {
            return bad(format!(
                "deepstack_visual_indexes {:?} is not supported (Qwen3.5 has none)",
                c.deepstack_visual_indexes
            ));
        }
        if c.num_heads <= 0 || c.hidden_size % c.num_heads != 0 || (c.hidden_size / c.num_heads) % 4 != 0 {
            return bad(format!(
                "hidden_size {} over num_heads {} must give a head dim divisible by 4",
                c.hidden_size, c.num_heads
            ));
        }
        let side = (c.num_position_embeddings as f64).sqrt() as i32;
        if side < 2 || side * side != c.num_position_embeddings {
            return bad(format!("num_position_embeddings {} is not a square grid", c.num_position_embeddings));
        }
        if c.spatial_merge_size < 1 || c.patch_size < 1 || c.temporal_patch_size < 1 || c.in_channels < 1 {
            return bad("patch_size, temporal_patch_size, spatial_merge_size and in_channels must be positive".into());
        }
        if !matches!(c.hidden_act.as_str(), "gelu_pytorch_tanh" | "gelu_new" | "gelu") {
            return bad(format!("hidden_act `{}` is not supported (gelu_pytorch_tanh, gelu)", c.hidden_act));
        }
        Ok(Some(c))
    }

    pub fn head_dim(&self) -> i32 {
        self.hidden_size / self.num_heads
    }
    /// Values per patch row of `pixel_values`: channels x frames x patch x patch (1536 for Qwen3.5).
    pub fn patch_dim(&self) -> i32 {
        self.in_channels * self.temporal_patch_size * self.patch_size * self.patch_size
    }
    fn rope_theta(&self) -> f32 {
        self.rope_parameters.as_ref().and_then(|r| r.rope_theta).unwrap_or(10_000.0)
    }
}

/// LayerNorm with weight and bias.
struct LayerNorm {
    weight: Array,
    bias: Array,
}

impl LayerNorm {
    fn load(s: &Store, p: &str, dim: i32) -> std::result::Result<Self, LoadError> {
        Ok(LayerNorm {
            weight: s.tensor(&format!("{p}.weight"), &[dim])?,
            bias: s.tensor(&format!("{p}.bias"), &[dim])?,
        })
    }
    fn forward(&self, x: &Array) -> Result<Array> {
        fast::layer_norm(x, Some(&self.weight), Some(&self.bias), 1e-6)
    }
}

struct Block {
    norm1: LayerNorm,
    norm2: LayerNorm,
    qkv: Linear,
    proj: Linear,
    fc1: Linear,
    fc2: Linear,
}

/// What [`VisionTower::encode_traced`] returns: the intermediate stages, for tests.
pub struct VisionTrace {
    /// The patch embedding, before the position embedding: `[patches, hidden]`.
    pub patch_embed: Array,
    /// The last block's output, before the merger: `[patches, hidden]`.
    pub blocks_out: Array,
    /// The merged features that replace the image pads: `[patches / merge^2, out_hidden]`.
    pub merged: Array,
}

pub struct VisionTower {
    pub config: VisionConfig,
    /// The Conv3d as a linear map `[hidden, C*T*P*P]`, rows flattened in PyTorch's (C, T, P, P) order.
    patch_embed: Linear,
    pos_embed: Embedding,
    blocks: Vec<Block>,
    merger_norm: LayerNorm,
    merger_fc1: Linear,
    merger_fc2: Linear,
    /// The dtype pixels are cast to (the patch embedding's).
    dtype: Dtype,
}

impl VisionTower {
    /// Loads `visual.*`; every tensor it asks for must be there with the expected shape.
    pub fn load(s: &Store, c: &VisionConfig) -> std::result::Result<Self, LoadError> {
        let (hv, iv) = (c.hidden_size, c.intermediate_size);
        let (ch, t, p) = (c.in_channels, c.temporal_patch_size, c.patch_size);
        let name = "visual.patch_embed.proj.weight";
        // PyTorch's Conv3d weight is [out, C, T, P, P] (raw checkpoints, and Tandem's converter, which
        // keeps vision tensors as they are); mlx-vlm transposes it to MLX's [out, T, P, P, C].
        let w = match s.tensor(name, &[hv, ch, t, p, p]) {
            Err(torch @ LoadError::Shape { .. }) if s.provenance(name) == Some(Provenance::Mlx) => {
                s.tensor(name, &[hv, t, p, p, ch]).map_err(|_| torch)?.transpose(&[0, 4, 1, 2, 3])
            }
            w => Ok(w?),
        };
        let weight = w.and_then(|w| w.reshape(&[hv, c.patch_dim()])).map_err(|e| mlx_err(name, e))?;
        let dtype = weight.dtype();
        let patch_embed = Linear::Dense { weight, bias: Some(s.tensor("visual.patch_embed.proj.bias", &[hv])?) };
        let blocks = (0..c.depth)
            .map(|j| {
                let b = format!("visual.blocks.{j}");
                Ok(Block {
                    norm1: LayerNorm::load(s, &format!("{b}.norm1"), hv)?,
                    norm2: LayerNorm::load(s, &format!("{b}.norm2"), hv)?,
                    qkv: s.linear(&format!("{b}.attn.qkv"), 3 * hv, hv, true)?,
                    proj: s.linear(&format!("{b}.attn.proj"), hv, hv, true)?,
                    fc1: s.linear(&format!("{b}.mlp.linear_fc1"), iv, hv, true)?,
                    fc2: s.linear(&format!("{b}.mlp.linear_fc2"), hv, iv, true)?,
                })
            })
            .collect::<std::result::Result<Vec<_>, LoadError>>()?;
        let m = hv * c.spatial_merge_size * c.spatial_merge_size;
        Ok(VisionTower {
            patch_embed,
            pos_embed: s.embedding("visual.pos_embed", c.num_position_embeddings, hv)?,
            blocks,
            merger_norm: LayerNorm::load(s, "visual.merger.norm", hv)?,
            merger_fc1: s.linear("visual.merger.linear_fc1", m, m, true)?,
            merger_fc2: s.linear("visual.merger.linear_fc2", c.out_hidden_size, m, true)?,
            dtype,
            config: c.clone(),
        })
    }

    /// Merged features `[sum of t*h*w / merge^2, out_hidden]` for images whose patches are stacked
    /// in `pixel_values` `[sum of t*h*w, C*T*P*P]`, in order.
    pub fn encode(&self, pixel_values: &Array, grids: &[GridThw]) -> Result<Array> {
        Ok(self.encode_traced(pixel_values, grids)?.merged)
    }

    /// [`encode`](Self::encode), keeping the intermediate stages.
    pub fn encode_traced(&self, pixel_values: &Array, grids: &[GridThw]) -> Result<VisionTrace> {
        let c = &self.config;
        let merge = c.spatial_merge_size as u32;
        let total: u64 = grids.iter().map(|g| g.iter().map(|&d| d as u64).product::<u64>()).sum();
        if grids.is_empty() || pixel_values.shape() != [total as i32, c.patch_dim()] {
            return Err(mlx::Error::Invalid(format!(
                "pixel_values has shape {:?}, but {} image grid(s) {grids:?} need [{total}, {}]",
                pixel_values.shape(),
                grids.len(),
                c.patch_dim()
            )));
        }
        if let Some(g) =
            grids.iter().find(|g| g[0] == 0 || g[1] == 0 || g[2] == 0 || g[1] % merge != 0 || g[2] % merge != 0)
        {
            return Err(mlx::Error::Invalid(format!(
                "image grid {g:?}: h and w must be positive multiples of the merge size {merge}"
            )));
        }
        let (mut patch, mut out, mut merged) = (Vec::new(), Vec::new(), Vec::new());
        let mut start = 0;
        for g in grids {
            let n = (g[0] * g[1] * g[2]) as i32;
            let trace = self.encode_one(&pixel_values.slice_axis(0, start, start + n)?, *g)?;
            start += n;
            patch.push(trace.patch_embed);
            out.push(trace.blocks_out);
            merged.push(trace.merged);
        }
        let cat = |v: &Vec<Array>| concatenate(&v.iter().collect::<Vec<_>>(), 0);
        Ok(VisionTrace { patch_embed: cat(&patch)?, blocks_out: cat(&out)?, merged: cat(&merged)? })
    }

    /// One image: attention never crosses images (nor frames), so each is encoded alone.
    fn encode_one(&self, pixels: &Array, g: GridThw) -> Result<VisionTrace> {
        let c = &self.config;
        let (hv, heads, hd) = (c.hidden_size, c.num_heads, c.head_dim());
        let (frames, per_frame) = (g[0] as i32, (g[1] * g[2]) as i32);
        let n = frames * per_frame;
        let patch_embed = self.patch_embed.forward(&pixels.as_dtype(self.dtype)?)?;
        let (rows, cols) = merge_order(g, c.spatial_merge_size as u32);
        let mut x = patch_embed.add(&self.position_embedding(&rows, &cols, g)?.as_dtype(patch_embed.dtype())?)?;
        let (cos, sin) = self.rotary(&rows, &cols)?;
        let scale = 1.0 / (hd as f32).sqrt();
        for b in &self.blocks {
            let qkv = b.qkv.forward(&b.norm1.forward(&x)?)?.reshape(&[n, 3, heads, hd])?;
            let parts = qkv.split(3, 1)?;
            // [frames, heads, h*w, hd]: each frame attends within itself (transformers' cu_seqlens).
            let per = |a: &Array| a.reshape(&[frames, per_frame, heads, hd])?.transpose(&[0, 2, 1, 3]);
            let q = per(&rotate(&parts[0].squeeze(&[1])?, &cos, &sin)?)?;
            let k = per(&rotate(&parts[1].squeeze(&[1])?, &cos, &sin)?)?;
            let v = per(&parts[2].squeeze(&[1])?)?;
            let o = fast::scaled_dot_product_attention(&q, &k, &v, scale, Mask::None)?;
            let o = o.transpose(&[0, 2, 1, 3])?.reshape(&[n, hv])?;
            x = x.add(&b.proj.forward(&o)?)?;
            let h = b.fc1.forward(&b.norm2.forward(&x)?)?;
            let h = if c.hidden_act == "gelu" { h.gelu()? } else { h.gelu_tanh()? };
            x = x.add(&b.fc2.forward(&h)?)?;
        }
        let m = c.spatial_merge_size * c.spatial_merge_size;
        let y = self.merger_norm.forward(&x)?.reshape(&[n / m, m * hv])?;
        let merged = self.merger_fc2.forward(&self.merger_fc1.forward(&y)?.gelu()?)?;
        Ok(VisionTrace { patch_embed, blocks_out: x, merged })
    }

    /// The learned `side x side` grid resampled to the image's `h x w` patches (bilinear,
    /// align_corners=True, as transformers does), one row per patch in merge-window order.
    fn position_embedding(&self, rows: &[u32], cols: &[u32], g: GridThw) -> Result<Array> {
        let side = (self.config.num_position_embeddings as f64).sqrt() as u32;
        let taps = |i: u32, size: u32| -> ([u32; 2], [f32; 2]) {
            let src = i as f32 * (side - 1) as f32 / (size.max(2) - 1) as f32;
            let f = src.floor();
            let frac = src - f;
            let w1 = (1.0 - (frac - 1.0).abs()).max(0.0);
            ([f as u32, (f as u32 + 1).min(side - 1)], [(1.0 - frac).max(0.0), w1])
        };
        let n = rows.len();
        let (mut idx, mut wts) = (Vec::with_capacity(4 * n), Vec::with_capacity(4 * n));
        for (&r, &c) in rows.iter().zip(cols) {
            let ((hi, hw), (wi, ww)) = (taps(r, g[1]), taps(c, g[2]));
            for a in 0..2 {
                for b in 0..2 {
                    idx.push((hi[a] * side + wi[b]) as i32);
                    wts.push(hw[a] * ww[b]);
                }
            }
        }
        let rows = self.pos_embed.forward(&Array::from_slice(&idx, &[4 * n as i32])?)?.reshape(&[n as i32, 4, -1])?;
        let w = Array::from_slice(&wts, &[n as i32, 4, 1])?;
        rows.as_dtype(Dtype::F32)?.multiply(&w)?.sum(&[1], false)
    }

    /// cos and sin `[patches, head_dim]` (f32) of the 2-D rotary: the first quarter of the frequencies
    /// turn with the patch row, the second with its column, and the pattern repeats for rotate-half.
    fn rotary(&self, rows: &[u32], cols: &[u32]) -> Result<(Array, Array)> {
        let hd = self.config.head_dim() as usize;
        let theta = self.config.rope_theta();
        let quarter = hd / 4;
        let inv: Vec<f32> = (0..quarter).map(|j| 1.0 / theta.powf((2 * j) as f32 / (hd / 2) as f32)).collect();
        let mut angles = Vec::with_capacity(rows.len() * hd);
        for (&r, &c) in rows.iter().zip(cols) {
            let half: Vec<f32> = inv.iter().map(|f| r as f32 * f).chain(inv.iter().map(|f| c as f32 * f)).collect();
            angles.extend_from_slice(&half);
            angles.extend_from_slice(&half);
        }
        let a = Array::from_slice(&angles, &[rows.len() as i32, hd as i32])?;
        Ok((a.cos()?, a.sin()?))
    }
}

/// `x * cos + rotate_half(x) * sin` over the whole head dim, in f32, for x `[N, heads, hd]`.
fn rotate(x: &Array, cos: &Array, sin: &Array) -> Result<Array> {
    let dt = x.dtype();
    let xf = x.as_dtype(Dtype::F32)?;
    let rotated = rotate_half(&xf)?;
    let (cos, sin) = (cos.expand_dims(&[1])?, sin.expand_dims(&[1])?);
    xf.multiply(&cos)?.add(&rotated.multiply(&sin)?)?.as_dtype(dt)
}

/// Each patch's (row, col) in the order the processor emits patches: merge window by merge window
/// (row-major over windows, row-major inside one), repeated for every frame.
pub fn merge_order(g: GridThw, merge: u32) -> (Vec<u32>, Vec<u32>) {
    let [t, h, w] = g;
    let n = (t * h * w) as usize;
    let (mut rows, mut cols) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..t {
        for br in 0..h / merge {
            for bc in 0..w / merge {
                for ir in 0..merge {
                    for ic in 0..merge {
                        rows.push(br * merge + ir);
                        cols.push(bc * merge + ic);
                    }
                }
            }
        }
    }
    (rows, cols)
}

/// M-RoPE position ids of a prompt (transformers' `get_rope_index`): text advances all three axes
/// together; the `t*(h/m)*(w/m)` pads of an image get `(start + t, start + row, start + col)`, and the
/// text after it resumes at `start + max(h, w)/m`. Returns the rows (t, h, w) and the rope delta
/// `max position + 1 - tokens`, which positions every later token at `index + delta`.
pub fn rope_index(
    ids: &[u32],
    image_token_id: u32,
    grids: &[GridThw],
    merge: u32,
) -> std::result::Result<([Vec<i32>; 3], i32), String> {
    let mut pos: [Vec<i32>; 3] =
        [Vec::with_capacity(ids.len()), Vec::with_capacity(ids.len()), Vec::with_capacity(ids.len())];
    let (mut next, mut i, mut images) = (0i64, 0usize, grids.iter().enumerate());
    while i < ids.len() {
        if ids[i] != image_token_id {
            for axis in &mut pos {
                axis.push(next as i32);
            }
            next += 1;
            i += 1;
            continue;
        }
        let (k, g) = images.next().ok_or_else(|| {
            format!("the prompt has more image pad tokens (id {image_token_id}) than the {} image(s)", grids.len())
        })?;
        let (t, h, w) = (g[0], g[1] / merge.max(1), g[2] / merge.max(1));
        let n = (t * h * w) as usize;
        if ids.len() < i + n || ids[i..i + n].iter().any(|&id| id != image_token_id) {
            return Err(format!("image {} (grid {g:?}) needs {n} consecutive pad tokens (id {image_token_id}) at token {i}; the prompt has fewer", k + 1));
        }
        for ti in 0..t {
            for r in 0..h {
                for c in 0..w {
                    pos[0].push((next + ti as i64) as i32);
                    pos[1].push((next + r as i64) as i32);
                    pos[2].push((next + c as i64) as i32);
                }
            }
        }
        next += h.max(w) as i64;
        i += n;
    }
    if images.next().is_some() {
        return Err(format!("the prompt has fewer image pad runs than the {} image(s)", grids.len()));
    }
    let max = pos.iter().flat_map(|a| a.iter()).copied().max().unwrap_or(-1);
    Ok((pos, max + 1 - ids.len() as i32))
}

fn mlx_err(context: &str, e: mlx::Error) -> LoadError {
    LoadError::Mlx { context: context.to_string(), error: e }
}
