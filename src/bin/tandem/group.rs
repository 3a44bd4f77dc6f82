//! Joining a group of processes that serve one model together (`--hostfile`, docs/MODEL.md §7):
//! the hostfile checked and named in errors, then MLX's ring backend, given a deadline because its
//! start waits for every rank.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use tandem::model::parallel::{Parallel, Split};

/// Joins as `rank` of the group `hostfile` lists (MLX's format: a JSON list with each rank's
/// `["ip:port"]`), waiting at most `timeout` for the others; the model will be split as `split` says.
pub fn join(hostfile: &Path, rank: usize, split: Split, timeout: Duration) -> Result<Parallel> {
    let text = std::fs::read_to_string(hostfile).with_context(|| format!("--hostfile {}", hostfile.display()))?;
    let hosts: Vec<Vec<String>> = serde_json::from_str(&text).with_context(|| {
        format!("--hostfile {}: not a JSON list of each rank's [\"ip:port\"] (MLX's ring hostfile)", hostfile.display())
    })?;
    if hosts.len() < 2 {
        bail!("--hostfile {}: it lists {} rank(s); a group needs two or more", hostfile.display(), hosts.len());
    }
    if rank >= hosts.len() {
        bail!("--rank {rank}: {} lists ranks 0 to {}", hostfile.display(), hosts.len() - 1);
    }
    if let Some((i, _)) = hosts.iter().enumerate().find(|(_, h)| h.is_empty()) {
        bail!("--hostfile {}: rank {i} has no address", hostfile.display());
    }
    // MLX reads its place from the environment; nothing else runs yet in this process.
    std::env::set_var("MLX_HOSTFILE", hostfile);
    std::env::set_var("MLX_RANK", rank.to_string());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(mlx::distributed::init("ring"));
    });
    let group = match rx.recv_timeout(timeout) {
        Ok(group) => group.with_context(|| format!("cannot join the group of {}", hostfile.display()))?,
        Err(_) => bail!(
            "no answer from the other ranks of {} within {} s: is `tandem serve --hostfile` (rank 0) or `tandem \
             worker --rank N` running at each address, and can they reach each other?",
            hostfile.display(),
            timeout.as_secs()
        ),
    };
    tracing::info!(rank, size = group.size(), "joined the group of {}", hostfile.display());
    Ok(Parallel::new(Arc::new(group), split))
}
