//! `tandem serve`: the OpenAI-compatible and admin HTTP API, and the web UI.

use anyhow::{bail, Context, Result};
use clap::Args;
use tandem::server::{self, ServeConfig};

use crate::model_arg;

#[derive(Args)]
pub struct ServeArgs {
    /// Address to listen on; anything beyond loopback needs an API key.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on.
    #[arg(long, default_value_t = 11435)]
    port: u16,
    /// Required as a Bearer token when binding beyond loopback (default: $TANDEM_API_KEY).
    #[arg(long)]
    api_key: Option<String>,
    /// Whether the adaptive controller may park MTP drafting, for every model. Default: each
    /// model's `mtp.adaptive` in models.toml.
    #[arg(long, value_parser = ["on", "off"])]
    adaptive: Option<String>,
}

pub fn run(a: ServeArgs) -> Result<()> {
    if let Some(why) = a.api_key.as_deref().and_then(server::api_key_problem) {
        bail!("--api-key {why}, so no client could send it; give a key of visible characters, or leave it out");
    }
    let registry =
        model_arg::config_path().context("models.toml not found (set TANDEM_CONFIG, or run from the Tandem folder)")?;
    let mut cfg = ServeConfig::new(registry);
    cfg.host = a.host;
    cfg.port = a.port;
    cfg.engine.adaptive = a.adaptive.as_deref().map(|v| v == "on");
    if a.api_key.is_some() {
        cfg.api_key = a.api_key;
    }
    server::serve(cfg)
}
