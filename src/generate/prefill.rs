//! Prefill: the prompt (and its images) through the model in chunks, filling the caches.

use mlx::Array;

use super::error::{GenerateError, Result};
use crate::cache::LayerCache;
use crate::model::qwen3_5::set_rope_delta;
use crate::model::vision::{rope_index, GridThw};
use crate::model::vision_input::ImageInput;
use crate::model::Qwen35;

/// Runs the prompt through the model in chunks; returns the post-norm hidden states of the last chunk.
pub fn prefill(model: &Qwen35, prompt: &[u32], cache: &mut [LayerCache], chunk: usize) -> Result<Array> {
    let ids: Vec<i32> = prompt.iter().map(|&t| t as i32).collect();
    let mut hidden_parts = Vec::new();
    for part in ids.chunks(chunk.max(1)) {
        let h = model.forward(&Array::from_slice(part, &[1, part.len() as i32])?, cache)?;
        let mut arrays: Vec<&Array> = cache.iter().flat_map(|c| c.arrays()).collect();
        arrays.push(&h);
        mlx::device::eval(&arrays)?;
        hidden_parts.push(h);
    }
    // Callers need every prompt position's hidden state (the MTP head is primed on all of them).
    let refs: Vec<&Array> = hidden_parts.iter().collect();
    Ok(mlx::concatenate(&refs, 1)?)
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
    let vision = model.vision().ok_or_else(|| no_vision(model))?;
    let vc = &vision.config;
    let image_id = vc
        .image_token_id
        .ok_or_else(|| GenerateError::Images(format!("model `{}`: config.json has no image_token_id", model.name())))?;
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

    let mut hidden_parts = Vec::new();
    let step = chunk.max(1) as i32;
    for from in (0..t).step_by(step as usize) {
        let end = (from + step).min(t);
        let out =
            model.forward_embeddings_at(&h.slice_axis(1, from, end)?, cache, &positions.slice_axis(1, from, end)?)?;
        let mut arrays: Vec<&Array> = cache.iter().flat_map(|c| c.arrays()).collect();
        arrays.push(&out);
        mlx::device::eval(&arrays)?;
        hidden_parts.push(out);
    }
    set_rope_delta(cache, delta);
    let refs: Vec<&Array> = hidden_parts.iter().collect();
    Ok(mlx::concatenate(&refs, 1)?)
}
