//! `tandem graft MODEL [--from ORG/NAME[@REV]]`: the MTP head of a raw checkpoint onto an MLX conversion
//! that dropped it. Only config.json and the weight files holding `mtp.*` are downloaded (into the Hub
//! cache, checksummed); the result is a new model `<MODEL>-mtp` beside it, kept only if the acceptance
//! probe passes.

use anyhow::{Context, Result};
use clap::Args;
use tandem::hub::{self, HubConfig, PullOptions, RepoRef};

use crate::model_arg;
use crate::pull::{pull_with_bar, size};

#[derive(Args)]
pub struct GraftArgs {
    /// The conversion without a head: a model of models.toml by name, or a model folder.
    model: String,
    /// The raw checkpoint the conversion came from (`ORG/NAME[@REVISION]`). Default: the model card's
    /// `base_model`, or the catalogue's base of the repo it was downloaded from.
    #[arg(long, value_name = "REPO")]
    from: Option<String>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

pub fn run(a: GraftArgs) -> Result<()> {
    let registry = model_arg::registry()?;
    let entry = registry.resolve(&a.model)?;
    let cfg = HubConfig::from_env();
    let from: RepoRef = match &a.from {
        Some(f) => f.parse()?,
        None => tandem::engine::remote::base_of(&entry.path, &cfg.cache, registry.catalog())
            .with_context(|| {
                format!(
                    "{}: no base_model in its README.md and not a catalogue repo: say which raw checkpoint it came from with --from ORG/NAME",
                    entry.path.display()
                )
            })?
            .parse()?,
    };
    let preview = hub::preview(&cfg, &from)?;
    if preview.head_files.is_empty() {
        anyhow::bail!("{}: its weights hold no MTP head (no `mtp.*` tensor listed)", from.repo);
    }
    let include = preview.head_download();
    let head_bytes: u64 = preview.files.iter().filter(|f| include.contains(&f.path)).map(|f| f.size).sum();
    if !a.quiet && !a.json {
        crate::out::line(format!(
            "{}: the head is in {} ({} of {} of weights)",
            from.repo,
            preview.head_files.join(", "),
            size(head_bytes),
            size(preview.weight_bytes)
        ));
    }
    let pinned = RepoRef { repo: from.repo.clone(), revision: preview.commit.clone() };
    let pulled = pull_with_bar(&cfg, &pinned, &PullOptions { include, ..Default::default() }, a.quiet || a.json)?;
    let name = entry.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or(entry.name.clone());
    let dst = tandem::engine::remote::graft_destination(registry.models_dir(), &name)?;
    let report = tandem::quant::graft_head(&entry.path, &pulled.snapshot, &dst, &Default::default())
        .with_context(|| format!("grafting the head of {} onto {}", from.repo, entry.path.display()))?;
    if a.json {
        crate::out::line(serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    let new_name = dst.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    crate::out::line(format!(
        "{}\n  in {}\n  as model `{new_name}`: tandem chat --model {new_name}",
        report.message,
        dst.display()
    ));
    Ok(())
}
