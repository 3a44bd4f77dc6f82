// The figures the live panel shows, computed from one Statistics object (docs/ARCHITECTURE.md §4.3).

import type { Stats } from './generated';

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
