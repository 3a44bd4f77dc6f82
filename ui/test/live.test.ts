import { describe, expect, it } from 'vitest';
import { LiveFeed } from '../src/live';
import { loadedModel, SAMPLE_STATS, statsSnapshot } from './helpers';

describe('LiveFeed', () => {
  it("takes a chunk's stats and charts its decode rate", () => {
    let now = 1_000_000;
    const feed = new LiveFeed(() => now);
    feed.generationStarted('tandem-tiny');
    expect(feed.state.generating).toBe(true);
    feed.chunk(SAMPLE_STATS, 1);
    expect(feed.state.stats).toBe(SAMPLE_STATS);
    expect(feed.state.tokS).toBe(63.4);
    now += 1000;
    feed.chunk({ ...SAMPLE_STATS, decode_tok_s: 70 }, 1);
    expect(feed.state.series.map((p) => p.tokS)).toEqual([63.4, 70]);
    feed.generationEnded(SAMPLE_STATS);
    expect(feed.state.generating).toBe(false);
    expect(feed.state.tokS).toBe(63.4);
  });

  it('measures the rate itself when chunks carry no stats', () => {
    let now = 0;
    const feed = new LiveFeed(() => now);
    feed.generationStarted('m');
    feed.chunk(undefined, 1); // first token: the clock starts
    for (let i = 0; i < 10; i++) {
      now += 100;
      feed.chunk(undefined, 1);
    }
    expect(feed.state.tokS).toBeCloseTo(10);
  });

  it("lets this window's chat win over the stream while it runs, and takes the stream's memory and models always", () => {
    const feed = new LiveFeed(() => 0);
    feed.generationStarted('mine');
    const memory = { ...statsSnapshot().memory, active_bytes: 9 };
    feed.snapshot(statsSnapshot({ generating: true, model: 'other', tok_s: 5, stats: { ...SAMPLE_STATS, decode_tok_s: 5 }, memory, loaded_models: ['mine'] }));
    expect(feed.state.model).toBe('mine');
    expect(feed.state.stats).toBeNull();
    expect(feed.state.memory).toEqual(memory);
    expect(feed.state.loadedModels).toEqual(['mine']);
    feed.generationEnded();
    feed.snapshot(statsSnapshot({ generating: true, model: 'other', tok_s: 5, stats: SAMPLE_STATS, loaded_models: ['mine'] }));
    expect(feed.state.model).toBe('other');
    expect(feed.state.tokS).toBe(5);
    expect(feed.state.stats).toBe(SAMPLE_STATS);
  });
});

describe('LiveFeed headline rate', () => {
  it("keeps the last measured tok/s while the engine reports a generation at 0 (prefilling), then takes its rate", () => {
    const feed = new LiveFeed(() => 0);
    feed.generationStarted('tandem-tiny');
    feed.chunk({ ...SAMPLE_STATS, decode_tok_s: 40 }, 1);
    feed.generationEnded({ ...SAMPLE_STATS, decode_tok_s: 40 });
    feed.snapshot(statsSnapshot({ generating: true, model: 'tandem-tiny', tok_s: 0, stats: SAMPLE_STATS }));
    expect(feed.state.generating).toBe(true);
    expect(feed.state.tokS).toBe(40);
    feed.snapshot(statsSnapshot({ generating: true, model: 'tandem-tiny', tok_s: 12, stats: SAMPLE_STATS }));
    expect(feed.state.tokS).toBe(12);
  });
});

describe('LiveFeed streams and caches', () => {
  it("takes the running streams and the loaded models' caches from every snapshot, even while this window chats", () => {
    const feed = new LiveFeed(() => 0);
    feed.generationStarted('tandem-tiny');
    const running = [
      { model: 'tandem-tiny', request: 1, stats: SAMPLE_STATS },
      { model: 'tandem-tiny', request: 2, stats: { ...SAMPLE_STATS, decode_tok_s: 20 } },
    ];
    const models = [loadedModel()];
    feed.snapshot(statsSnapshot({ generating: true, streams: 2, running, models, loaded_models: ['tandem-tiny'] }));
    expect(feed.state.running).toEqual(running);
    expect(feed.state.models).toEqual(models);
    feed.generationEnded(SAMPLE_STATS);
    feed.snapshot(statsSnapshot({ models }));
    expect(feed.state.running).toEqual([]);
  });
});

describe('chartData', () => {
  it('places points in seconds before the newest, in the narrowest window that holds them', async () => {
    const { chartData } = await import('../src/components/chart');
    expect(chartData([])).toEqual({ data: [[], []], windowS: 10 });
    expect(chartData([{ t: 100, tokS: 1 }, { t: 104, tokS: 2 }])).toEqual({ data: [[-4, 0], [1, 2]], windowS: 10 });
    expect(chartData([{ t: 100, tokS: 1 }, { t: 250, tokS: 2 }, { t: 340, tokS: 3 }, { t: 370, tokS: 4 }])).toEqual({
      data: [
        [-120, -30, 0],
        [2, 3, 4],
      ],
      windowS: 120,
    });
  });
});
