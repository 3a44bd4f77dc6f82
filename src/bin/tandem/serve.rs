//! `tandem serve`: the OpenAI-compatible and admin HTTP API, and the web UI.

use anyhow::{bail, Context, Result};
use clap::Args;
use tandem::server::{self, ServeConfig};

use crate::model_arg;

#[derive(Args)]
pub struct ServeArgs {
    /// Address to listen on; anything beyond loopback needs an API key. Default: models.toml's
    /// `[server]` (127.0.0.1, or 0.0.0.0 with `expose = true`).
    #[arg(long)]
    host: Option<String>,
    /// Port to listen on. Default: models.toml's `[server] port`, else 11435.
    #[arg(long)]
    port: Option<u16>,
    /// Required as a Bearer token when set, and to bind beyond loopback. Default: $TANDEM_API_KEY,
    /// else models.toml's `[server] api_key`.
    #[arg(long)]
    api_key: Option<String>,
    /// Whether the adaptive controller may park MTP drafting, for every model. Default: each
    /// model's `mtp.adaptive` in models.toml.
    #[arg(long, value_parser = ["on", "off"])]
    adaptive: Option<String>,
    /// Serve models split over several machines, as rank 0 of this MLX ring hostfile (a JSON list
    /// with each rank's ["ip:port"]); the others run `tandem worker --hostfile FILE --rank N`.
    #[arg(long)]
    hostfile: Option<std::path::PathBuf>,
    /// How the model is split over the group (with --hostfile): `tensor` (each rank a share of every
    /// layer's heads; for fast links) or `pipeline` (each rank whole layers; for slow links). Every
    /// worker must be given the same.
    #[arg(long, default_value = "tensor")]
    split: tandem::model::parallel::Split,
    /// Seconds to wait for the other ranks to join (with --hostfile).
    #[arg(long, default_value_t = 120)]
    join_timeout: u64,
}

pub fn run(a: ServeArgs) -> Result<()> {
    if let Some(why) = a.api_key.as_deref().and_then(server::api_key_problem) {
        bail!("--api-key {why}, so no client could send it; give a key of visible characters, or leave it out");
    }
    let registry =
        model_arg::config_path().context("models.toml not found (set TANDEM_CONFIG, or run from the Tandem folder)")?;
    let settings = tandem::registry::Registry::load(&registry).context("cannot load the models registry")?;
    let mut cfg = ServeConfig::new(registry);
    cfg.listen_as(settings.server());
    if let Some(host) = a.host {
        cfg.host = host;
    }
    if let Some(port) = a.port {
        cfg.port = port;
    }
    cfg.engine.adaptive = a.adaptive.as_deref().map(|v| v == "on");
    if let Some(hostfile) = &a.hostfile {
        let tp = crate::group::join(hostfile, 0, a.split, std::time::Duration::from_secs(a.join_timeout))?;
        eprintln!("rank 0 of {}: models are split ({} parallel) over {}", tp.size(), a.split, hostfile.display());
        cfg.engine.load_options.parallel = Some(tp);
    }
    if a.api_key.is_some() {
        cfg.api_key = a.api_key;
    }
    server::serve(cfg)
}
