// What the live panel shows, fed from two sources: the `stats` of each chat completion chunk this window
// receives, and the engine's `/api/stats/stream` (which also sees generations other clients started).

import { useEffect, useState } from 'preact/hooks';
import { Api, isAbort } from './api';
import type { LoadedModel, Memory, RunningGeneration, Stats, StatsSnapshot } from './generated';

export interface TokPoint {
  /** Seconds since the Unix epoch. */
  t: number;
  tokS: number;
}

export interface LiveState {
  /** The running (or last) generation's statistics. */
  stats: Stats | null;
  /** Its decode rate: the stats' `decode_tok_s`, else measured here from the chunks received. */
  tokS: number | null;
  /** Decode tok/s over time. */
  series: TokPoint[];
  generating: boolean;
  /** Generations running now over all models (more than one when requests are batched). */
  streams: number;
  /** The generations running now, each with its own statistics (from the stats stream only). */
  running: RunningGeneration[];
  model: string | null;
  memory: Memory | null;
  loadedModels: string[];
  /** The loaded models as the stats stream shows them, with their prefix caches. */
  models: LoadedModel[];
  /** `/api/stats/stream` is connected. */
  connected: boolean;
}

const WINDOW_S = 300;
const MIN_POINT_GAP_S = 0.25;

export class LiveFeed {
  state: LiveState = {
    stats: null,
    tokS: null,
    series: [],
    generating: false,
    streams: 0,
    running: [],
    model: null,
    memory: null,
    loadedModels: [],
    models: [],
    connected: false,
  };
  private listeners = new Set<(s: LiveState) => void>();
  private firstTokenAt: number | null = null;
  private tokens = 0;
  private chatActive = false;
  private previous: Stats | null = null;

  constructor(private readonly now: () => number = () => Date.now()) {}

  subscribe(fn: (s: LiveState) => void): () => void {
    this.listeners.add(fn);
    return () => this.listeners.delete(fn);
  }

  private set(patch: Partial<LiveState>): void {
    this.state = { ...this.state, ...patch };
    for (const fn of this.listeners) fn(this.state);
  }

  private point(tokS: number | null, force = false): TokPoint[] {
    if (tokS == null || !Number.isFinite(tokS)) return this.state.series;
    const t = this.now() / 1000;
    const series = this.state.series.filter((p) => p.t >= t - WINDOW_S);
    const last = series[series.length - 1];
    if (last && t - last.t < MIN_POINT_GAP_S && !force) {
      series[series.length - 1] = { t: last.t, tokS };
    } else {
      series.push({ t, tokS });
    }
    return series;
  }

  /** A chat request of this window started. */
  generationStarted(model: string): void {
    this.chatActive = true;
    this.firstTokenAt = null;
    this.tokens = 0;
    this.previous = this.state.stats;
    this.set({ generating: true, model, stats: null, tokS: null });
  }

  /** A chunk arrived: `tokens` content deltas, and the chunk's `stats` if it had any. */
  chunk(stats: Stats | null | undefined, tokens: number): void {
    const now = this.now();
    if (tokens > 0) {
      if (this.firstTokenAt == null) this.firstTokenAt = now;
      else this.tokens += tokens; // the rate counts tokens after the first (decode, not prefill)
    }
    let tokS: number | null = null;
    if (stats && stats.decode_tok_s > 0) tokS = stats.decode_tok_s;
    else if (this.firstTokenAt != null && now - this.firstTokenAt > 200 && this.tokens > 0) {
      tokS = (this.tokens * 1000) / (now - this.firstTokenAt);
    }
    if (!stats && tokS == null) return;
    this.set({
      stats: stats ?? this.state.stats,
      tokS: tokS ?? this.state.tokS,
      series: this.point(tokS),
    });
  }

  /** The chat request ended (finished, stopped or failed). */
  generationEnded(stats?: Stats | null): void {
    this.chatActive = false;
    const patch: Partial<LiveState> = { generating: false };
    if (stats) {
      patch.stats = stats;
      if (stats.decode_tok_s > 0) patch.tokS = stats.decode_tok_s;
    } else if (!this.state.stats && this.previous) {
      // Failed before any statistics came: keep showing the last generation's.
      patch.stats = this.previous;
      patch.tokS = this.previous.decode_tok_s > 0 ? this.previous.decode_tok_s : null;
    }
    this.previous = null;
    this.set(patch);
  }

  /** One snapshot from `/api/stats` or `/api/stats/stream`. */
  snapshot(s: StatsSnapshot): void {
    const patch: Partial<LiveState> = {
      memory: s.memory,
      loadedModels: s.loaded_models,
      models: s.models,
      streams: s.streams,
      running: s.running,
    };
    // While this window streams a chat, its chunks are the fresher source of the generation's figures.
    if (!this.chatActive) {
      patch.generating = s.generating;
      patch.model = s.model;
      if (s.stats) patch.stats = s.stats;
      // A generation's rate once it decodes: a prefill's (or a stalled window's) 0 would blank the last figure.
      if (s.generating && s.tok_s > 0) patch.tokS = s.tok_s;
      if (s.generating || this.state.generating) patch.series = this.point(s.generating ? s.tok_s : 0);
    }
    this.set(patch);
  }

  setConnected(connected: boolean): void {
    if (connected !== this.state.connected) this.set({ connected });
  }

  /** Follows `/api/stats/stream`, reconnecting with backoff, until `signal` aborts. */
  async follow(client: Api, signal: AbortSignal): Promise<void> {
    let delay = 1000;
    while (!signal.aborted) {
      try {
        for await (const snap of client.statsStream(signal)) {
          this.setConnected(true);
          delay = 1000;
          this.snapshot(snap);
        }
      } catch (e) {
        if (isAbort(e) || signal.aborted) break;
      }
      this.setConnected(false);
      if (signal.aborted) break;
      await new Promise((r) => setTimeout(r, delay));
      delay = Math.min(delay * 2, 15000);
    }
    this.setConnected(false);
  }
}

export const live = new LiveFeed();

export function useLive(feed: LiveFeed = live): LiveState {
  const [state, setState] = useState(feed.state);
  useEffect(() => {
    setState(feed.state);
    return feed.subscribe(setState);
  }, [feed]);
  return state;
}
