// Shared test fixtures: a fetch that answers from a script of routes, and SSE bodies.

import { act } from 'preact/test-utils';
import type { ChatCompletionChunk, DiskStats, LoadedModel, ModelStatus, PrefixCacheStats, Stats, StatsSnapshot } from '../src/generated';

export interface Call {
  url: string;
  method: string;
  headers: Record<string, string>;
  body: unknown;
  signal?: AbortSignal | null;
}

export type Route = (call: Call) => Response | Promise<Response>;

export function json(body: unknown, status = 200): Response {
  return new Response(JSON.stringify(body), { status, headers: { 'Content-Type': 'application/json' } });
}

/** A text/event-stream response whose body arrives in the given pieces. */
export function sse(pieces: string[], opts: { hang?: boolean } = {}): Response {
  const enc = new TextEncoder();
  const body = new ReadableStream<Uint8Array>({
    start(c) {
      for (const p of pieces) c.enqueue(enc.encode(p));
      if (!opts.hang) c.close();
    },
  });
  return new Response(body, { status: 200, headers: { 'Content-Type': 'text/event-stream' } });
}

/** A fetch stand-in: `routes` maps "METHOD /path" to an answer; every call is recorded. */
export function mockFetch(routes: Record<string, Route>) {
  const calls: Call[] = [];
  const fetch = async (input: RequestInfo | URL, init: RequestInit = {}): Promise<Response> => {
    const url = String(input);
    const method = (init.method ?? 'GET').toUpperCase();
    const path = url.replace(/^https?:\/\/[^/]+/, '');
    const call: Call = {
      url,
      method,
      headers: (init.headers ?? {}) as Record<string, string>,
      body: typeof init.body === 'string' ? JSON.parse(init.body) : init.body,
      signal: init.signal,
    };
    calls.push(call);
    const route = routes[`${method} ${path}`];
    if (!route) return json({ error: { message: `no route ${method} ${path}`, type: 'not_found', code: 'not_found' } }, 404);
    if (init.signal?.aborted) throw new DOMException('The operation was aborted.', 'AbortError');
    return route(call);
  };
  return { fetch: fetch as typeof globalThis.fetch, calls };
}

/** A sample Statistics object, consistent with itself: depth 3, 10 cycles of 3 drafts, 17 accepted. */
export const SAMPLE_STATS: Stats = {
  prompt_tokens: 42,
  cached_tokens: 0,
  completion_tokens: 27,
  ttft_ms: 85.5,
  prefill_tok_s: 491.2,
  decode_tok_s: 63.4,
  spec: {
    method: 'mtp',
    depth: 3,
    cycles: 10,
    drafted: 30,
    accepted: 17,
    acceptance: 17 / 30,
    tok_per_cycle: 2.7,
    by_depth: [
      { depth: 1, drafted: 10, accepted: 9 },
      { depth: 2, drafted: 10, accepted: 6 },
      { depth: 3, drafted: 10, accepted: 2 },
    ],
    accepted_hist: [1, 3, 4, 2],
    parked_cycles: 2,
    ms: { draft: 40, verify: 120, sample: 20, rollback: 20 },
    fallback: null,
  },
};

/** A model as `GET /api/models` lists it: the bundled model, loaded, with MTP on. */
export function modelStatus(over: Partial<ModelStatus> = {}): ModelStatus {
  return {
    id: 'tandem-tiny',
    name: 'tandem-tiny',
    path: 'assets/models/tandem-tiny',
    source: 'configured',
    format: 'mlx',
    size_bytes: 1,
    quantization: null,
    dtype: 'bfloat16',
    vision: false,
    context_length: 2048,
    base_model: null,
    state: 'loaded',
    loaded: true,
    default: true,
    mtp: { available: true, enabled: true, depth: 3, reason: null, repaired: null, adaptive: true, probe: null },
    sampling: { temperature: 0.7, top_p: 0.95, top_k: 0, min_p: 0, repetition_penalty: 1, max_tokens: 512 },
    system_prompt: null,
    error: null,
    ...over,
  };
}

/** A model's prefix cache as `/api/stats` shows it: 1.2 of 4 GB, 3 hits in 4 lookups, no SSD tier. */
export function prefixCache(over: Partial<PrefixCacheStats> = {}): PrefixCacheStats {
  return {
    cap_bytes: 4_000_000_000,
    bytes: 1_200_000_000,
    entries: 5,
    blocks: 40,
    lookups: 4,
    hits: 3,
    hit_rate: 0.75,
    cached_tokens: 3_400,
    evictions: 0,
    disk: null,
    ...over,
  };
}

/** An SSD tier that works: 3.1 of 20 GB, nothing wrong. */
export function diskStats(over: Partial<DiskStats> = {}): DiskStats {
  return {
    dir: '/tmp/tandem-cache',
    cap_bytes: 20_000_000_000,
    bytes: 3_100_000_000,
    write_bytes_per_minute: 1_000_000_000,
    entries: 12,
    hits: 2,
    bytes_written: 3_500_000_000,
    last_write_bytes: 120_000_000,
    skipped: 0,
    rejected: 0,
    evictions: 0,
    off: null,
    ...over,
  };
}

/** A model as the stats snapshot lists it: the bundled model, idle, with its prefix cache. */
export function loadedModel(over: Partial<LoadedModel> = {}): LoadedModel {
  return {
    id: 'tandem-tiny',
    busy: false,
    running: 0,
    queued: 0,
    mtp_loaded: true,
    mtp_reason: null,
    prefix_cache: prefixCache(),
    ...over,
  };
}

/** A snapshot of `/api/stats`: idle, nothing loaded, unless `over` says otherwise. */
export function statsSnapshot(over: Partial<StatsSnapshot> = {}): StatsSnapshot {
  return {
    time_ms: 0,
    uptime_s: 1,
    generating: false,
    model: null,
    tok_s: 0,
    streams: 0,
    acceptance: null,
    tok_per_cycle: null,
    stats: null,
    loaded_models: [],
    models: [],
    running: [],
    last: null,
    series: [],
    totals: { generations: 0, prompt_tokens: 0, completion_tokens: 0 },
    memory: { rss_bytes: 0, active_bytes: 0, peak_bytes: 0, cache_bytes: 0, system_total_bytes: 0, system_available_bytes: 0 },
    ...over,
  };
}

/** A streamed chunk as the server writes it, with one choice carrying `delta`. */
export function chunkOf(
  delta: ChatCompletionChunk['choices'][number]['delta'],
  over: Partial<ChatCompletionChunk> = {},
  finish: string | null = null,
): ChatCompletionChunk {
  return {
    id: 'chatcmpl-1',
    object: 'chat.completion.chunk',
    created: 0,
    model: 'tandem-tiny',
    system_fingerprint: null,
    choices: [{ index: 0, delta, logprobs: null, finish_reason: finish }],
    ...over,
  };
}

/** Lets effects, timers and fetches run for `ms` inside act(). */
export async function settle(ms = 20): Promise<void> {
  await act(async () => {
    await new Promise((r) => setTimeout(r, ms));
  });
}

/** Settles until `check` holds, for at most a second; fails naming `what`. */
export async function waitFor(check: () => boolean, what: string): Promise<void> {
  for (let i = 0; i < 100; i++) {
    if (check()) return;
    await settle(10);
  }
  throw new Error(`timed out waiting for ${what}`);
}
