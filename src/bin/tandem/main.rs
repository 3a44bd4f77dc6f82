//! `tandem`: the command-line shell over the engine (DESIGN.md, "CLI").

mod bench;
mod chat;
mod model_arg;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "tandem", version, about = "Local models with MTP speculative decoding, on MLX")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Chat with a model (interactive without --prompt).
    Chat(chat::ChatArgs),
    /// Measure prefill and decode speed, with MTP at several depths.
    Bench(bench::BenchArgs),
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    if let Err(e) = run(Cli::parse()) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Chat(a) => chat::run(a),
        Command::Bench(a) => bench::run(a),
    }
}
