//! `tandem convert` and `tandem inspect`: conversion with a progress bar, and the model report.

use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use tandem::quant::{self, Control, ConvertEvent, ConvertOptions};

#[derive(Args)]
pub struct ConvertArgs {
    /// The source model folder (never written to).
    src: PathBuf,
    /// The destination folder; it appears only when complete.
    #[arg(long)]
    out: PathBuf,
    /// 2, 3, 4, 5, 6, 8 (or none: dtype conversion only).
    #[arg(long)]
    bits: Option<String>,
    /// Weights per quantization group: 32, 64 or 128.
    #[arg(long, value_parser = quant::parse_group_size, default_value = "64")]
    group_size: u32,
    /// uniform, mixed_3_6, mixed_4_6 or auto.
    #[arg(long, default_value = "uniform")]
    recipe: quant::Recipe,
    /// Bits per weight that `auto` aims at.
    #[arg(long)]
    target_bpw: Option<f64>,
    /// Calibration text for `auto` (default: text shipped with Tandem).
    #[arg(long)]
    calibration: Option<PathBuf>,
    /// bf16, f16, or f32 (full precision, to check a doubtful output against).
    #[arg(long, default_value = "bf16")]
    dtype: quant::OutDtype,
    /// keep or drop the MTP head.
    #[arg(long, default_value = "keep")]
    mtp: quant::MtpMode,
    /// Bits for the MTP head's linears, or none to keep them in full precision.
    #[arg(long)]
    mtp_bits: Option<quant::MtpBits>,
    /// Write a copy whose re-attached MTP head has its norm convention fixed.
    #[arg(long)]
    repair: bool,
    /// Replace an existing destination.
    #[arg(long)]
    force: bool,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct InspectArgs {
    /// The model folder (Hugging Face or MLX layout).
    path: PathBuf,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(a: ConvertArgs) -> Result<()> {
    let bar = progress_bar(a.json);
    let mut on_event = |e: &ConvertEvent| {
        match e {
            ConvertEvent::Planned { predicted_bytes, predicted_bpw, .. } => {
                bar.println(format!(
                    "planned: {:.2} MB at {predicted_bpw:.3} bits per weight",
                    *predicted_bytes as f64 / 1e6
                ));
            }
            ConvertEvent::Tensor { name, bytes_done, bytes_total, .. } => {
                bar.set_length(*bytes_total);
                bar.set_position(*bytes_done);
                bar.set_message(name.clone());
            }
            ConvertEvent::Calibrating { module, done, total } => {
                bar.set_message(format!("calibrating {module} ({done}/{total})"));
            }
            _ => {}
        }
        Control::Continue
    };
    let bits = match a.bits.as_deref() {
        Some(b) => quant::parse_bits(b).with_context(|| format!("--bits {b}"))?,
        None => None,
    };
    let quantizing = bits.is_some() || a.recipe != quant::Recipe::Uniform;
    if a.repair && !quantizing {
        let r = quant::repair_with(&a.src, &a.out, a.force, &mut on_event)?;
        bar.finish_and_clear();
        if a.json {
            crate::out::line(serde_json::to_string_pretty(&r)?);
        } else {
            crate::out::line(&r.message);
        }
        return Ok(());
    }
    let opts = ConvertOptions {
        bits,
        group_size: a.group_size,
        recipe: a.recipe,
        target_bpw: a.target_bpw,
        calibration: a.calibration,
        dtype: a.dtype,
        mtp: a.mtp,
        mtp_bits: a.mtp_bits,
        force: a.force,
        repair: a.repair,
        ..Default::default()
    };
    let report = quant::convert(&a.src, &a.out, &opts, &mut on_event)
        .with_context(|| format!("converting {}", a.src.display()))?;
    bar.finish_and_clear();
    if a.json {
        crate::out::line(serde_json::to_string_pretty(&report)?);
    } else {
        crate::out::line(format!(
            "wrote {} ({:.2} MB, {:.3} bits per weight; predicted {:.2} MB) in {:.1} s",
            report.dst.display(),
            report.bytes as f64 / 1e6,
            report.bpw,
            report.predicted_bytes as f64 / 1e6,
            report.seconds
        ));
        for n in &report.notes {
            crate::out::line(format!("note: {n}"));
        }
    }
    Ok(())
}

fn progress_bar(quiet: bool) -> ProgressBar {
    if quiet || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {wide_msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar
}

pub fn inspect(a: InspectArgs) -> Result<()> {
    let r = quant::inspect(&a.path)?;
    if a.json {
        crate::out::line(serde_json::to_string_pretty(&r)?);
        return Ok(());
    }
    for line in describe(&a.path, &r) {
        crate::out::line(line);
    }
    Ok(())
}

/// `tandem inspect` for a person: sizes in units, quantization per module group, the MTP head's
/// verdict and what the probe measured, then each head norm's statistics.
fn describe(path: &std::path::Path, r: &quant::InspectReport) -> Vec<String> {
    let layout = match r.format {
        tandem::model::Layout::Hf => "Hugging Face layout",
        tandem::model::Layout::Mlx => "MLX layout",
    };
    let bpw = if r.params > 0 { r.bytes as f64 * 8.0 / r.params as f64 } else { 0.0 };
    let mut out = vec![
        format!("{}: {}, {layout}", path.display(), r.architecture),
        format!(
            "  {:.2} M parameters, {:.1} MB of weights ({bpw:.2} bits per weight)",
            r.params as f64 / 1e6,
            r.bytes as f64 / 1e6
        ),
    ];
    match &r.quantization {
        None => out.push("  quantization: none".into()),
        Some(q) => {
            let default = q
                .default
                .as_ref()
                .map(|d| format!("{}-bit, group {}", d.bits, d.group_size))
                .unwrap_or_else(|| "per module".into());
            out.push(format!("  quantization: {default}"));
            for (group, g) in &q.groups {
                let mut parts: Vec<String> = g.bits.iter().map(|(b, n)| format!("{n} at {b}-bit")).collect();
                if g.dense > 0 {
                    parts.push(format!("{} dense", g.dense));
                }
                out.push(format!("    {group:<12} {} module(s): {}", g.modules, parts.join(", ")));
            }
        }
    }
    let m = &r.mtp;
    let verdict = serde_json::to_value(m.verdict).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default();
    out.push(format!(
        "  MTP head: {} declared layer(s), {} tensor(s); {verdict}: {}",
        m.declared_layers, m.tensors_found, m.message
    ));
    if let Some(p) = &m.probe {
        let tried =
            p.tried.iter().map(|t| format!("{} {:.3}", t.convention, t.acceptance)).collect::<Vec<_>>().join(", ");
        out.push(if p.inconclusive {
            format!(
                "  MTP probe: inconclusive (the body agrees {:.3} with the probe text: it cannot judge a head); {} tokens, {:.2} s",
                p.body_agreement, p.tokens, p.seconds
            )
        } else {
            match (p.acceptance, &p.chosen) {
                (Some(a), Some(c)) => format!(
                    "  MTP probe: {a:.3} top-1 agreement with the body (the depth-1 acceptance to expect), norms read {c}; tried {tried}; {} tokens, {:.2} s",
                    p.tokens, p.seconds
                ),
                _ => format!("  MTP probe: no head runs (tried {tried}); {} tokens, {:.2} s", p.tokens, p.seconds),
            }
        });
    }
    for n in &m.norms {
        let convention =
            serde_json::to_value(n.convention).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default();
        out.push(format!("    {:<48} mean {:>8.4}  {convention}", n.name, n.mean));
    }
    out
}
