import { render } from 'preact';
import { act } from 'preact/test-utils';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { cachedPrompt, figures, prefixCacheFigures, prefixCaches, streamFigures } from '../src/figures';
import type { LiveState } from '../src/live';
import type { RunningGeneration, Stats } from '../src/generated';
import { LivePanelView } from '../src/views/panel';
import { diskStats, loadedModel, prefixCache, SAMPLE_STATS, statsSnapshot } from './helpers';

// The chart draws on a canvas, which jsdom lacks; its data flow is not what these tests check.
vi.mock('../src/components/chart', () => ({ TokChart: () => <div data-testid="panel-chart" /> }));

const STATE: LiveState = {
  stats: SAMPLE_STATS,
  tokS: 63.4,
  series: [{ t: 1, tokS: 60 }],
  generating: false,
  streams: 0,
  running: [],
  model: 'tandem-tiny',
  memory: { ...statsSnapshot().memory, rss_bytes: 1_600_000_000, active_bytes: 1_250_000_000, peak_bytes: 2_000_000_000 },
  loadedModels: ['tandem-tiny'],
  models: [loadedModel()],
  connected: true,
};

/** Three requests decoded together on one model, at different speeds; #9 drafts with MTP off. */
const stream = (request: number, decode_tok_s: number, completion_tokens: number, spec: Stats['spec'] = SAMPLE_STATS.spec): RunningGeneration => ({
  model: 'tandem-tiny',
  request,
  stats: { ...SAMPLE_STATS, decode_tok_s, completion_tokens, spec },
});
const THREE: RunningGeneration[] = [
  stream(7, 41.5, 120),
  stream(8, 22, 64, { ...SAMPLE_STATS.spec!, drafted: 20, accepted: 5 }),
  stream(9, 12.25, 9, null),
];

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

describe('stream figures', () => {
  it('lists nothing for one stream or none: the aggregate is that stream', () => {
    expect(streamFigures([])).toBeNull();
    expect(streamFigures([stream(7, 41.5, 120)])).toBeNull();
    expect(streamFigures(undefined)).toBeNull();
  });

  it("gives each of three batched streams its own rate, tokens and acceptance, in the engine's order", () => {
    expect(streamFigures(THREE)).toEqual([
      { request: 7, model: null, decodeTokS: 41.5, completionTokens: 120, acceptance: 17 / 30 },
      { request: 8, model: null, decodeTokS: 22, completionTokens: 64, acceptance: 5 / 20 },
      { request: 9, model: null, decodeTokS: 12.25, completionTokens: 9, acceptance: null },
    ]);
  });

  it('names the model only when the streams run on more than one, and shows no acceptance when MTP is off', () => {
    const off = { ...SAMPLE_STATS.spec!, fallback: 'no MTP head' };
    const s = streamFigures([stream(1, 10, 5), { ...stream(2, 0, 0, off), model: 'other' }])!;
    expect(s.map((x) => x.model)).toEqual(['tandem-tiny', 'other']);
    expect(s[1]!.acceptance).toBeNull();
    // Still prefilling: no rate yet.
    expect(s[1]!.decodeTokS).toBeNull();
  });
});

describe('prefix cache figures', () => {
  it('reports prompt tokens from the cache only when there were some', () => {
    expect(cachedPrompt(SAMPLE_STATS)).toBeNull();
    expect(cachedPrompt(null)).toBeNull();
    expect(cachedPrompt({ ...SAMPLE_STATS, cached_tokens: 32 })).toEqual({ cached: 32, prompt: 42 });
  });

  it('computes the hit rate from the counts, and none before the first lookup', () => {
    const c = prefixCacheFigures('m', prefixCache());
    expect(c).toMatchObject({ off: false, bytes: 1_200_000_000, capBytes: 4_000_000_000, entries: 5, lookups: 4, hitRate: 0.75, cachedTokens: 3_400, disk: null });
    expect(prefixCacheFigures('m', prefixCache({ lookups: 0, hits: 0, hit_rate: 0 })).hitRate).toBeNull();
    // Misses only: a real 0%, not "no lookups".
    expect(prefixCacheFigures('m', prefixCache({ lookups: 3, hits: 0, hit_rate: 0 })).hitRate).toBe(0);
  });

  it('says the cache is off when its cap is 0', () => {
    expect(prefixCacheFigures('m', prefixCache({ cap_bytes: 0, bytes: 0, entries: 0 })).off).toBe(true);
  });

  it("carries the SSD tier's figures, and a warning when it is off or ignored corrupt files", () => {
    const ok = prefixCacheFigures('m', prefixCache({ disk: diskStats() })).disk!;
    expect(ok).toEqual({ bytes: 3_100_000_000, capBytes: 20_000_000_000, entries: 12, hits: 2, bytesWritten: 3_500_000_000, lastWriteBytes: 120_000_000, warnings: [] });
    const off = prefixCacheFigures('m', prefixCache({ disk: diskStats({ off: 'read-only folder /Volumes/x' }) })).disk!;
    expect(off.warnings).toEqual(['SSD tier off: read-only folder /Volumes/x']);
    const bad = prefixCacheFigures('m', prefixCache({ disk: diskStats({ rejected: 1234 }) })).disk!;
    expect(bad.warnings).toEqual(['1,234 corrupt files ignored']);
    expect(prefixCacheFigures('m', prefixCache({ disk: diskStats({ rejected: 1 }) })).disk!.warnings).toEqual(['1 corrupt file ignored']);
  });

  it("lists every loaded model's cache in the snapshot's order", () => {
    const models = [loadedModel({ id: 'b' }), loadedModel({ id: 'a', prefix_cache: prefixCache({ cap_bytes: 0 }) })];
    expect(prefixCaches(models).map((c) => [c.model, c.off])).toEqual([
      ['b', false],
      ['a', true],
    ]);
    expect(prefixCaches([])).toEqual([]);
  });
});

describe('LivePanelView', () => {
  it('keeps the look of one stream: no list of streams', () => {
    const el = mount({ ...STATE, generating: true, streams: 1, running: [stream(7, 63.4, 27)] });
    expect(el.querySelector('[data-testid="panel-streams"]')).toBeNull();
    expect(text(el, 'panel-tok-s')).toBe('63.4');
  });

  it('lists each batched stream under the aggregate tok/s, which is their sum', () => {
    // This window's chunks said 41.5 (its own stream); the headline is all three together.
    const el = mount({ ...STATE, generating: true, streams: 3, tokS: 41.5, running: THREE });
    expect(text(el, 'panel-tok-s')).toBe('75.8');
    const rows = [...el.querySelectorAll('[data-testid="panel-stream"]')];
    expect(rows.map((r) => r.getAttribute('data-request'))).toEqual(['7', '8', '9']);
    const cells = (r: Element) => [...r.children].map((c) => c.textContent!.trim());
    expect(rows.map(cells)).toEqual([
      ['#7', '41.5 tok/s', '120 tok', 'MTP 57%'],
      ['#8', '22.0 tok/s', '64 tok', 'MTP 25%'],
      ['#9', '12.3 tok/s', '9 tok', ''],
    ]);
  });

  it('says how many prompt tokens came from the prefix cache, and nothing when none did', () => {
    let el = mount({ ...STATE, stats: { ...SAMPLE_STATS, cached_tokens: 32 } });
    expect(text(el, 'panel-cached')).toBe('32 of 42 prompt tokens from the prefix cache');
    act(() => render(null, root!));
    root!.remove();
    el = mount(STATE);
    expect(el.querySelector('[data-testid="panel-cached"]')).toBeNull();
  });

  it("shows the loaded model's prefix cache: size of cap, entries, hit rate, tokens restored", () => {
    const el = mount(STATE);
    const cache = el.querySelector('[data-testid="panel-prefix-cache"]') as HTMLElement;
    expect(cache.getAttribute('data-model')).toBe('tandem-tiny');
    expect(cache.querySelector('h3')!.textContent).toBe('Prefix cache1.2 GB / 4.0 GB');
    expect(text(cache, 'panel-cache-entries')).toBe('5');
    expect(text(cache, 'panel-cache-hit-rate')).toBe('hit rate 75%');
    expect(text(cache, 'panel-cache-restored')).toBe('3,400');
    expect(cache.querySelector('[data-testid="panel-cache-disk"]')).toBeNull();
    expect(cache.querySelector('[data-testid="panel-cache-warning"]')).toBeNull();
  });

  it('says "no lookups yet" before the first lookup, and "off" when the cap is 0', () => {
    let el = mount({ ...STATE, models: [loadedModel({ prefix_cache: prefixCache({ lookups: 0, hits: 0, hit_rate: 0 }) })] });
    expect(text(el, 'panel-cache-hit-rate')).toBe('no lookups yet');
    act(() => render(null, root!));
    root!.remove();
    el = mount({ ...STATE, models: [loadedModel({ prefix_cache: prefixCache({ cap_bytes: 0, bytes: 0, disk: diskStats({ off: 'x' }) }) })] });
    expect(text(el, 'panel-cache-size')).toBe('off');
    expect(el.querySelector('[data-testid="panel-cache-entries"]')).toBeNull();
    expect(el.querySelector('[data-testid="panel-cache-disk"]')).toBeNull();
    expect(el.querySelector('[data-testid="panel-cache-warning"]')).toBeNull();
  });

  it('shows the SSD tier, and warns when it is off and when it ignored corrupt files', () => {
    let el = mount({ ...STATE, models: [loadedModel({ prefix_cache: prefixCache({ disk: diskStats() }) })] });
    expect(text(el, 'panel-cache-disk')).toBe('SSD 3.1 GB / 20.0 GB12 entries2 hits3.5 GB written (last 120 MB)');
    expect(el.querySelector('[data-testid="panel-cache-warning"]')).toBeNull();
    act(() => render(null, root!));
    root!.remove();
    el = mount({ ...STATE, models: [loadedModel({ prefix_cache: prefixCache({ disk: diskStats({ off: 'folder is read-only', rejected: 2 }) }) })] });
    const warnings = [...el.querySelectorAll('[data-testid="panel-cache-warning"]')].map((w) => w.textContent);
    expect(warnings).toEqual(['SSD tier off: folder is read-only', '2 corrupt files ignored']);
  });

  it('names each model when several are loaded, and shows no cache when none is', () => {
    let el = mount({ ...STATE, models: [loadedModel(), loadedModel({ id: 'qwen' })] });
    const sections = [...el.querySelectorAll('[data-testid="panel-prefix-cache"]')];
    expect(sections.map((s) => s.querySelector('h3 .cache-title')!.textContent)).toEqual(['Prefix cache · tandem-tiny', 'Prefix cache · qwen']);
    act(() => render(null, root!));
    root!.remove();
    el = mount({ ...STATE, models: [] });
    expect(el.querySelector('[data-testid="panel-prefix-cache"]')).toBeNull();
  });

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
