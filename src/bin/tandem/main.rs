//! `tandem`: the command-line shell over the engine (docs/ARCHITECTURE.md §4.1).

mod bench;
mod chat;
mod convert;
mod graft;
mod group;
mod model_arg;
mod models;
mod out;
mod pull;
mod serve;
mod worker;

use anyhow::Result;
use clap::{Parser, Subcommand};

/// On Linux every allocation of the process, MLX's C++ ones included (the crate's `override` feature
/// defines `malloc` and `free`), goes to mimalloc: MLX builds and evaluates a graph of small arrays on
/// one thread and frees many of them on its stream's, where glibc's malloc took a quarter of the
/// launching thread's time (docs/PERF.md, session 29).
#[cfg(target_os = "linux")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
    /// Convert and quantize a model, keeping its MTP head.
    Convert(convert::ConvertArgs),
    /// Format, parameters, quantization and the MTP report of a model folder.
    Inspect(convert::InspectArgs),
    /// Serve the HTTP API and the web UI.
    Serve(serve::ServeArgs),
    /// Serve a share of a model split over several machines, following `tandem serve --hostfile`.
    Worker(worker::WorkerArgs),
    /// List the models in models.toml and the models folder.
    Models(models::ModelsArgs),
    /// Download a model from Hugging Face (resumable, checksummed, into the Hub cache) and link it into
    /// the models folder.
    Pull(pull::PullArgs),
    /// Give an MLX conversion that lacks it the MTP head of the raw checkpoint it came from (only the
    /// files that hold the head are downloaded; kept only if the acceptance probe passes).
    Graft(graft::GraftArgs),
}

fn main() {
    tandem::quant::fail_writes_past_the_file_size_limit();
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
        Command::Models(a) => models::run(a),
        Command::Serve(a) => serve::run(a),
        Command::Worker(a) => worker::run(a),
        Command::Convert(a) => convert::run(a),
        Command::Inspect(a) => convert::inspect(a),
        Command::Pull(a) => pull::run(a),
        Command::Graft(a) => graft::run(a),
    }
}
