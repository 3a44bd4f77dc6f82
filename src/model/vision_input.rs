//! Images in, vision-tower inputs out. Decoding (JPEG, PNG, WebP, GIF's first frame) under size
//! limits that refuse an oversized header before any pixel buffer is allocated, EXIF orientation,
//! RGB (alpha dropped, as transformers' `load_image` does), then Hugging Face's Qwen2-VL image processor:
//! `smart_resize` to a multiple of patch x merge within [min_pixels, max_pixels], bicubic resampling
//! exactly as torchvision computes it on 8-bit images (Pillow's fixed-point resampler), rescale and normalise,
//! and patches flattened in HF's order (merge windows, then channel, frame, row, column).
//! Also the expansion of each image's single `<|image_pad|>` into one pad per merged patch.

use std::io::Cursor;
use std::path::{Path, PathBuf};

use image::{DynamicImage, ImageDecoder, ImageFormat, ImageReader, Limits, RgbImage};
use serde_json::Value;
use thiserror::Error;

use super::vision::GridThw;

#[derive(Debug, Error)]
pub enum ImageError {
    // The cause is part of the message and not also a `source` (a chain printed whole would say it twice).
    #[error("{path}: {error}")]
    Read { path: PathBuf, error: std::io::Error },
    #[error("{name}: the file is {bytes} bytes, over the limit of {limit} bytes for an image")]
    FileTooLarge { name: String, bytes: u64, limit: u64 },
    #[error("{name}: not an image in a supported format (JPEG, PNG, WebP, GIF)")]
    NotAnImage { name: String },
    #[error("{name}: {format} images are not supported (JPEG, PNG, WebP, GIF)")]
    Unsupported { name: String, format: String },
    #[error("{name}: cannot decode the image: {message}")]
    Decode { name: String, message: String },
    #[error("{name}: the image is {width}x{height} pixels, over the limit of {limit} pixels")]
    TooManyPixels { name: String, width: u32, height: u32, limit: u64 },
    #[error("{name}: the image is empty ({width}x{height} pixels)")]
    Empty { name: String, width: u32, height: u32 },
    #[error("{name}: aspect ratio {width}x{height} is more extreme than 200:1")]
    AspectRatio { name: String, width: u32, height: u32 },
    #[error("{path}: field `{field}`: {message}")]
    Config { path: PathBuf, field: String, message: String },
    #[error("the prompt has {pads} `<|image_pad|>` token(s) (id {id}) for {images} image(s)")]
    PadCount { pads: usize, images: usize, id: u32 },
}

pub type Result<T> = std::result::Result<T, ImageError>;

/// One preprocessed image: the rows the vision tower reads and the grid they form.
#[derive(Clone, PartialEq)]
pub struct ImageInput {
    /// `[t*h*w, C*T*P*P]`, row-major.
    pub pixel_values: Vec<f32>,
    /// `[t, h, w]` in patches.
    pub grid_thw: GridThw,
    /// Values per row of `pixel_values`.
    pub patch_dim: usize,
    /// The merge size the grid was made for: the image becomes `t*h*w / merge^2` tokens.
    pub merge_size: u32,
    /// Where the image came from, for messages.
    pub source: String,
}

impl std::fmt::Debug for ImageInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ImageInput({}, grid {:?}, {} values)", self.source, self.grid_thw, self.pixel_values.len())
    }
}

impl ImageInput {
    /// How many `<|image_pad|>` tokens (and vision features) this image takes in the prompt.
    pub fn tokens(&self) -> usize {
        let [t, h, w] = self.grid_thw;
        (t * h * w / (self.merge_size * self.merge_size)) as usize
    }
}

/// Limits checked before and while decoding.
#[derive(Debug, Clone)]
pub struct DecodeLimits {
    /// The largest image file read.
    pub max_file_bytes: u64,
    /// The most pixels (width x height) an image may declare; checked on the header.
    pub max_pixels: u64,
    /// The most bytes a decoder may allocate (the `image` crate's own limit, a second guard).
    pub max_alloc: u64,
}

impl Default for DecodeLimits {
    fn default() -> Self {
        DecodeLimits { max_file_bytes: 64 << 20, max_pixels: 64_000_000, max_alloc: 1 << 30 }
    }
}

/// The Qwen2-VL image processor's settings (`preprocessor_config.json`).
#[derive(Debug, Clone)]
pub struct ImageProcessor {
    pub min_pixels: u64,
    pub max_pixels: u64,
    pub patch_size: u32,
    pub temporal_patch_size: u32,
    pub merge_size: u32,
    pub rescale_factor: f64,
    pub image_mean: [f64; 3],
    pub image_std: [f64; 3],
    pub do_rescale: bool,
    pub do_normalize: bool,
    pub limits: DecodeLimits,
}

impl Default for ImageProcessor {
    /// Qwen3.5's released preprocessor: 16-pixel patches, 2 frames, 2x2 merge, mean and std 0.5,
    /// between 65,536 and 16,777,216 pixels.
    fn default() -> Self {
        ImageProcessor {
            min_pixels: 65_536,
            max_pixels: 16_777_216,
            patch_size: 16,
            temporal_patch_size: 2,
            merge_size: 2,
            rescale_factor: 1.0 / 255.0,
            image_mean: [0.5; 3],
            image_std: [0.5; 3],
            do_rescale: true,
            do_normalize: true,
            limits: DecodeLimits::default(),
        }
    }
}

impl ImageProcessor {
    /// Reads `preprocessor_config.json` of a model folder; the defaults when the file is absent.
    pub fn from_model_dir(dir: &Path) -> Result<ImageProcessor> {
        let path = dir.join("preprocessor_config.json");
        if !path.exists() {
            return Ok(ImageProcessor::default());
        }
        let text = crate::model::files::read_to_string(&path)
            .map_err(|e| ImageError::Read { path: path.clone(), error: e })?;
        let v: Value = serde_json::from_str(&text).map_err(|e| ImageError::Config {
            path: path.clone(),
            field: "(file)".into(),
            message: format!("invalid JSON: {e}"),
        })?;
        Self::from_json(&v, &path)
    }

    /// From a parsed `preprocessor_config.json` (`path` only names it in errors). Pixel bounds come
    /// from `size.shortest_edge`/`size.longest_edge` (which mean pixels here), overridden by
    /// `min_pixels`/`max_pixels` as transformers does.
    pub fn from_json(v: &Value, path: &Path) -> Result<ImageProcessor> {
        let mut p = ImageProcessor::default();
        let err = |field: &str, message: String| ImageError::Config {
            path: path.to_path_buf(),
            field: field.into(),
            message,
        };
        let uint = |field: &str, x: &Value| {
            x.as_u64().filter(|&n| n > 0).ok_or_else(|| err(field, format!("expected a positive integer, got {x}")))
        };
        let lookup = |field: &str| field.split('.').try_fold(v, |node, key| node.get(key)).filter(|x| !x.is_null());
        for (fields, slot) in [
            (["size.shortest_edge", "min_pixels"], &mut p.min_pixels),
            (["size.longest_edge", "max_pixels"], &mut p.max_pixels),
        ] {
            for field in fields {
                if let Some(x) = lookup(field) {
                    *slot = uint(field, x)?;
                }
            }
        }
        for (field, slot) in [
            ("patch_size", &mut p.patch_size),
            ("temporal_patch_size", &mut p.temporal_patch_size),
            ("merge_size", &mut p.merge_size),
        ] {
            if let Some(x) = v.get(field).filter(|x| !x.is_null()) {
                *slot = u32::try_from(uint(field, x)?).map_err(|_| err(field, format!("{x} is too large")))?;
            }
        }
        if let Some(x) = v.get("rescale_factor") {
            p.rescale_factor = x
                .as_f64()
                .filter(|f| *f > 0.0)
                .ok_or_else(|| err("rescale_factor", format!("expected a positive number, got {x}")))?;
        }
        for (field, slot) in [("image_mean", &mut p.image_mean), ("image_std", &mut p.image_std)] {
            if let Some(x) = v.get(field) {
                let vals: Option<Vec<f64>> = match x {
                    Value::Number(n) => n.as_f64().map(|f| vec![f; 3]),
                    Value::Array(a) => a.iter().map(|f| f.as_f64()).collect(),
                    _ => None,
                };
                match vals.as_deref() {
                    Some(&[a, b, c]) if field == "image_mean" || (a != 0.0 && b != 0.0 && c != 0.0) => {
                        *slot = [a, b, c]
                    }
                    _ => return Err(err(field, format!("expected three numbers (std non-zero), got {x}"))),
                }
            }
        }
        for (field, slot) in [("do_rescale", &mut p.do_rescale), ("do_normalize", &mut p.do_normalize)] {
            if let Some(x) = v.get(field) {
                *slot = x.as_bool().ok_or_else(|| err(field, format!("expected true or false, got {x}")))?;
            }
        }
        if p.min_pixels > p.max_pixels {
            return Err(err("size", format!("min pixels {} exceed max pixels {}", p.min_pixels, p.max_pixels)));
        }
        Ok(p)
    }

    /// Reads, decodes and preprocesses an image file.
    pub fn load_file(&self, path: &Path) -> Result<ImageInput> {
        let name = path.display().to_string();
        let meta = std::fs::metadata(path).map_err(|e| ImageError::Read { path: path.to_path_buf(), error: e })?;
        if meta.len() > self.limits.max_file_bytes {
            return Err(ImageError::FileTooLarge { name, bytes: meta.len(), limit: self.limits.max_file_bytes });
        }
        let bytes = std::fs::read(path).map_err(|e| ImageError::Read { path: path.to_path_buf(), error: e })?;
        self.load_bytes(&bytes, &name)
    }

    /// Decodes and preprocesses an encoded image (e.g. from a data URL); `name` names it in errors.
    pub fn load_bytes(&self, bytes: &[u8], name: &str) -> Result<ImageInput> {
        if bytes.len() as u64 > self.limits.max_file_bytes {
            return Err(ImageError::FileTooLarge {
                name: name.into(),
                bytes: bytes.len() as u64,
                limit: self.limits.max_file_bytes,
            });
        }
        let rgb = decode(bytes, name, &self.limits)?;
        self.preprocess(&rgb, name)
    }

    /// The (height, width) an image of `height x width` is resized to (transformers' `smart_resize`).
    pub fn target_size(&self, height: u32, width: u32, name: &str) -> Result<(u32, u32)> {
        let (h, w) = (height as f64, width as f64);
        if h.max(w) / h.min(w) > 200.0 {
            return Err(ImageError::AspectRatio { name: name.into(), width, height });
        }
        let f = (self.patch_size * self.merge_size) as f64;
        // Python's round() rounds halves to even.
        let (mut hb, mut wb) = ((h / f).round_ties_even() * f, (w / f).round_ties_even() * f);
        if hb * wb > self.max_pixels as f64 {
            let beta = (h * w / self.max_pixels as f64).sqrt();
            hb = f.max((h / beta / f).floor() * f);
            wb = f.max((w / beta / f).floor() * f);
        } else if hb * wb < self.min_pixels as f64 {
            let beta = (self.min_pixels as f64 / (h * w)).sqrt();
            hb = (h * beta / f).ceil() * f;
            wb = (w * beta / f).ceil() * f;
        }
        Ok((hb as u32, wb as u32))
    }

    /// Resizes, normalises and patchifies an RGB image.
    pub fn preprocess(&self, img: &RgbImage, name: &str) -> Result<ImageInput> {
        let (w0, h0) = img.dimensions();
        let (h, w) = self.target_size(h0, w0, name)?;
        let planes = resize_bicubic(img, h as usize, w as usize);
        // transformers fuses rescale into normalise: (x - mean/rescale) / (std/rescale), in f32.
        let (mut mean, mut std) = ([0f32; 3], [1f32; 3]);
        for c in 0..3 {
            match (self.do_rescale, self.do_normalize) {
                (true, true) => {
                    mean[c] = (self.image_mean[c] / self.rescale_factor) as f32;
                    std[c] = (self.image_std[c] / self.rescale_factor) as f32;
                }
                (false, true) => (mean[c], std[c]) = (self.image_mean[c] as f32, self.image_std[c] as f32),
                (true, false) => std[c] = (1.0 / self.rescale_factor) as f32,
                (false, false) => {}
            }
        }
        let (p, t, m) = (self.patch_size as usize, self.temporal_patch_size as usize, self.merge_size as usize);
        let (gh, gw) = (h as usize / p, w as usize / p);
        let patch_dim = 3 * t * p * p;
        let mut out = Vec::with_capacity(gh * gw * patch_dim);
        // Rows: merge windows (row-major), patches within a window (row-major); columns: channel,
        // frame (the still image repeated), pixel row, pixel column.
        for br in 0..gh / m {
            for bc in 0..gw / m {
                for ir in 0..m {
                    for ic in 0..m {
                        let (py, px) = ((br * m + ir) * p, (bc * m + ic) * p);
                        for (c, plane) in planes.iter().enumerate() {
                            for _ in 0..t {
                                for y in py..py + p {
                                    let row = &plane[y * w as usize + px..y * w as usize + px + p];
                                    out.extend(row.iter().map(|&v| (v as f32 - mean[c]) / std[c]));
                                }
                            }
                        }
                    }
                }
            }
        }
        Ok(ImageInput {
            pixel_values: out,
            grid_thw: [1, gh as u32, gw as u32],
            patch_dim,
            merge_size: self.merge_size,
            source: name.to_string(),
        })
    }
}

/// Decodes to RGB: format from the content, header checked against the limits before the pixels
/// are decoded, EXIF orientation applied, alpha dropped (transformers' `load_image`: PIL's
/// `exif_transpose`, then `convert("RGB")`).
pub fn decode(bytes: &[u8], name: &str, limits: &DecodeLimits) -> Result<RgbImage> {
    let decode_err = |e: image::ImageError| match e {
        image::ImageError::Limits(l) => {
            ImageError::Decode { name: name.into(), message: format!("over a decoding limit ({l})") }
        }
        e => ImageError::Decode { name: name.into(), message: e.to_string() },
    };
    let mut reader = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| ImageError::Decode { name: name.into(), message: e.to_string() })?;
    let format = reader.format().ok_or_else(|| ImageError::NotAnImage { name: name.into() })?;
    if !matches!(format, ImageFormat::Jpeg | ImageFormat::Png | ImageFormat::WebP | ImageFormat::Gif) {
        return Err(ImageError::Unsupported { name: name.into(), format: format!("{format:?}") });
    }
    let mut l = Limits::default();
    l.max_alloc = Some(limits.max_alloc);
    reader.limits(l);
    let mut decoder = reader.into_decoder().map_err(decode_err)?;
    let (width, height) = decoder.dimensions();
    if width == 0 || height == 0 {
        return Err(ImageError::Empty { name: name.into(), width, height });
    }
    if width as u64 * height as u64 > limits.max_pixels {
        return Err(ImageError::TooManyPixels { name: name.into(), width, height, limit: limits.max_pixels });
    }
    // A damaged EXIF block only loses the orientation, not the image.
    let orientation = decoder.orientation().unwrap_or(image::metadata::Orientation::NoTransforms);
    let mut img = DynamicImage::from_decoder(decoder).map_err(decode_err)?;
    img.apply_orientation(orientation);
    Ok(img.into_rgb8())
}

/// Three planes `[h * w]` of `img` resized to `h x w` exactly as torchvision resizes a uint8 image
/// with bicubic antialiasing on the CPU (PyTorch's port of Pillow's resampler): separable, width
/// first, Keys a = -0.5 weights widened by the scale when shrinking, fixed-point weights, and the
/// intermediate rounded to 8 bits.
fn resize_bicubic(img: &RgbImage, h: usize, w: usize) -> [Vec<u8>; 3] {
    let (w0, h0) = (img.width() as usize, img.height() as usize);
    let raw = img.as_raw();
    let mut planes: [Vec<u8>; 3] = Default::default();
    for (c, plane) in planes.iter_mut().enumerate() {
        *plane = (0..w0 * h0).map(|i| raw[3 * i + c]).collect();
    }
    planes.map(|mut src| {
        if w != w0 {
            let (taps, bits) = aa_weights(w0, w);
            src = (0..h0 * w).map(|i| convolve(&taps[i % w], bits, |j| src[(i / w) * w0 + j])).collect();
        }
        if h != h0 {
            let (taps, bits) = aa_weights(h0, h);
            src = (0..h * w).map(|i| convolve(&taps[i / w], bits, |j| src[j * w + i % w])).collect();
        }
        src
    })
}

fn convolve((start, weights): &(usize, Vec<i32>), bits: u32, at: impl Fn(usize) -> u8) -> u8 {
    let acc = weights.iter().enumerate().fold(1i32 << (bits - 1), |acc, (j, &k)| acc + at(start + j) as i32 * k);
    (acc >> bits).clamp(0, 255) as u8
}

/// For each output index: the first input index and its fixed-point weights, plus their precision
/// in bits (PyTorch's `_compute_index_ranges_int16_weights` for the bicubic antialias filter).
fn aa_weights(input: usize, output: usize) -> (Vec<(usize, Vec<i32>)>, u32) {
    let scale = input as f64 / output as f64;
    let (support, invscale) = if scale >= 1.0 { (2.0 * scale, 1.0 / scale) } else { (2.0, 1.0) };
    let filter = |x: f64| {
        let (a, x) = (-0.5, x.abs());
        if x < 1.0 {
            ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
        } else if x < 2.0 {
            (((x - 5.0) * x + 8.0) * x - 4.0) * a
        } else {
            0.0
        }
    };
    let taps: Vec<(usize, Vec<f64>)> = (0..output)
        .map(|i| {
            let center = scale * (i as f64 + 0.5);
            let xmin = ((center - support + 0.5) as i64).max(0) as usize;
            let xmax = ((center + support + 0.5) as i64).min(input as i64).max(xmin as i64) as usize;
            let mut ws: Vec<f64> = (xmin..xmax).map(|j| filter((j as f64 - center + 0.5) * invscale)).collect();
            let total: f64 = ws.iter().sum();
            if total != 0.0 {
                ws.iter_mut().for_each(|k| *k /= total);
            }
            (xmin, ws)
        })
        .collect();
    // The most bits (up to 22) that keep the largest weight within an i16.
    let max = taps.iter().flat_map(|(_, ws)| ws.iter().copied()).fold(0.0, f64::max);
    let bits = (0..22).find(|&b| (0.5 + max * (1u64 << (b + 1)) as f64) as i64 >= 1 << 15).unwrap_or(22);
    let fixed = |k: f64| (k * (1u64 << bits) as f64 + if k < 0.0 { -0.5 } else { 0.5 }) as i32;
    (taps.into_iter().map(|(start, ws)| (start, ws.into_iter().map(fixed).collect())).collect(), bits)
}

/// Expands each image's single `<|image_pad|>` (as the chat template renders it) into
/// [`ImageInput::tokens`] pads, so that the prompt has one pad per vision feature.
pub fn expand_image_pads(ids: &[u32], image_token_id: u32, images: &[ImageInput]) -> Result<Vec<u32>> {
    let pads = ids.iter().filter(|&&id| id == image_token_id).count();
    if pads != images.len() {
        return Err(ImageError::PadCount { pads, images: images.len(), id: image_token_id });
    }
    let mut out = Vec::with_capacity(ids.len() + images.iter().map(ImageInput::tokens).sum::<usize>());
    let mut next = images.iter();
    for &id in ids {
        match (id == image_token_id).then(|| next.next()).flatten() {
            Some(img) => out.extend(std::iter::repeat_n(image_token_id, img.tokens())),
            None => out.push(id),
        }
    }
    Ok(out)
}
