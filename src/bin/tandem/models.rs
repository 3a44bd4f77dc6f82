//! `tandem models`: the registry's models, with format and MTP status read from each folder.

use anyhow::Result;
use clap::Args;
use serde::Serialize;

use crate::model_arg;

#[derive(Args)]
pub struct ModelsArgs {
    /// Print the list as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct Row {
    name: String,
    path: String,
    source: tandem::registry::ModelSource,
    default: bool,
    mtp: tandem::registry::MtpSettings,
    sampling: tandem::registry::SamplingSettings,
    /// Whether the folder is there: a models.toml entry may name one that was moved or deleted.
    present: bool,
}

pub fn run(a: ModelsArgs) -> Result<()> {
    let reg = model_arg::registry()?;
    let default = reg.default_model().ok().map(|m| m.name);
    let rows: Vec<Row> = reg
        .list()
        .into_iter()
        .map(|m| Row {
            default: default.as_deref() == Some(m.name.as_str()),
            present: m.path.is_dir(),
            name: m.name,
            path: m.path.display().to_string(),
            source: m.source,
            mtp: m.mtp,
            sampling: m.sampling,
        })
        .collect();
    if a.json {
        crate::out::line(serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    if rows.is_empty() {
        eprintln!(
            "No models: {} lists none and {} holds none. Add a [[model]] entry, or convert a checkpoint into the \
             models folder: tandem convert SRC --out {}",
            reg.path().display(),
            reg.models_dir().display(),
            reg.models_dir().join("NAME").display()
        );
        return Ok(());
    }
    let missing = rows.iter().filter(|r| !r.present).count();
    for r in rows {
        let mtp = if r.mtp.enabled { format!("MTP depth {}", r.mtp.depth) } else { "MTP off".into() };
        crate::out::line(format!(
            "{}{:<24} {:<10} {}  {}{}",
            if r.default { "* " } else { "  " },
            r.name,
            format!("{:?}", r.source).to_lowercase(),
            mtp,
            r.path,
            if r.present { "" } else { "  (missing: no such folder)" }
        ));
    }
    if missing > 0 {
        eprintln!(
            "{missing} model folder(s) missing: fix or remove their [[model]] entries in {}",
            reg.path().display()
        );
    }
    Ok(())
}
