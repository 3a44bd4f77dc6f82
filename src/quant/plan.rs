//! The output of a conversion, decided before anything is written: every tensor's key, dtype, shape
//! and the operation that makes it from its source tensor, grouped into shards. Because the shapes
//! are known up front, each shard's safetensors header is written first and the tensors are then
//! computed and streamed one at a time; sizes (and bits per weight) are exact before starting.

use std::collections::BTreeMap;

use mlx::Dtype;

/// How one source tensor becomes its output tensor(s).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Op {
    /// The stored bytes, unchanged.
    Copy,
    /// Cast to a floating dtype.
    Cast(Dtype),
    /// `f32(w) + add`, then cast (the +1 of zero-centred norms, or its repair).
    Shift { add: f32, dtype: Dtype },
    /// PyTorch's depthwise conv `[C,1,K]` to MLX's `[C,K,1]`, cast.
    ConvLayout(Dtype),
    /// Cast, then MLX affine quantization: writes `scales`, `biases`, `weight`.
    Quantize { dtype: Dtype, bits: u8, group_size: u32 },
}

/// One tensor written.
#[derive(Debug, Clone)]
pub struct Part {
    pub key: String,
    pub dtype: Dtype,
    pub shape: Vec<i32>,
}

impl Part {
    pub fn nbytes(&self) -> u64 {
        self.shape.iter().map(|&d| d as u64).product::<u64>() * self.dtype.size() as u64
    }
}

/// The output of one source tensor.
#[derive(Debug, Clone)]
pub struct Unit {
    /// Index of the source tensor.
    pub src: usize,
    /// Its canonical name.
    pub name: String,
    pub op: Op,
    /// Written in this order, contiguously.
    pub parts: Vec<Part>,
    /// Logical parameters (unpacked weights).
    pub params: u64,
}

impl Unit {
    pub fn nbytes(&self) -> u64 {
        self.parts.iter().map(Part::nbytes).sum()
    }
    /// The alignment the unit keeps after itself if it starts aligned: a quantized unit writes two
    /// equal 16-bit arrays and then u32s, so it starts and ends 4-aligned.
    fn align(&self) -> usize {
        match self.op {
            Op::Quantize { .. } => 4,
            _ => self.parts.iter().map(|p| p.dtype.size()).max().unwrap_or(1),
        }
    }
}

/// Builds the parts of one unit from its source shape.
pub fn parts(key: &str, op: Op, src_dtype: Dtype, shape: &[i32]) -> Vec<Part> {
    match op {
        Op::Copy => vec![Part { key: key.to_string(), dtype: src_dtype, shape: shape.to_vec() }],
        Op::Cast(dt) | Op::Shift { dtype: dt, .. } => {
            let dtype = if src_dtype.is_float() { dt } else { src_dtype };
            vec![Part { key: key.to_string(), dtype, shape: shape.to_vec() }]
        }
        Op::ConvLayout(dt) => {
            let mut s = shape.to_vec();
            let n = s.len();
            if n >= 2 {
                s.swap(n - 2, n - 1);
            }
            vec![Part { key: key.to_string(), dtype: dt, shape: s }]
        }
        Op::Quantize { dtype, bits, group_size } => {
            let module = key.strip_suffix(".weight").unwrap_or(key);
            let (out, inp) = (shape[0], shape[1]);
            let groups = inp / group_size as i32;
            vec![
                Part { key: format!("{module}.scales"), dtype, shape: vec![out, groups] },
                Part { key: format!("{module}.biases"), dtype, shape: vec![out, groups] },
                Part { key: format!("{module}.weight"), dtype: Dtype::U32, shape: vec![out, inp * bits as i32 / 32] },
            ]
        }
    }
}

/// One output file.
#[derive(Debug, Clone)]
pub struct Shard {
    pub file: String,
    /// Indices into `Plan::units`, in write order.
    pub units: Vec<usize>,
    /// The file's header (length prefix included), ready to write.
    pub header: Vec<u8>,
}

impl Shard {
    pub fn data_bytes(&self, units: &[Unit]) -> u64 {
        self.units.iter().map(|&u| units[u].nbytes()).sum()
    }
}

#[derive(Debug, Clone)]
pub struct Plan {
    pub units: Vec<Unit>,
    pub shards: Vec<Shard>,
}

impl Plan {
    /// Groups units into shards of at most `shard_bytes` (in the given order, as mlx-lm does; a
    /// larger unit gets a shard of its own) and lays out each shard's header.
    pub fn new(units: Vec<Unit>, shard_bytes: u64) -> Result<Plan, serde_json::Error> {
        let mut groups: Vec<Vec<usize>> = Vec::new();
        let mut size = 0u64;
        for (i, u) in units.iter().enumerate() {
            if groups.is_empty() || (size + u.nbytes() > shard_bytes && size > 0) {
                groups.push(Vec::new());
                size = 0;
            }
            if let Some(g) = groups.last_mut() {
                g.push(i);
            }
            size += u.nbytes();
        }
        let n = groups.len();
        let mut shards = Vec::with_capacity(n);
        for (i, mut g) in groups.into_iter().enumerate() {
            // Widest alignment first keeps every tensor aligned for its dtype without gaps.
            g.sort_by_key(|&u| std::cmp::Reverse(units[u].align()));
            let file = if n == 1 {
                "model.safetensors".to_string()
            } else {
                format!("model-{:05}-of-{n:05}.safetensors", i + 1)
            };
            let header = header(&g, &units)?;
            shards.push(Shard { file, units: g, header });
        }
        Ok(Plan { units, shards })
    }

    pub fn tensor_bytes(&self) -> u64 {
        self.units.iter().map(Unit::nbytes).sum()
    }

    pub fn file_bytes(&self) -> u64 {
        self.shards.iter().map(|s| s.header.len() as u64 + s.data_bytes(&self.units)).sum()
    }

    pub fn params(&self) -> u64 {
        self.units.iter().map(|u| u.params).sum()
    }

    pub fn tensors(&self) -> usize {
        self.units.iter().map(|u| u.parts.len()).sum()
    }

    /// Bits per weight: every tensor byte over every parameter (as mlx-lm reports it).
    pub fn bpw(&self) -> f64 {
        8.0 * self.tensor_bytes() as f64 / self.params().max(1) as f64
    }

    /// The index's weight map: key -> file.
    pub fn weight_map(&self) -> BTreeMap<String, String> {
        let mut m = BTreeMap::new();
        for s in &self.shards {
            for &u in &s.units {
                for p in &self.units[u].parts {
                    m.insert(p.key.clone(), s.file.clone());
                }
            }
        }
        m
    }
}

/// A safetensors header for `units` written in order: 8-byte little-endian length, then JSON padded
/// with spaces so that the data starts 8-aligned; metadata `{"format": "mlx"}`.
fn header(order: &[usize], units: &[Unit]) -> Result<Vec<u8>, serde_json::Error> {
    let mut obj = serde_json::Map::new();
    obj.insert("__metadata__".into(), serde_json::json!({ "format": "mlx" }));
    let mut offset = 0u64;
    for &u in order {
        for p in &units[u].parts {
            let end = offset + p.nbytes();
            obj.insert(
                p.key.clone(),
                serde_json::json!({ "dtype": p.dtype.safetensors_name(), "shape": p.shape, "data_offsets": [offset, end] }),
            );
            offset = end;
        }
    }
    let mut json = serde_json::to_vec(&serde_json::Value::Object(obj))?;
    while (8 + json.len()) % 8 != 0 {
        json.push(b' ');
    }
    let mut out = (json.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&json);
    Ok(out)
}
