//! Prefill: the prompt (and its images) through the model in chunks, filling the caches. A
//! [`Prefilling`] can be advanced a chunk at a time, so a running batch keeps decoding between a
//! newcomer's chunks (the engine's worker interleaves them).

use mlx::Array;

use super::error::{GenerateError, Result};
use crate::cache::LayerCache;
use crate::model::qwen3_5::set_rope_delta;
use crate::model::vision::{rope_index, GridThw};
use crate::model::vision_input::ImageInput;
use crate::model::Qwen35;

/// A prompt part way through prefill: what is left to feed, and the hidden states so far.
pub struct Prefilling {
    input: Input,
    /// Positions fed so far.
    done: i32,
    total: i32,
    /// Post-norm hidden states of each chunk fed.
    parts: Vec<Array>,
}

enum Input {
    Ids(Vec<i32>),
    /// Embeddings `[1, T, D]` with the images' features in place of their pads, the M-RoPE
    /// positions `[3, T]`, and the rope delta the caches keep once every position is in.
    Embedded {
        h: Array,
        positions: Array,
        delta: i32,
    },
}

impl Prefilling {
    /// A text prompt (the tokens after whatever the caches hold already).
    pub fn text(prompt: &[u32]) -> Prefilling {
        let ids: Vec<i32> = prompt.iter().map(|&t| t as i32).collect();
        Prefilling { total: ids.len() as i32, input: Input::Ids(ids), done: 0, parts: Vec::new() }
    }

    /// Tokens still to feed.
    pub fn left(&self) -> usize {
        (self.total - self.done) as usize
    }

    /// Tokens fed so far.
    pub fn fed(&self) -> usize {
        self.done as usize
    }

    /// A prompt without images.
    pub fn is_text(&self) -> bool {
        matches!(self.input, Input::Ids(_))
    }

    /// Feeds the next `chunk` tokens (at most) and evaluates the caches, so the step's work is
    /// done when it returns; returns the chunk's hidden states `[1, n, D]`.
    pub fn advance(&mut self, model: &Qwen35, cache: &mut [LayerCache], chunk: usize) -> Result<Array> {
        let from = self.done;
        let end = (from + chunk.max(1) as i32).min(self.total);
        if end <= from {
            return Err(mlx::Error::Invalid("prefill advanced past the prompt's end".into()).into());
        }
        let h = match &self.input {
            Input::Ids(ids) => {
                let part = &ids[from as usize..end as usize];
                model.forward(&Array::from_slice(part, &[1, part.len() as i32])?, cache)?
            }
            Input::Embedded { h, positions, .. } => model.forward_embeddings_at(
                &h.slice_axis(1, from, end)?,
                cache,
                &positions.slice_axis(1, from, end)?,
            )?,
        };
        let mut arrays: Vec<&Array> = cache.iter().flat_map(|c| c.arrays()).collect();
        arrays.push(&h);
        mlx::device::eval(&arrays)?;
        self.parts.push(h.clone());
        self.done = end;
        Ok(h)
    }

    /// After the last chunk: every fed position's hidden state `[1, T, D]` (the MTP head is primed
    /// on all of them); the caches keep an image prompt's rope delta.
    pub fn finish(self, cache: &mut [LayerCache]) -> Result<Array> {
        if self.left() > 0 {
            return Err(mlx::Error::Invalid(format!("prefill finished with {} tokens left", self.left())).into());
        }
        if let Input::Embedded { delta, .. } = self.input {
            set_rope_delta(cache, delta);
        }
        let refs: Vec<&Array> = self.parts.iter().collect();
        Ok(mlx::concatenate(&refs, 1)?)
    }

    /// The hidden state `[1, 1, D]` at the last position fed (None before the first chunk).
    pub fn last_hidden(&self) -> Option<Array> {
        let part = self.parts.last()?;
        let n = part.dim(1);
        part.slice_axis(1, n - 1, n).ok()
    }

    /// [`Prefilling::finish`] that returns only the last position's hidden state `[1, 1, D]`.
    pub fn finish_last(self, cache: &mut [LayerCache]) -> Result<Array> {
        if self.left() > 0 {
            return Err(mlx::Error::Invalid(format!("prefill finished with {} tokens left", self.left())).into());
        }
        let last = self.last_hidden().ok_or_else(|| mlx::Error::Invalid("an empty prefill".into()))?;
        if let Input::Embedded { delta, .. } = self.input {
            set_rope_delta(cache, delta);
        }
        Ok(last)
    }

    /// Advances to the end in chunks of `chunk` and finishes.
    pub fn run(mut self, model: &Qwen35, cache: &mut [LayerCache], chunk: usize) -> Result<Array> {
        while self.left() > 0 {
            self.advance(model, cache, chunk)?;
        }
        self.finish(cache)
    }
}

/// Runs the prompt through the model in chunks; returns the post-norm hidden states of every position.
pub fn prefill(model: &Qwen35, prompt: &[u32], cache: &mut [LayerCache], chunk: usize) -> Result<Array> {
    Prefilling::text(prompt).run(model, cache, chunk)
}

pub(super) fn no_vision(model: &Qwen35) -> GenerateError {
    GenerateError::NoVision { model: model.name().to_string(), reason: model.vision_status.clone() }
}

/// [`prefill`] for a prompt with images (its pads already expanded, one per vision feature), from
/// token `start` on (the caches already hold the tokens before it, a restored prefix that ends
/// outside any image): the vision tower's features replace the pads' embeddings, positions follow
/// M-RoPE, and every KV cache keeps the rope delta so that decoding continues after the images'
/// largest position. Only the images after `start` are encoded.
pub fn prefill_images(
    model: &Qwen35,
    prompt: &[u32],
    start: usize,
    images: &[ImageInput],
    cache: &mut [LayerCache],
    chunk: usize,
) -> Result<Array> {
    Prefilling::images(model, prompt, start, images)?.run(model, cache, chunk)
}

impl Prefilling {
    /// A prompt with images from token `start` on, as [`prefill_images`] feeds it. The vision
    /// tower runs with the first chunk.
    pub fn images(model: &Qwen35, prompt: &[u32], start: usize, images: &[ImageInput]) -> Result<Prefilling> {
        let vision = model.vision().ok_or_else(|| no_vision(model))?;
        let vc = &vision.config;
        let image_id = vc.image_token_id.ok_or_else(|| {
            GenerateError::Images(format!("model `{}`: config.json has no image_token_id", model.name()))
        })?;
        for img in images {
            let expected = (vc.patch_dim() as usize, vc.spatial_merge_size as u32);
            if (img.patch_dim, img.merge_size) != expected
                || img.pixel_values.len() != img.tokens() * img.merge_size.pow(2) as usize * img.patch_dim
            {
                return Err(GenerateError::Images(format!(
                "{}: preprocessed for {} values per patch and merge size {} ({} values), but model `{}` takes {} and {}",
                img.source,
                img.patch_dim,
                img.merge_size,
                img.pixel_values.len(),
                model.name(),
                expected.0,
                expected.1
            )));
            }
        }
        let grids: Vec<GridThw> = images.iter().map(|i| i.grid_thw).collect();
        let (positions, delta) =
            rope_index(prompt, image_id, &grids, vc.spatial_merge_size as u32).map_err(GenerateError::Images)?;
        // The images whose pads lie before `start` are in the restored caches already.
        let mut pads_before = prompt[..start].iter().filter(|&&id| id == image_id).count();
        let mut skip = 0;
        while skip < images.len() && pads_before >= images[skip].tokens() && images[skip].tokens() > 0 {
            pads_before -= images[skip].tokens();
            skip += 1;
        }
        if pads_before != 0 {
            return Err(GenerateError::Images(format!("a restored prefix of {start} tokens ends inside an image")));
        }
        let images = &images[skip..];
        let table_rows = (prompt.len() - start) as i32;
        let ids: Vec<i32> = prompt[start..].iter().map(|&id| id as i32).collect();
        let embeds = model.embed(&Array::from_slice(&ids, &[table_rows])?)?;
        let table = if images.is_empty() {
            embeds
        } else {
            let grids: Vec<GridThw> = images.iter().map(|i| i.grid_thw).collect();
            let pixels: Vec<f32> = images.iter().flat_map(|i| i.pixel_values.iter().copied()).collect();
            let patches = (pixels.len() / vc.patch_dim() as usize) as i32;
            let features = vision.encode(&Array::from_slice(&pixels, &[patches, vc.patch_dim()])?, &grids)?;
            mlx::concatenate(&[&embeds, &features.as_dtype(embeds.dtype())?], 0)?
        };

        // Each pad's embedding row is replaced by the next feature row: gather from [embeddings; features].
        let t = table_rows;
        let mut next_feature = t;
        let rows: Vec<i32> = (0..t)
            .zip(&prompt[start..])
            .map(|(p, &id)| {
                if id == image_id {
                    next_feature += 1;
                    next_feature - 1
                } else {
                    p
                }
            })
            .collect();
        let h = table.take(&Array::from_slice(&rows, &[t])?, 0)?.expand_dims(&[0])?;
        let positions: Vec<i32> = positions.iter().flat_map(|axis| axis[start..].iter().copied()).collect();
        let positions = Array::from_slice(&positions, &[3, t])?;
        Ok(Prefilling { input: Input::Embedded { h, positions, delta }, done: 0, total: t, parts: Vec::new() })
    }
}
