//! Tensor parallelism over MLX's distributed group (docs/MODEL.md §7): each rank holds a slice of
//! every layer's heads and MLP columns, and the layer's output projection sums the ranks' partial
//! outputs. Column-parallel projections (q/k/v, the linear attention's inputs, gate/up) keep the
//! rows of this rank's heads or columns; row-parallel ones (o_proj, out_proj, down_proj) keep the
//! matching input columns and are followed by [`TensorParallel::reduce`]. Norms, embeddings, the LM
//! head, the MTP head and the vision tower are replicated, so every rank computes the same logits and
//! samples the same tokens.

use std::sync::Arc;

use mlx::{Array, Dtype};

use super::layers::{Linear, Result};
use super::LoadError;

/// This process's place in a tensor-parallel group.
#[derive(Clone)]
pub struct TensorParallel {
    group: Arc<mlx::distributed::Group>,
    rank: i32,
    size: i32,
}

impl std::fmt::Debug for TensorParallel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "rank {} of {}", self.rank, self.size)
    }
}

impl TensorParallel {
    pub fn new(group: Arc<mlx::distributed::Group>) -> TensorParallel {
        let (rank, size) = (group.rank(), group.size());
        TensorParallel { group, rank, size }
    }

    pub fn rank(&self) -> i32 {
        self.rank
    }

    pub fn size(&self) -> i32 {
        self.size
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

    /// The sum of every rank's partial output, added in f32 and rounded once to its dtype.
    pub fn reduce(&self, partial: &Array) -> Result<Array> {
        let dtype = partial.dtype();
        self.group.all_sum(&partial.as_dtype(Dtype::F32)?)?.as_dtype(dtype)
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
/// output is a partial sum, completed by [`TensorParallel::reduce`]).
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
