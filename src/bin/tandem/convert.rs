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
    let mut progress = ConvertBar::new(progress_bar(a.json));
    let mut on_event = |e: &ConvertEvent| {
        progress.event(e);
        Control::Continue
    };
    let bits = match a.bits.as_deref() {
        Some(b) => quant::parse_bits(b).with_context(|| format!("--bits {b}"))?,
        None => None,
    };
    let quantizing = bits.is_some() || a.recipe != quant::Recipe::Uniform;
    if a.repair && !quantizing {
        let r = quant::repair_with(&a.src, &a.out, a.force, &mut on_event)?;
        progress.bar.finish_and_clear();
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
    progress.bar.finish_and_clear();
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
    ProgressBar::new(0)
}

/// A conversion's bar: what it is doing before any figure is known, the modules `auto` has measured
/// (with the calibration tokens and an ETA) while it calibrates, then the bytes written.
struct ConvertBar {
    bar: ProgressBar,
    phase: Phase,
}

#[derive(PartialEq)]
enum Phase {
    Reading,
    Calibrating,
    Writing,
}

impl ConvertBar {
    fn new(bar: ProgressBar) -> ConvertBar {
        bar.set_style(style("{spinner} {wide_msg}"));
        bar.set_message("reading the source");
        ConvertBar { bar, phase: Phase::Reading }
    }

    fn enter(&mut self, phase: Phase, template: &str) {
        if self.phase != phase {
            self.bar.set_style(style(template));
            self.bar.set_position(0);
            self.bar.reset_eta();
            self.phase = phase;
        }
    }

    fn event(&mut self, e: &ConvertEvent) {
        match e {
            ConvertEvent::Planned { predicted_bytes, predicted_bpw, .. } => {
                self.bar.println(format!(
                    "planned: {:.2} MB at {predicted_bpw:.3} bits per weight",
                    *predicted_bytes as f64 / 1e6
                ));
            }
            ConvertEvent::Calibrating { module, done, total, tokens } => {
                self.enter(Phase::Calibrating, "{bar:40} {pos}/{len} modules measured, {eta} left: {wide_msg}");
                self.bar.set_length(*total as u64);
                self.bar.set_position(*done as u64);
                self.bar.set_message(format!("{module} ({tokens} calibration tokens)"));
            }
            ConvertEvent::Tensor { name, bytes_done, bytes_total, .. } => {
                self.enter(Phase::Writing, "{bar:40} {bytes}/{total_bytes} {wide_msg}");
                self.bar.set_length(*bytes_total);
                self.bar.set_position(*bytes_done);
                self.bar.set_message(name.clone());
            }
            _ => {}
        }
    }
}

fn style(template: &str) -> ProgressStyle {
    ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar())
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

#[cfg(test)]
mod tests {
    use super::*;
    use indicatif::{InMemoryTerm, ProgressDrawTarget};

    /// What a terminal of this bar shows after `events`.
    fn shown(events: &[ConvertEvent]) -> String {
        let term = InMemoryTerm::new(4, 120);
        let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::term_like(Box::new(term.clone())));
        let mut progress = ConvertBar::new(bar);
        for e in events {
            progress.event(e);
        }
        progress.bar.tick();
        term.contents()
    }

    #[test]
    fn calibration_shows_modules_and_tokens_and_writing_shows_bytes() {
        let start = shown(&[]);
        assert!(start.contains("reading the source") && !start.contains("0 B"), "{start:?}");
        let cal =
            |done| ConvertEvent::Calibrating { module: "layers.3.mlp.up_proj".into(), done, total: 40, tokens: 256 };
        let calibrating = shown(&[cal(1), cal(12)]);
        assert!(calibrating.contains("12/40 modules measured"), "{calibrating:?}");
        assert!(calibrating.contains("layers.3.mlp.up_proj (256 calibration tokens)"), "{calibrating:?}");
        assert!(!calibrating.contains("0 B/0 B"), "{calibrating:?}");
        let tensor = ConvertEvent::Tensor {
            name: "lm_head.weight".into(),
            index: 3,
            total: 9,
            bytes_done: 2_000_000,
            bytes_total: 8_000_000,
        };
        let writing = shown(&[cal(40), tensor]);
        assert!(writing.contains("1.91 MiB/7.63 MiB") && writing.contains("lm_head.weight"), "{writing:?}");
        assert!(!writing.contains("modules"), "{writing:?}");
    }
}
