import { render } from 'preact';
import { act } from 'preact/test-utils';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { figures } from '../src/figures';
import type { LiveState } from '../src/live';
import type { Stats } from '../src/generated';
import { LivePanelView } from '../src/views/panel';
import { SAMPLE_STATS, statsSnapshot } from './helpers';

// The chart draws on a canvas, which jsdom lacks; its data flow is not what these tests check.
vi.mock('../src/components/chart', () => ({ TokChart: () => <div data-testid="panel-chart" /> }));

const STATE: LiveState = {
  stats: SAMPLE_STATS,
  tokS: 63.4,
  series: [{ t: 1, tokS: 60 }],
  generating: false,
  streams: 0,
  model: 'tandem-tiny',
  memory: { ...statsSnapshot().memory, rss_bytes: 1_600_000_000, active_bytes: 1_250_000_000, peak_bytes: 2_000_000_000 },
  loadedModels: ['tandem-tiny'],
  connected: true,
};

let root: HTMLElement | null = null;
function mount(state: LiveState): HTMLElement {
  root = document.createElement('div');
  document.body.appendChild(root);
  act(() => render(<LivePanelView state={state} />, root!));
  return root;
}
afterEach(() => {
  if (root) {
    render(null, root);
    root.remove();
    root = null;
  }
});
const text = (el: HTMLElement, id: string) => el.querySelector(`[data-testid="${id}"]`)?.textContent?.trim();

describe('figures', () => {
  it('computes acceptance, tokens per cycle, the ladder, the histogram and the phases', () => {
    const f = figures(SAMPLE_STATS);
    const s = f.spec!;
    expect(s.acceptance).toBeCloseTo(17 / 30);
    expect(s.tokPerCycle).toBeCloseTo(2.7);
    expect(s.ladder.map((l) => l.rate)).toEqual([0.9, 0.6, 0.2]);
    expect(s.hist.map((b) => b.cycles)).toEqual([1, 3, 4, 2]);
    expect(s.hist.map((b) => b.share)).toEqual([0.1, 0.3, 0.4, 0.2]);
    expect(s.phases.map((p) => [p.phase, p.perCycleMs, p.share])).toEqual([
      ['draft', 4, 0.2],
      ['verify', 12, 0.6],
      ['sample', 2, 0.1],
      ['rollback', 2, 0.1],
    ]);
    expect(s.msPerCycle).toBe(20);
    // 2 parked steps beside 10 drafting cycles: 2 of 12 steps.
    expect(s.parkedShare).toBeCloseTo(2 / 12);
    expect(f.decodeTokS).toBe(63.4);
  });

  it('derives what running stats leave at zero, and reports nothing for empty counts', () => {
    const running: Stats = {
      ...SAMPLE_STATS,
      spec: { ...SAMPLE_STATS.spec!, acceptance: 0, tok_per_cycle: 0 },
    };
    const s = figures(running).spec!;
    expect(s.acceptance).toBeCloseTo(17 / 30);
    expect(s.tokPerCycle).toBeCloseTo((17 + 10) / 10);

    const empty = figures({
      ...SAMPLE_STATS,
      spec: { ...SAMPLE_STATS.spec!, cycles: 0, drafted: 0, accepted: 0, acceptance: 0, tok_per_cycle: 0, by_depth: [{ depth: 1, drafted: 0, accepted: 0 }], accepted_hist: [0, 0], parked_cycles: 0 },
    }).spec!;
    expect(empty.acceptance).toBeNull();
    expect(empty.tokPerCycle).toBeNull();
    expect(empty.ladder[0]!.rate).toBeNull();
    expect(empty.hist.map((b) => b.share)).toEqual([0, 0]);
  });
});

describe('LivePanelView', () => {
  it('says how many streams run together when requests are batched, and nothing for one', () => {
    expect(text(mount({ ...STATE, generating: true, streams: 3 }), 'panel-status')).toBe('Generating · 3 streams');
    act(() => render(null, root!));
    root!.remove();
    expect(text(mount({ ...STATE, generating: true, streams: 1 }), 'panel-status')).toBe('Generating');
  });

  it('says when MTP does not pay: drafting parked for most steps', () => {
    const parked: Stats = { ...SAMPLE_STATS, spec: { ...SAMPLE_STATS.spec!, cycles: 10, parked_cycles: 21 } };
    expect(mount({ ...STATE, stats: parked }).querySelector('[data-testid="panel-mtp-slow"]')).not.toBeNull();
    act(() => render(null, root!));
    root!.remove();
    expect(mount(STATE).querySelector('[data-testid="panel-mtp-slow"]')).toBeNull();
  });

  it("shows the process's memory as the tray does, not MLX's 0 B when no model is loaded", () => {
    const el = mount({ ...STATE, memory: { ...statsSnapshot().memory, rss_bytes: 170_000_000 } });
    expect(text(el, 'panel-memory')).toBe('memory 170 MB');
  });

  it('never shows a parked share above 100% (parked steps are not among the cycles)', () => {
    const stats: Stats = { ...SAMPLE_STATS, spec: { ...SAMPLE_STATS.spec!, cycles: 10, parked_cycles: 21 } };
    const el = mount({ ...STATE, stats });
    const parked = el.querySelector('[data-testid="panel-parked"]')!.parentElement!.textContent!;
    expect(parked).toContain('21');
    expect(parked).toContain('(68%)');
    expect(figures(stats).spec!.parkedShare).toBeLessThanOrEqual(1);
  });

  it('renders the figures, ladder, histogram, phases and parked cycles', () => {
    const el = mount(STATE);
    expect(text(el, 'panel-tok-s')).toBe('63.4');
    expect(text(el, 'panel-acceptance')).toBe('57%');
    expect(text(el, 'panel-tok-per-cycle')).toBe('2.70');
    expect(text(el, 'panel-ladder-depth-1')).toContain('90%');
    expect(text(el, 'panel-ladder-depth-2')).toContain('60%');
    expect(text(el, 'panel-ladder-depth-3')).toContain('20%');
    expect(text(el, 'panel-ladder-depth-3')).toContain('2/10');
    expect([0, 1, 2, 3].map((i) => el.querySelector(`[data-testid="panel-hist-bin-${i}"]`)?.getAttribute('data-cycles'))).toEqual(['1', '3', '4', '2']);
    expect(text(el, 'panel-hist-bin-2')).toContain('40%');
    // The tallest bin fills its track; the others are in proportion.
    const height = (i: number) => (el.querySelector(`[data-testid="panel-hist-bin-${i}"] .hist-fill`) as HTMLElement).style.height;
    expect([0, 1, 2, 3].map(height)).toEqual(['25%', '75%', '100%', '50%']);
    expect(text(el, 'panel-phase-draft')).toBe('4.0 ms');
    expect(text(el, 'panel-phase-verify')).toBe('12.0 ms');
    expect(text(el, 'panel-phase-sample')).toBe('2.0 ms');
    expect(text(el, 'panel-phase-rollback')).toBe('2.0 ms');
    expect(text(el, 'panel-parked')).toBe('2');
    expect(text(el, 'panel-depth')).toBe('3');
    expect(text(el, 'panel-ttft')).toBe('85.5 ms');
    expect(text(el, 'panel-memory')).toContain('1.3 GB');
    expect(el.querySelector('[data-testid="panel-fallback"]')).toBeNull();
  });

  it('says why MTP is not running, and shows no acceptance then', () => {
    const el = mount({
      ...STATE,
      stats: { ...SAMPLE_STATS, spec: { ...SAMPLE_STATS.spec!, fallback: 'model has no MTP head (mtp.* tensors missing)', cycles: 0, drafted: 0, accepted: 0 } },
    });
    expect(text(el, 'panel-fallback')).toContain('model has no MTP head (mtp.* tensors missing)');
    expect(text(el, 'panel-acceptance')).toBe('—');
    expect(el.querySelector('[data-testid="panel-ladder"]')).toBeNull();
  });

  it('shows dashes before any generation, and a note when speculation was not used', () => {
    let el = mount({ ...STATE, stats: null, tokS: null });
    expect(text(el, 'panel-tok-s')).toBe('—');
    expect(text(el, 'panel-acceptance')).toBe('—');
    render(null, root!);
    root!.remove();
    el = mount({ ...STATE, stats: { ...SAMPLE_STATS, spec: null } });
    expect(el.querySelector('[data-testid="panel-no-spec"]')).not.toBeNull();
  });
});
