//! `tandem bench`: prefill and decode speed, and MTP at several depths, on one model and prompt.

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Serialize;
use tandem::generate::{generate, Control, GenerateOptions, MtpOptions, Oracle, SamplingParams, Stats};

use crate::model_arg;

mod streams;

#[derive(Args)]
pub struct BenchArgs {
    /// A model of models.toml by name, or a model folder. Default: models.toml's default.
    #[arg(long)]
    model: Option<String>,
    /// Prompt length to prefill (a fixed English text, repeated as needed).
    #[arg(long, default_value_t = 256)]
    prompt_tokens: usize,
    /// Tokens to decode per run (greedy, past any end-of-sequence token).
    #[arg(long, default_value_t = 128)]
    gen_tokens: usize,
    /// MTP depths to measure; 0 is plain decoding.
    #[arg(long, value_delimiter = ',', default_value = "0,1,2,3")]
    depths: Vec<usize>,
    /// Also run with the adaptive controller on, at the largest depth.
    #[arg(long)]
    adaptive: bool,
    /// Draft from the plain greedy continuation, each draft right with probability P (the rest
    /// wrong): prices MTP at any acceptance on any model, random weights included. The head,
    /// verify and rollback do their real work.
    #[arg(long, value_name = "P")]
    oracle_acceptance: Option<f64>,
    /// Measure a chat's second turn instead: turn 1 is the prompt and its reply (`--gen-tokens`),
    /// turn 2 resends both with a new message; time to first token of turn 2 without and with the
    /// prefix cache, at each depth of `--depths`.
    #[arg(long)]
    prefix_cache: bool,
    /// With `--prefix-cache`: turn 1's snapshots go to an SSD tier in a new folder inside DIR
    /// (removed afterwards), and turn 2 restores through a fresh memory tier over it, as after a
    /// restart: the restore from disk, and the bytes each turn writes.
    #[arg(long, value_name = "DIR", requires = "prefix_cache")]
    prefix_disk: Option<std::path::PathBuf>,
    /// Decode this many streams together (the engine's continuous batching), e.g. `1,2,4,8`: each
    /// size's aggregate tok/s beside one stream's, and each stream's own, at every depth of
    /// `--depths` (plain first; `--oracle-acceptance` drafts from the plain batch's tokens).
    #[arg(long, value_delimiter = ',')]
    streams: Vec<usize>,
    /// Print one JSON object with every run's statistics instead of the table.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct Run {
    depth: usize,
    adaptive: bool,
    speedup: f64,
    peak_memory_bytes: usize,
    stats: Stats,
}

#[derive(Serialize)]
struct Report {
    model: String,
    device: String,
    /// Cpu, Metal or Cuda.
    backend: String,
    mlx: String,
    prompt_tokens: usize,
    gen_tokens: usize,
    /// The oracle's acceptance probability when drafts came from the plain continuation.
    oracle_acceptance: Option<f64>,
    /// MLX operations per forward, counted before evaluation: a plain step (width 1) and each
    /// depth's verify (width depth + 1); `draft` adds one MTP draft to the plain step.
    graph_ops: Vec<GraphOps>,
    /// Whether the elementwise chains ran compiled (`TANDEM_COMPILE`).
    compiled: bool,
    /// On CUDA, how custom kernels took their headers: `files` (included) or `inline: why`
    /// (`mlx::kernel::cuda_headers_in_files`, `TANDEM_KERNEL_HEADERS`).
    #[serde(skip_serializing_if = "Option::is_none")]
    cuda_headers: Option<String>,
    runs: Vec<Run>,
    /// `--streams`: sequences decoded together.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    streams: Vec<streams::StreamRun>,
}

#[derive(Serialize)]
struct GraphOps {
    width: usize,
    ops: usize,
    draft_ops: Option<usize>,
    /// The same operations by MLX primitive name, most first.
    by_op: Vec<(String, usize)>,
}

/// Public-domain text (Moby-Dick, chapter 1) repeated to the requested prompt length.
const TEXT: &str = "Call me Ishmael. Some years ago, never mind how long precisely, having little or no money in my \
purse, and nothing particular to interest me on shore, I thought I would sail about a little and see the watery \
part of the world. It is a way I have of driving off the spleen and regulating the circulation. Whenever I find \
myself growing grim about the mouth; whenever it is a damp, drizzly November in my soul; then, I account it high \
time to get to sea as soon as I can. ";

pub fn run(a: BenchArgs) -> Result<()> {
    if a.prompt_tokens == 0 || a.gen_tokens < 2 {
        bail!("--prompt-tokens must be at least 1 and --gen-tokens at least 2");
    }
    // Depth 0 is plain decoding; the others are MTP depths.
    let max = *tandem::generate::MTP_DEPTHS.end();
    if let Some(d) = a.depths.iter().find(|&&d| d > max) {
        bail!("--depths: {d} is outside 0..={max}");
    }
    if let Some(p) = a.oracle_acceptance.filter(|p| !(0.0..=1.0).contains(p)) {
        bail!("--oracle-acceptance: {p} is outside 0..=1");
    }
    let l = model_arg::load(a.model.as_deref())?;
    let mut ids = Vec::new();
    while ids.len() < a.prompt_tokens {
        ids.extend(l.tokenizer.encode(TEXT, false)?);
    }
    ids.truncate(a.prompt_tokens);
    if a.prefix_cache {
        return prefix_turns(&a, &l, &ids);
    }
    if !a.streams.is_empty() {
        return batched(&a, &l, &ids);
    }
    let opts_for = |depth: usize, adaptive: bool| options(&a, depth, adaptive);
    let mut plan: Vec<(usize, bool)> = a.depths.iter().map(|&d| (d, false)).collect();
    // The oracle drafts from the plain continuation: decode plainly first.
    if a.oracle_acceptance.is_some() {
        plan.retain(|&(d, _)| d > 0);
        plan.insert(0, (0, false));
    }
    if a.adaptive {
        plan.push((a.depths.iter().copied().max().unwrap_or(3).max(1), true));
    }
    warm_up(&l.model, &ids, &plan, &opts_for)?;
    let mut widths: Vec<usize> = a.depths.iter().map(|d| d + 1).collect();
    widths.sort_unstable();
    widths.dedup();
    let mut graph_ops = Vec::new();
    for width in widths {
        let counted = tandem::generate::step::graph_ops(&l.model, &ids, width)?;
        let ops = counted.by_op.iter().map(|(_, n)| n).sum();
        // A draft follows a plain step.
        let draft_ops = counted.draft.filter(|_| width == 1);
        let by_op = counted.by_op;
        if !a.json {
            let draft = draft_ops.map(|d| format!(", an MTP draft {d} more")).unwrap_or_default();
            eprintln!("MLX operations for a forward of {width} token(s): {ops}{draft}");
        }
        graph_ops.push(GraphOps { width, ops, draft_ops, by_op });
    }
    let mut runs: Vec<Run> = Vec::new();
    let mut plain: Option<Vec<u32>> = None;
    for (depth, adaptive) in plan {
        mlx::device::reset_peak_memory();
        let mut opts = opts_for(depth, adaptive);
        if let (Some(acceptance), Some(continuation), true) = (a.oracle_acceptance, &plain, depth > 0) {
            opts.oracle = Some(Oracle { continuation: continuation.clone(), acceptance, seed: 0 });
        }
        let out = generate(&l.model, &ids, &opts, &mut |_| Control::Continue)?;
        if depth == 0 {
            plain.get_or_insert_with(|| out.tokens.clone());
        }
        let base = runs.iter().find(|r| r.depth == 0).map(|r| r.stats.decode_tok_s);
        let speedup = base.map_or(1.0, |b| out.stats.decode_tok_s / b.max(1e-9));
        runs.push(Run {
            depth,
            adaptive,
            speedup,
            peak_memory_bytes: mlx::device::memory_stats().peak,
            stats: out.stats,
        });
        if !a.json {
            let r = runs.last().expect("just pushed");
            let (acc, tpc) = r.stats.spec.as_ref().map_or((String::from("-"), String::from("1.00")), |s| {
                (format!("{:.1}%", s.acceptance * 100.0), format!("{:.2}", s.tok_per_cycle))
            });
            eprintln!(
                "depth {}{:<10} prefill {:>8.1} tok/s  decode {:>7.1} tok/s  tok/cycle {:>5}  acceptance {:>6}  speedup {:.2}x  peak {:.1} MB",
                r.depth,
                if r.adaptive { " adaptive" } else { "" },
                r.stats.prefill_tok_s,
                r.stats.decode_tok_s,
                tpc,
                acc,
                r.speedup,
                r.peak_memory_bytes as f64 / 1e6
            );
        }
    }
    if a.json {
        let report = Report { graph_ops, runs, ..Report::new(&a, &l, ids.len()) };
        crate::out::line(serde_json::to_string_pretty(&report)?);
    }
    Ok(())
}

/// Greedy decoding of exactly `--gen-tokens` (no stop token), plain at depth 0, MTP otherwise.
fn options(a: &BenchArgs, depth: usize, adaptive: bool) -> GenerateOptions {
    GenerateOptions {
        max_tokens: a.gen_tokens,
        sampling: SamplingParams::greedy(),
        stop_ids: vec![], // always generate gen_tokens
        mtp: MtpOptions {
            enabled: depth > 0,
            depth: depth.max(1),
            adaptive,
            exact_verify: false,
            ..MtpOptions::default()
        },
        ..Default::default()
    }
}

impl Report {
    /// The machine and the run's settings, with no figures yet.
    fn new(a: &BenchArgs, l: &crate::model_arg::Loaded, prompt_tokens: usize) -> Report {
        Report {
            model: l.entry.name.clone(),
            device: format!("{:?}", mlx::device::default_device()),
            backend: format!("{:?}", mlx::device::backend()),
            mlx: mlx::device::version(),
            prompt_tokens,
            gen_tokens: a.gen_tokens,
            oracle_acceptance: a.oracle_acceptance,
            graph_ops: Vec::new(),
            compiled: tandem::kernels::fused::enabled(),
            cuda_headers: (mlx::device::backend() == mlx::device::Backend::Cuda).then(mlx::kernel::cuda_headers_mode),
            runs: Vec::new(),
            streams: Vec::new(),
        }
    }
}

/// `--streams`: the prompts (each stream its own: the text from another word on), the runs, the report.
fn batched(a: &BenchArgs, l: &crate::model_arg::Loaded, ids: &[u32]) -> Result<()> {
    let most = a.streams.iter().copied().max().unwrap_or(1).max(1);
    let text = l.tokenizer.encode(TEXT, false)?;
    let prompts: Vec<Vec<u32>> = (0..most)
        .map(|i| text.iter().cycle().skip(i * 7 % text.len().max(1)).take(ids.len()).copied().collect())
        .collect();
    let opts_for = |depth: usize| options(a, depth, a.adaptive);
    let runs = streams::run(a, &l.model, &prompts, &opts_for)?;
    if a.json {
        let report = Report { streams: runs, ..Report::new(a, l, ids.len()) };
        crate::out::line(serde_json::to_string_pretty(&report)?);
    }
    Ok(())
}

/// Tokens each warm-up run decodes: at depth 3 and acceptance [`WARM_ACCEPTANCE`] about 25 verify
/// cycles, so every accepted count 0..=depth (each a rollback of its own shape) is met with a
/// probability over 0.99.
const WARM_TOKENS: usize = 64;
const WARM_ACCEPTANCE: f64 = 0.6;

/// Untimed runs at the measured prompt length before any figure: first-use allocations and kernel
/// compilation (GPU backends build kernels per shape; a first verify at a new depth cost ~0.3 s on the
/// H200, a third of a 128-token run) stay out of the figures. One plain run, then a verify at every
/// depth the plan measures and, for the adaptive controller, every depth it may choose (1..=its
/// largest), with oracle drafts from the plain run's tokens so that verifies keep 0..=depth tokens and
/// every rollback shape runs too (random weights never accept the head's own drafts).
fn warm_up(
    model: &tandem::model::Qwen35,
    ids: &[u32],
    plan: &[(usize, bool)],
    opts_for: &dyn Fn(usize, bool) -> GenerateOptions,
) -> Result<()> {
    let run = |opts: &GenerateOptions| generate(model, ids, opts, &mut |_| Control::Continue);
    let plain = run(&GenerateOptions { max_tokens: WARM_TOKENS, ..opts_for(0, false) })?.tokens;
    let mut depths: Vec<usize> = plan.iter().map(|&(d, _)| d).filter(|&d| d > 0).collect();
    if let Some(&(max, _)) = plan.iter().find(|&&(_, adaptive)| adaptive) {
        depths.extend(1..=max);
    }
    depths.sort_unstable();
    depths.dedup();
    for depth in depths {
        let oracle = Some(Oracle { continuation: plain.clone(), acceptance: WARM_ACCEPTANCE, seed: depth as u64 });
        run(&GenerateOptions { max_tokens: WARM_TOKENS, oracle, ..opts_for(depth, false) })?;
    }
    // The adaptive controller's own path (its probes, parking, the head's catch-up).
    for &(depth, adaptive) in plan.iter().filter(|&&(_, adaptive)| adaptive) {
        run(&GenerateOptions { max_tokens: WARM_TOKENS, ..opts_for(depth, adaptive) })?;
    }
    Ok(())
}

#[derive(Serialize)]
struct TurnRun {
    depth: usize,
    turn2_tokens: usize,
    cached_tokens: usize,
    /// Medians over the repetitions.
    ttft_ms_cold: f64,
    ttft_ms_cached: f64,
    speedup: f64,
    same_tokens: bool,
    /// `--prefix-disk`: bytes turn 1 wrote (the whole conversation so far), and turn 2 (its new
    /// tokens' state only: blocks already on disk are not written again).
    #[serde(skip_serializing_if = "Option::is_none")]
    disk_bytes_turn1: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    disk_bytes_turn2: Option<u64>,
}

/// `--prefix-disk`'s folder where this run had to create it: removed at the end (when empty, as the
/// repetitions' scratch folders leave it), so a bench leaves nothing behind.
struct CreatedDir(Option<std::path::PathBuf>);

impl Drop for CreatedDir {
    fn drop(&mut self) {
        if let Some(dir) = &self.0 {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// A fresh folder for one repetition's SSD tier inside `--prefix-disk` (removed when dropped:
/// nothing already in the folder is touched).
fn scratch(a: &BenchArgs) -> Result<Option<tempfile::TempDir>> {
    let Some(dir) = &a.prefix_disk else { return Ok(None) };
    std::fs::create_dir_all(dir).with_context(|| format!("--prefix-disk: cannot create {}", dir.display()))?;
    let t = tempfile::Builder::new()
        .prefix("tandem-bench-prefix-")
        .tempdir_in(dir)
        .with_context(|| format!("--prefix-disk: cannot write in {}", dir.display()))?;
    Ok(Some(t))
}

/// A fresh memory tier, over the SSD tier in `dir` when there is one.
fn cache_over(
    dir: Option<&tempfile::TempDir>,
    l: &crate::model_arg::Loaded,
) -> Result<tandem::engine::prefix_cache::PrefixCache> {
    use tandem::engine::prefix_cache::{model_identity, Disk, PrefixCache};
    let Some(dir) = dir else { return Ok(PrefixCache::new(u64::MAX)) };
    let settings = tandem::registry::PrefixCacheDisk {
        dir: dir.path().to_owned(),
        cap_bytes: u64::MAX / 4,
        write_bytes_per_minute: u64::MAX / 4,
    };
    let disk = Disk::open(&settings, model_identity(&l.entry.path, None));
    if let Some(off) = disk.stats().off {
        bail!("--prefix-disk {}: {off}", dir.path().display());
    }
    Ok(PrefixCache::with_disk(u64::MAX, Some(disk)))
}

/// `--prefix-cache`: turn 2 of a conversation, cold and from the prefix cache (a fresh cache per
/// repetition, filled by turn 1, so each measures the next-turn hit and not a repeat of turn 2).
fn prefix_turns(a: &BenchArgs, l: &crate::model_arg::Loaded, turn1: &[u32]) -> Result<()> {
    use tandem::engine::prefix_cache::PrefixCache;
    use tandem::generate::{generate_resumed, Prompt, Resume};
    const REPEATS: usize = 3;
    let _created = CreatedDir(a.prefix_disk.clone().filter(|d| !d.exists()));
    let question =
        l.tokenizer.encode("\n\nWhat did he find at sea, and why did he go back to it every year?", false)?;
    let mut runs = Vec::new();
    for &depth in &a.depths {
        let opts = |n: usize| GenerateOptions {
            max_tokens: n,
            sampling: SamplingParams::greedy(),
            mtp: MtpOptions {
                enabled: depth > 0,
                depth: depth.max(1),
                adaptive: false,
                exact_verify: false,
                ..MtpOptions::default()
            },
            ..Default::default()
        };
        let generate_in = |cache: &mut PrefixCache, prompt: &Prompt, n: usize| -> Result<tandem::generate::Output> {
            let (ids, resume) = cache.resume(&l.model, prompt, &opts(n));
            let mut out = generate_resumed(&l.model, prompt, &opts(n), resume, &mut |_| Control::Continue)?;
            if let Some(ids) = ids {
                cache.keep(&ids, std::mem::take(&mut out.kept));
            }
            Ok(out)
        };
        let (mut cold, mut cached) = (Vec::new(), Vec::new());
        let (mut same, mut turn2_tokens, mut cached_tokens) = (true, 0, 0);
        let (mut written1, mut written2) = (None, None);
        for _ in 0..REPEATS {
            let folder = scratch(a)?;
            let mut cache = cache_over(folder.as_ref(), l)?;
            let reply = generate_in(&mut cache, &Prompt::text(turn1.to_vec()), a.gen_tokens)?.tokens;
            written1 = cache.stats().disk.map(|d| d.bytes_written);
            if folder.is_some() {
                // As after a restart: nothing in memory, the folder as turn 1 left it.
                drop(cache);
                cache = cache_over(folder.as_ref(), l)?;
            }
            let turn2 = Prompt::text([turn1, &reply, &question].concat());
            turn2_tokens = turn2.ids.len();
            let c = generate_resumed(&l.model, &turn2, &opts(8), Resume::default(), &mut |_| Control::Continue)?;
            let w = generate_in(&mut cache, &turn2, 8)?;
            written2 = cache.stats().disk.map(|d| d.bytes_written);
            same &= c.tokens == w.tokens;
            cached_tokens = w.stats.cached_tokens;
            cold.push(c.stats.ttft_ms);
            cached.push(w.stats.ttft_ms);
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let (ttft_ms_cold, ttft_ms_cached) = (median(&mut cold), median(&mut cached));
        let run = TurnRun {
            depth,
            turn2_tokens,
            cached_tokens,
            ttft_ms_cold,
            ttft_ms_cached,
            speedup: ttft_ms_cold / ttft_ms_cached.max(1e-9),
            same_tokens: same,
            disk_bytes_turn1: written1,
            disk_bytes_turn2: written2,
        };
        if !a.json {
            eprintln!(
                "depth {depth}: turn 2 of {} tokens ({} cached): TTFT {:.1} ms cold, {:.1} ms from the prefix cache ({:.1}x){}",
                run.turn2_tokens,
                run.cached_tokens,
                run.ttft_ms_cold,
                run.ttft_ms_cached,
                run.speedup,
                if run.same_tokens { "" } else { "  TOKENS DIFFER" }
            );
            if let (Some(w1), Some(w2)) = (written1, written2) {
                eprintln!(
                    "  from the SSD tier (a fresh memory tier over turn 1's files); written: turn 1 {:.1} MB, turn 2 {:.1} MB",
                    w1 as f64 / 1e6,
                    w2 as f64 / 1e6
                );
            }
        }
        runs.push(run);
    }
    if a.json {
        let report = serde_json::json!({
            "model": l.entry.name,
            "backend": format!("{:?}", mlx::device::backend()),
            "turn1_tokens": turn1.len(),
            "reply_tokens": a.gen_tokens,
            "prefix_cache": runs,
        });
        crate::out::line(serde_json::to_string_pretty(&report)?);
    }
    Ok(())
}
