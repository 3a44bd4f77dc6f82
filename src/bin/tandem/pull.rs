//! `tandem pull ORG/NAME[@REVISION]`: a model from Hugging Face into the Hub cache (`tandem::hub`),
//! linked into the models folder, then what to do with it.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use tandem::hub::{self, Control, HubConfig, PullEvent, PullOptions, RepoRef};

use crate::model_arg;

#[derive(Args)]
pub struct PullArgs {
    /// The repo, e.g. `Qwen/Qwen3.5-4B` or `mlx-community/Qwen3.5-4B-4bit`, optionally `@BRANCH`, `@TAG`
    /// or `@COMMIT` (default `@main`; the commit it names is recorded).
    repo: String,
    /// Only the files matching these globs (e.g. `--include '*.json' --include '*.safetensors'`); may repeat.
    #[arg(long, value_name = "GLOB")]
    include: Vec<String>,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

pub fn run(a: PullArgs) -> Result<()> {
    let r: RepoRef = a.repo.parse()?;
    let cfg = HubConfig::from_env();
    let registry = model_arg::registry()?;
    let opts = PullOptions { include: a.include.clone(), ..Default::default() };
    let pulled = pull_with_bar(&cfg, &r, &opts, a.quiet)?;
    let link = hub::link_into_models(registry.models_dir(), &pulled).with_context(|| {
        format!("downloaded to {}, but cannot link it into the models folder", pulled.snapshot.display())
    })?;
    if a.json {
        let v = serde_json::json!({ "pulled": pulled, "model_folder": link });
        crate::out::line(serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let name = link.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    crate::out::line(format!(
        "{}@{} ({}): {} files, {} downloaded, {} already here\n  in {}\n  as model `{name}` ({})",
        pulled.repo,
        pulled.revision,
        &pulled.commit[..12.min(pulled.commit.len())],
        pulled.files,
        size(pulled.downloaded_bytes),
        size(pulled.cached_bytes),
        pulled.snapshot.display(),
        link.display()
    ));
    let info = tandem::engine::catalog::inspect_folder(&link);
    let mut sys = sysinfo::System::new();
    sys.refresh_memory();
    let fit = tandem::engine::catalog::fit(info.size_bytes, info.quantization.is_none(), sys.total_memory());
    crate::out::line(match (fit.fits, fit.recommended_bits) {
        (true, _) => format!("  needs about {} of memory to run; this machine has {}", size(fit.need), size(sys.total_memory())),
        (false, Some(bits)) => format!(
            "  needs about {} of memory as it is, more than this machine's {} allows: convert it to {bits} bits (or fewer) to run it here",
            size(fit.need),
            size(sys.total_memory())
        ),
        (false, None) => format!(
            "  needs about {} of memory, more than this machine's {} allows even quantized",
            size(fit.need),
            size(sys.total_memory())
        ),
    });
    let mtp = if info.mtp_available { "with its MTP head" } else { "without an MTP head" };
    let base = tandem::engine::remote::base_of(&link, &cfg.cache, registry.catalog());
    match info.format {
        Some(tandem::model::Layout::Hf) => crate::out::line(format!(
            "  a raw checkpoint {mtp}: chat with it as it is (tandem chat --model {name}), or quantize it, keeping the head: \
             tandem convert {name} --bits 4 --out {}",
            registry.models_dir().join(format!("{name}-4bit")).display()
        )),
        Some(_) if !info.mtp_available && base.is_some() => crate::out::line(format!(
            "  an MLX model {mtp}: tandem chat --model {name}; for MTP decoding, graft the head of {} onto it \
             (only the files that hold it are fetched): tandem graft {name}",
            base.unwrap_or_default()
        )),
        Some(_) => crate::out::line(format!("  an MLX model {mtp}: tandem chat --model {name}")),
        None => crate::out::line(format!(
            "  not a model Tandem reads: {}",
            info.error.unwrap_or_else(|| "no config.json and weights".into())
        )),
    }
    Ok(())
}

/// `hub::pull` with a progress bar on a terminal (none when `quiet`); Ctrl-C stops after the current
/// read, keeping what arrived, a second Ctrl-C at once.
pub fn pull_with_bar(cfg: &HubConfig, r: &RepoRef, opts: &PullOptions, quiet: bool) -> Result<hub::Pulled> {
    let cancel = Arc::new(AtomicBool::new(false));
    {
        let cancel = cancel.clone();
        let _ = ctrlc::set_handler(move || {
            if cancel.swap(true, Ordering::SeqCst) {
                std::process::exit(130);
            }
        });
    }
    let bar = if quiet || !std::io::stderr().is_terminal() {
        ProgressBar::hidden()
    } else {
        let bar = ProgressBar::new(0);
        bar.set_style(
            ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {bytes_per_sec} {eta} {wide_msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar
    };
    let pulled = hub::pull(cfg, r, opts, &mut |ev| {
        match ev {
            PullEvent::Listed { commit, files, total_bytes, cached_bytes } => {
                bar.set_length(total_bytes);
                bar.set_position(cached_bytes);
                bar.println(format!(
                    "{r}: commit {commit}, {} files, {} to fetch",
                    files.len(),
                    size(total_bytes - cached_bytes)
                ));
            }
            PullEvent::Progress { file, done, .. } => {
                bar.set_position(done);
                bar.set_message(file);
            }
            PullEvent::FileDone { .. } => {}
        }
        if cancel.load(Ordering::SeqCst) {
            Control::Cancel
        } else {
            Control::Continue
        }
    });
    bar.finish_and_clear();
    match pulled {
        Err(hub::HubError::Cancelled) => {
            anyhow::bail!("cancelled: what arrived is kept; the same command resumes it")
        }
        other => Ok(other?),
    }
}

pub fn size(bytes: u64) -> String {
    match bytes {
        b if b >= 1_000_000_000 => format!("{:.2} GB", b as f64 / 1e9),
        b if b >= 1_000_000 => format!("{:.1} MB", b as f64 / 1e6),
        b => format!("{b} B"),
    }
}
