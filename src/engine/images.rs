//! The images of requests: decoded and preprocessed with the model folder's image processor
//! (`preprocessor_config.json`), under limits that bound the memory they take.
//!
//! Images are decoded when a request is submitted, so that a bad image fails the request at once
//! (and its tokens count in the prompt's length); the decoded pixels then wait in the queue. Three
//! limits keep that memory bounded: the pixels an image is resized to (at most
//! [`ImageLimits::max_pixels`], lower than Qwen3.5's own 16.7 MP, and lower on the CPU), the images
//! of one request, and the bytes of decoded images that one model's queue may hold. Each model
//! decodes one request's images at a time, so that the full-size pixels of a decode in progress
//! (up to the decoder's 64 MP limit) exist once per model, whatever the number of clients.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::model::vision_input::{ImageInput, ImageProcessor};

use super::{EngineError, Image, Result};

/// The most pixels an image is resized to when [`ImageLimits::max_pixels`] is not set, on a GPU:
/// about 1448x1448, 8,192 patches, 2,048 tokens.
pub const GPU_MAX_PIXELS: u64 = 2_097_152;
/// The same on the CPU (MLX's CPU backend computes the vision tower's attention in full):
/// 1024x1024, 4,096 patches, 1,024 tokens.
pub const CPU_MAX_PIXELS: u64 = 1_048_576;

/// Limits on the images of requests.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageLimits {
    /// Images larger than this (in pixels, width x height) are resized down to it, keeping their
    /// aspect ratio; the model's `preprocessor_config.json` may ask for less. None: 2,097,152 on a
    /// GPU, 1,048,576 on the CPU ([`GPU_MAX_PIXELS`], [`CPU_MAX_PIXELS`]).
    pub max_pixels: Option<u64>,
    /// Images in one request.
    pub max_per_request: usize,
    /// Bytes of decoded images that the queued and running requests of one model may hold; a
    /// request that would exceed it is refused as busy ([`EngineError::ImagesBusy`]).
    pub max_queued_bytes: u64,
}

impl Default for ImageLimits {
    fn default() -> Self {
        // 8 images at the GPU's pixel limit take 8 x 50 MiB of f32 patches: 400 MiB.
        ImageLimits { max_pixels: None, max_per_request: 8, max_queued_bytes: 1 << 30 }
    }
}

/// A loaded vision model's image reader: its processor (read once, at load) and the bytes of
/// decoded images its requests hold.
pub(crate) struct ImageReader {
    /// The processor, or why `preprocessor_config.json` cannot be used.
    processor: std::result::Result<ImageProcessor, String>,
    limits: ImageLimits,
    held: Arc<AtomicU64>,
    /// Held while decoding.
    decoding: Mutex<()>,
}

/// Bytes of decoded images counted against a model's queue; given back when dropped.
pub(crate) struct Reservation {
    held: Arc<AtomicU64>,
    bytes: u64,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.held.fetch_sub(self.bytes, Ordering::SeqCst);
    }
}

impl ImageReader {
    /// The reader of the model in `dir`; `gpu` says where MLX computes (it picks the default pixel limit).
    pub fn new(model: &str, dir: &Path, limits: &ImageLimits, gpu: bool) -> ImageReader {
        let cap = limits.max_pixels.unwrap_or(if gpu { GPU_MAX_PIXELS } else { CPU_MAX_PIXELS });
        let processor = ImageProcessor::from_model_dir(dir)
            .map(|mut p| {
                // Never below the model's own minimum (smart_resize needs min <= max).
                p.max_pixels = p.max_pixels.min(cap).max(p.min_pixels);
                p
            })
            .map_err(|e| {
                tracing::warn!(model = %model, "images cannot be read: {e}");
                e.to_string()
            });
        ImageReader { processor, limits: limits.clone(), held: Arc::default(), decoding: Mutex::new(()) }
    }

    /// The processor in use (its `max_pixels` already capped).
    #[cfg(test)]
    pub fn processor(&self) -> std::result::Result<&ImageProcessor, &str> {
        self.processor.as_ref().map_err(String::as_str)
    }

    /// Decodes and preprocesses a request's images, named `image #1`, `image #2`... in errors, and
    /// counts their bytes against the model's queue.
    pub fn read(&self, model: &str, images: &[&Image]) -> Result<(Vec<ImageInput>, Reservation)> {
        let limit = self.limits.max_per_request;
        if images.len() > limit {
            return Err(EngineError::InvalidImage(format!(
                "the request has {} images; model `{model}` reads at most {limit} per request",
                images.len()
            )));
        }
        let processor = self
            .processor
            .as_ref()
            .map_err(|why| EngineError::Images(format!("model `{model}` cannot read images: {why}")))?;
        let decoded = {
            let _one_at_a_time = self.decoding.lock().unwrap_or_else(|p| p.into_inner());
            images
                .iter()
                .enumerate()
                .map(|(i, img)| processor.load_bytes(&img.bytes, &format!("image #{}", i + 1)))
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|e| EngineError::InvalidImage(e.to_string()))?
        };
        let bytes: u64 = decoded.iter().map(|d| (d.pixel_values.len() * std::mem::size_of::<f32>()) as u64).sum();
        let max = self.limits.max_queued_bytes;
        if bytes > max {
            return Err(EngineError::InvalidImage(format!(
                "the request's images take {} once decoded, over the {} that model `{model}` holds for its queue; send fewer or smaller images",
                super::mib(bytes),
                super::mib(max)
            )));
        }
        self.held
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |held| held.checked_add(bytes).filter(|&n| n <= max))
            .map_err(|held| EngineError::ImagesBusy { model: model.to_owned(), bytes, held, limit: max })?;
        Ok((decoded, Reservation { held: self.held.clone(), bytes }))
    }

    /// Bytes of decoded images held now.
    #[cfg(test)]
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests;
