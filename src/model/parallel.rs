//! A model split over MLX's distributed group (docs/MODEL.md §7), one of two ways:
//!
//! - **Tensor** parallel: each rank holds a slice of every layer's heads and MLP columns, and the
//!   layer's output projection sums the ranks' partial outputs. Column-parallel projections (q/k/v, the
//!   linear attention's inputs, gate/up) keep the rows of this rank's heads or columns; row-parallel
//!   ones (o_proj, out_proj, down_proj) keep the matching input columns and are followed by
//!   [`Parallel::reduce`]. Three collectives per layer pair: for fast links.
//! - **Pipeline** parallel: each rank holds a contiguous run of whole layers ([`Parallel::stage`]) and
//!   hands its output to the next ([`Parallel::chain`]): one collective per rank per forward, for slow
//!   links. A rank reads only its own layers from the files.
//!
//! Either way the norms, embeddings, LM head and vision tower are replicated, so every rank computes
//! the same logits and samples the same tokens. The MTP head is kept by rank 0 alone, which hands its
//! drafts to the others (`Qwen35::share_drafts`): every rank then verifies the same drafts and keeps
//! or rolls back the same number of tokens, with no further round trip.

use std::ops::Range;
use std::sync::Arc;

use mlx::{Array, Dtype};

use super::layers::{Linear, Result};
use super::LoadError;

/// How a model is split over the ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Split {
    #[default]
    Tensor,
    Pipeline,
}

impl std::str::FromStr for Split {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Split, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "tensor" => Ok(Split::Tensor),
            "pipeline" => Ok(Split::Pipeline),
            other => Err(format!("split `{other}`: expected `tensor` or `pipeline`")),
        }
    }
}

impl std::fmt::Display for Split {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Split::Tensor => "tensor",
            Split::Pipeline => "pipeline",
        })
    }
}

/// This process's place in a group that splits one model.
#[derive(Clone)]
pub struct Parallel {
    group: Arc<mlx::distributed::Group>,
    rank: i32,
    size: i32,
    split: Split,
}

impl std::fmt::Debug for Parallel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "rank {} of {} ({} parallel)", self.rank, self.size, self.split)
    }
}

impl Parallel {
    pub fn new(group: Arc<mlx::distributed::Group>, split: Split) -> Parallel {
        let (rank, size) = (group.rank(), group.size());
        Parallel { group, rank, size, split }
    }

    pub fn rank(&self) -> i32 {
        self.rank
    }

    pub fn size(&self) -> i32 {
        self.size
    }

    pub fn split(&self) -> Split {
        self.split
    }

    /// Itself when the model is split by heads (what a layer's loader needs), else None.
    pub fn tensor(&self) -> Option<&Parallel> {
        (self.split == Split::Tensor).then_some(self)
    }

    /// This rank's share `[from, to)` of `count` things (heads, columns), which must divide evenly;
    /// `what` names the config field for the error.
    pub fn share(&self, count: i32, what: &str) -> std::result::Result<(i32, i32), LoadError> {
        if count % self.size != 0 {
            return Err(LoadError::Config(format!(
                "{what} = {count} cannot be split evenly over {} tensor-parallel ranks",
                self.size
            )));
        }
        let per = count / self.size;
        Ok((self.rank * per, (self.rank + 1) * per))
    }

    /// This rank's layers of `layers` in a pipeline: contiguous runs, the first `layers % size` ranks
    /// one layer longer. Every rank needs at least one.
    pub fn stage(&self, layers: usize) -> std::result::Result<Range<usize>, LoadError> {
        let size = self.size as usize;
        if layers < size {
            return Err(LoadError::Config(format!(
                "num_hidden_layers = {layers} cannot give each of {size} pipeline ranks a layer"
            )));
        }
        let (per, extra, r) = (layers / size, layers % size, self.rank as usize);
        let start = r * per + r.min(extra);
        Ok(start..start + per + usize::from(r < extra))
    }

    /// The sum of every rank's partial output, added in f32 and rounded once to its dtype.
    pub fn reduce(&self, partial: &Array) -> Result<Array> {
        let dtype = partial.dtype();
        self.group.all_sum(&partial.as_dtype(Dtype::F32)?)?.as_dtype(dtype)
    }

    /// Rank 0's `mine` on every rank: a sum in which the others give zeros of `mine`'s shape (exact:
    /// integers below 2^24 and any float survive the f32 sum). `mine` only matters on rank 0.
    pub fn from_rank0(&self, mine: &Array) -> Result<Array> {
        let dtype = mine.dtype();
        let part = if self.rank == 0 { mine.as_dtype(Dtype::F32)? } else { Array::zeros(&mine.shape(), Dtype::F32)? };
        self.group.all_sum(&part)?.as_dtype(dtype)
    }

    /// A pipeline's forward: `h` (the same on every rank) goes through every rank's stage in rank
    /// order, and the last stage's output comes back on every rank. Each hand-over is a sum in which
    /// all ranks but the stage's own give zeros, so it is exact in any dtype, and every rank takes
    /// part in the same collectives in the same order. `stage` runs once, on this rank's turn.
    /// (A NaN or infinity in a stage's input turns the others' zeros to NaN: that output was lost anyway.)
    pub fn chain(&self, h: &Array, stage: impl FnOnce(&Array) -> Result<Array>) -> Result<Array> {
        let mut stage = Some(stage);
        let mut x = h.clone();
        for turn in 0..self.size {
            let out = match stage.take_if(|_| turn == self.rank) {
                Some(run) => run(&x)?,
                // Zeros that depend on x: MLX then cannot run this turn's sum before the last one's, so
                // the collectives meet in the same order on every rank (plain zeros would float free).
                None => x.multiply(&Array::scalar(0.0, x.dtype())?)?,
            };
            x = self.reduce(&out)?;
        }
        Ok(x)
    }
}

/// What a rank keeps of a linear layer.
#[derive(Debug, Clone, PartialEq)]
pub enum Cut {
    All,
    /// These output rows, in order ([`rows`]).
    Rows(Vec<(i32, i32)>),
    /// Input columns `[from, to)` ([`cols`]).
    Cols(i32, i32),
}

impl Cut {
    pub fn apply(&self, l: &Linear) -> Result<Linear> {
        match self {
            Cut::All => Ok(l.clone()),
            Cut::Rows(ranges) => rows(l, ranges),
            Cut::Cols(from, to) => cols(l, *from, *to),
        }
    }
}

/// The rows (outputs) `ranges` of a layer, in order: the column-parallel part of it.
pub fn rows(l: &Linear, ranges: &[(i32, i32)]) -> Result<Linear> {
    let take = |a: &Array| -> Result<Array> {
        let parts = ranges.iter().map(|&(a0, a1)| a.slice_axis(0, a0, a1)).collect::<Result<Vec<_>>>()?;
        mlx::concatenate(&parts.iter().collect::<Vec<_>>(), 0)?.contiguous()
    };
    Ok(match l {
        Linear::Dense { weight, bias } => {
            Linear::Dense { weight: take(weight)?, bias: bias.as_ref().map(take).transpose()? }
        }
        Linear::Quantized { q, bias } => Linear::Quantized {
            q: mlx::Quantized {
                weight: take(&q.weight)?,
                scales: take(&q.scales)?,
                biases: q.biases.as_ref().map(take).transpose()?,
                ..q.clone()
            },
            bias: bias.as_ref().map(take).transpose()?,
        },
    })
}

/// The input columns `[from, to)` of a layer without a bias: the row-parallel part of it (its
/// output is a partial sum, completed by [`Parallel::reduce`]).
pub fn cols(l: &Linear, from: i32, to: i32) -> Result<Linear> {
    // Column c of the layer is column c * num / den of a stored array (packed words, groups).
    let cut = |a: &Array, num: i32, den: i32| a.slice_axis(1, from * num / den, to * num / den)?.contiguous();
    match l {
        Linear::Dense { weight, bias: None } => Ok(Linear::Dense { weight: cut(weight, 1, 1)?, bias: None }),
        Linear::Quantized { q, bias: None } => {
            if from % q.group_size != 0 || to % q.group_size != 0 {
                return Err(mlx::Error::Invalid(format!(
                    "columns {from}..{to} do not start and end on groups of {}",
                    q.group_size
                )));
            }
            Ok(Linear::Quantized {
                q: mlx::Quantized {
                    // A group holds whole words at every width (64 * bits / 32).
                    weight: cut(&q.weight, q.bits, 32)?,
                    scales: cut(&q.scales, 1, q.group_size)?,
                    biases: q.biases.as_ref().map(|b| cut(b, 1, q.group_size)).transpose()?,
                    ..q.clone()
                },
                bias: None,
            })
        }
        _ => Err(mlx::Error::Invalid("a row-parallel layer with a bias (it would be added once per rank)".into())),
    }
}
