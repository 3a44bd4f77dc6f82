// The figures the live panel shows, computed from one Statistics object (docs/ARCHITECTURE.md §4.3), and from
// the stats snapshot's running generations and loaded models' prefix caches.

import { integer } from './format';
import type { DiskStats, LoadedModel, PrefixCacheStats, RunningGeneration, Stats } from './generated';

export const PHASES = ['draft', 'verify', 'sample', 'rollback'] as const;
export type Phase = (typeof PHASES)[number];

export interface LadderStep {
  depth: number;
  drafted: number;
  accepted: number;
  /** accepted / drafted at this depth; null when nothing was drafted there. */
  rate: number | null;
}

export interface HistBin {
  /** Drafts accepted in the cycle. */
  accepted: number;
  cycles: number;
  /** cycles / all cycles in the histogram (0 when it is empty). */
  share: number;
}

export interface PhaseFigure {
  phase: Phase;
  totalMs: number;
  /** totalMs / cycles; null with no cycles. */
  perCycleMs: number | null;
  /** totalMs / the sum of all phases (0 when nothing was timed). */
  share: number;
}

export interface SpecFigures {
  method: string;
  depth: number;
  /** MTP is off and this says why; null while it runs. */
  fallback: string | null;
  cycles: number;
  drafted: number;
  accepted: number;
  /** accepted / drafted; null before anything was drafted. */
  acceptance: number | null;
  /** Tokens emitted per verify cycle; null with no cycles. */
  tokPerCycle: number | null;
  ladder: LadderStep[];
  hist: HistBin[];
  phases: PhaseFigure[];
  /** All phases' milliseconds per cycle. */
  msPerCycle: number | null;
  parkedCycles: number;
  /** parked / all steps (parked plain steps are not counted in `cycles`); null with none. */
  parkedShare: number | null;
}

export interface Figures {
  promptTokens: number;
  completionTokens: number;
  ttftMs: number | null;
  prefillTokS: number | null;
  decodeTokS: number | null;
  spec: SpecFigures | null;
}

const num = (x: unknown): number => (typeof x === 'number' && Number.isFinite(x) ? x : 0);
const positive = (x: unknown): number | null => (typeof x === 'number' && Number.isFinite(x) && x > 0 ? x : null);

export function figures(stats: Stats): Figures {
  const s = stats.spec;
  let spec: SpecFigures | null = null;
  if (s) {
    const cycles = num(s.cycles);
    const drafted = num(s.drafted);
    const accepted = num(s.accepted);
    // Acceptance is recomputed from the counts: running stats may carry `acceptance` only once finished.
    const acceptance = drafted > 0 ? accepted / drafted : positive(s.acceptance);
    // Each cycle emits its accepted drafts plus the one token the verify pass samples.
    const tokPerCycle = positive(s.tok_per_cycle) ?? (cycles > 0 ? (accepted + cycles) / cycles : null);
    const ladder = s.by_depth.map((d) => ({
      depth: num(d.depth),
      drafted: num(d.drafted),
      accepted: num(d.accepted),
      rate: num(d.drafted) > 0 ? num(d.accepted) / num(d.drafted) : null,
    }));
    const histTotal = s.accepted_hist.reduce((a, b) => a + num(b), 0);
    const hist = s.accepted_hist.map((c, i) => ({
      accepted: i,
      cycles: num(c),
      share: histTotal > 0 ? num(c) / histTotal : 0,
    }));
    const ms = s.ms;
    const totalMs = PHASES.reduce((a, p) => a + num(ms[p]), 0);
    const phases = PHASES.map((phase) => ({
      phase,
      totalMs: num(ms[phase]),
      perCycleMs: cycles > 0 ? num(ms[phase]) / cycles : null,
      share: totalMs > 0 ? num(ms[phase]) / totalMs : 0,
    }));
    spec = {
      method: s.method,
      depth: num(s.depth),
      fallback: s.fallback,
      cycles,
      drafted,
      accepted,
      acceptance,
      tokPerCycle,
      ladder,
      hist,
      phases,
      msPerCycle: cycles > 0 ? totalMs / cycles : null,
      parkedCycles: num(s.parked_cycles),
      // A parked step is a plain decode step, not one of `cycles` (the engine counts it apart): the share
      // is of every step, else it could pass 100%.
      parkedShare: cycles + num(s.parked_cycles) > 0 ? num(s.parked_cycles) / (cycles + num(s.parked_cycles)) : null,
    };
  }
  return {
    promptTokens: num(stats.prompt_tokens),
    completionTokens: num(stats.completion_tokens),
    ttftMs: positive(stats.ttft_ms),
    prefillTokS: positive(stats.prefill_tok_s),
    decodeTokS: positive(stats.decode_tok_s),
    spec,
  };
}

/** Above this share of parked steps, MTP does not pay for the model on this machine (the controller says so). */
export const PARKED_MOSTLY = 0.5;

/** True when the adaptive controller parked drafting for most of a generation's steps (enough of them to judge). */
export function mtpMostlyParked(stats: Stats | null | undefined): boolean {
  const s = stats?.spec;
  if (!s || s.fallback) return false;
  const steps = num(s.cycles) + num(s.parked_cycles);
  return steps >= 16 && num(s.parked_cycles) / steps > PARKED_MOSTLY;
}

/** One of the generations decoded together in a batch. */
export interface StreamFigure {
  /** The engine's request id. */
  request: number;
  /** Its model; null when every stream runs on the same one. */
  model: string | null;
  decodeTokS: number | null;
  completionTokens: number;
  /** Its MTP acceptance; null without MTP, with MTP off, or before anything was drafted. */
  acceptance: number | null;
}

/** Each running stream's own figures, in the engine's order; null for fewer than two (the aggregate says it all). */
export function streamFigures(running: readonly RunningGeneration[] | null | undefined): StreamFigure[] | null {
  if (!running || running.length < 2) return null;
  const oneModel = running.every((r) => r.model === running[0]!.model);
  return running.map((r) => {
    const f = figures(r.stats);
    return {
      request: r.request,
      model: oneModel ? null : r.model,
      decodeTokS: f.decodeTokS,
      completionTokens: f.completionTokens,
      acceptance: f.spec && !f.spec.fallback ? f.spec.acceptance : null,
    };
  });
}

/** Prompt tokens of a generation restored from the prefix cache; null when none were. */
export function cachedPrompt(stats: Stats | null | undefined): { cached: number; prompt: number } | null {
  const cached = num(stats?.cached_tokens);
  if (!stats || cached <= 0) return null;
  return { cached, prompt: num(stats.prompt_tokens) };
}

export interface DiskFigures {
  /** Bytes in the folder (every model's files) against its cap. */
  bytes: number;
  capBytes: number;
  entries: number;
  hits: number;
  bytesWritten: number;
  lastWriteBytes: number;
  /** What is wrong, for a warning line each: the tier is off (and why), corrupt files were ignored. */
  warnings: string[];
}

export interface PrefixCacheFigures {
  model: string;
  /** The cap is 0: there is no cache. */
  off: boolean;
  bytes: number;
  capBytes: number;
  entries: number;
  lookups: number;
  /** hits / lookups; null before the first lookup. */
  hitRate: number | null;
  /** Prompt tokens restored instead of prefilled, over all hits. */
  cachedTokens: number;
  disk: DiskFigures | null;
}

function diskFigures(d: DiskStats): DiskFigures {
  const warnings: string[] = [];
  if (typeof d.off === 'string') warnings.push(`SSD tier off: ${d.off || 'no reason given'}`);
  const rejected = num(d.rejected);
  if (rejected > 0) warnings.push(`${integer(rejected)} corrupt ${rejected === 1 ? 'file' : 'files'} ignored`);
  return {
    bytes: num(d.bytes),
    capBytes: num(d.cap_bytes),
    entries: num(d.entries),
    hits: num(d.hits),
    bytesWritten: num(d.bytes_written),
    lastWriteBytes: num(d.last_write_bytes),
    warnings,
  };
}

/** What the panel shows of one model's prefix cache. */
export function prefixCacheFigures(model: string, c: PrefixCacheStats): PrefixCacheFigures {
  const lookups = num(c.lookups);
  return {
    model,
    off: num(c.cap_bytes) <= 0,
    bytes: num(c.bytes),
    capBytes: num(c.cap_bytes),
    entries: num(c.entries),
    lookups,
    // From the counts when there are any: `hit_rate` is 0 both before the first lookup and after misses only.
    hitRate: lookups > 0 ? num(c.hits) / lookups : null,
    cachedTokens: num(c.cached_tokens),
    disk: c.disk ? diskFigures(c.disk) : null,
  };
}

/** Every loaded model's prefix cache, in the snapshot's order. */
export function prefixCaches(models: readonly LoadedModel[] | null | undefined): PrefixCacheFigures[] {
  return (models ?? []).filter((m) => m.prefix_cache).map((m) => prefixCacheFigures(m.id, m.prefix_cache));
}
