//! `tandem worker`: one rank (not 0) of a model split over several machines. It loads its share of
//! the model when rank 0 (`tandem serve --hostfile`) loads it (refusing another model, or the same
//! loaded another way), runs what rank 0 is asked, in step with it, and unloads with it, until rank 0
//! goes away.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use tandem::model::{self, LoadOptions};

use crate::{group, model_arg};

#[derive(Args)]
pub struct WorkerArgs {
    /// MLX's ring hostfile: a JSON list with each rank's ["ip:port"]; rank 0 runs `tandem serve`.
    #[arg(long)]
    hostfile: PathBuf,
    /// This process's rank in the hostfile (1 or more).
    #[arg(long)]
    rank: usize,
    /// The model (a name in models.toml, or a folder); default: models.toml's default. Rank 0 must
    /// serve the same.
    #[arg(long)]
    model: Option<String>,
    /// How the model is split: `tensor` or `pipeline`, as rank 0's `tandem serve --split` says.
    #[arg(long, default_value = "tensor")]
    split: tandem::model::parallel::Split,
    /// Seconds to wait for the other ranks to join.
    #[arg(long, default_value_t = 120)]
    join_timeout: u64,
}

pub fn run(a: WorkerArgs) -> Result<()> {
    if a.rank == 0 {
        anyhow::bail!("--rank 0 is `tandem serve --hostfile`; workers are ranks 1 and up");
    }
    let entry = model_arg::resolve(a.model.as_deref())?;
    let tp = group::join(&a.hostfile, a.rank, a.split, Duration::from_secs(a.join_timeout))?;
    let opts = LoadOptions { parallel: Some(tp.clone()), ..Default::default() };
    // Checked now, so that a folder without a model is named before rank 0 asks for it.
    model::identity(&entry.path, &opts).with_context(|| format!("cannot serve {}", entry.path.display()))?;
    eprintln!(
        "rank {} of {}: serving {} with rank 0 ({} parallel); it loads when rank 0 does",
        tp.rank(),
        tp.size(),
        entry.name,
        a.split
    );
    let end = tandem::engine::lockstep::follow(&entry.name, &entry.path, &opts, &tp);
    // follow only returns when the group broke: rank 0 stopped or was lost.
    end.map_err(|e| anyhow::anyhow!("rank 0 is gone: {e}"))
}
