import { describe, expect, it } from 'vitest';
import { Api, ApiError, resolveBase } from '../src/api';
import type { ChatCompletionChunk, JobEvent, ModelList } from '../src/generated';
import { chunkOf, json, mockFetch, modelStatus, SAMPLE_STATS, sse, statsSnapshot } from './helpers';

const BASE = 'http://127.0.0.1:11435';

async function collect<T>(gen: AsyncIterable<T>): Promise<T[]> {
  const out: T[] = [];
  for await (const x of gen) out.push(x);
  return out;
}

async function rejection(p: Promise<unknown>): Promise<ApiError> {
  try {
    await p;
  } catch (e) {
    expect(e).toBeInstanceOf(ApiError);
    return e as ApiError;
  }
  throw new Error('expected a rejection');
}

const chunk = (content: string, extra: Partial<ChatCompletionChunk> = {}) => `data: ${JSON.stringify(chunkOf({ content }, extra))}\n\n`;

describe('errors', () => {
  it("surface the server's message, type, code and status", async () => {
    const { fetch } = mockFetch({
      'POST /api/models/nope/load': () =>
        json({ error: { message: 'no model named `nope` in models.toml', type: 'not_found_error', code: 'model_not_found' } }, 404),
    });
    const e = await rejection(new Api(BASE, fetch, null).loadModel('nope'));
    expect(e.message).toBe('no model named `nope` in models.toml');
    expect(e.status).toBe(404);
    expect(e.type).toBe('not_found_error');
    expect(e.code).toBe('model_not_found');
  });

  it('fall back to the status line and body text when the body is not the error JSON', async () => {
    const { fetch } = mockFetch({ 'GET /api/health': () => new Response('upstream exploded', { status: 502, statusText: 'Bad Gateway' }) });
    const e = await rejection(new Api(BASE, fetch, null).health());
    expect(e.message).toBe('HTTP 502 Bad Gateway: upstream exploded');
    expect(e.status).toBe(502);
  });

  it('name the engine when it cannot be reached', async () => {
    const fetch = (async () => {
      throw new TypeError('Failed to fetch');
    }) as typeof globalThis.fetch;
    const e = await rejection(new Api(BASE, fetch, null).health());
    expect(e.message).toContain('Cannot reach the Tandem engine at http://127.0.0.1:11435');
    expect(e.message).toContain('Failed to fetch');
    expect(e.status).toBe(0);
  });

  it('of a chat request before streaming (HTTP status) carry the message', async () => {
    const { fetch } = mockFetch({
      'POST /v1/chat/completions': () => json({ error: { message: 'messages: must not be empty', type: 'invalid_request_error', code: null } }, 400),
    });
    const e = await rejection(collect(new Api(BASE, fetch, null).chat({ model: 'm', messages: [] })));
    expect(e.message).toBe('messages: must not be empty');
    expect(e.status).toBe(400);
  });

  it('inside the stream (an error chunk, or an `event: error`) throw with the message, after the text so far', async () => {
    for (const errorEvent of [
      'data: {"error":{"message":"out of memory while decoding","type":"server_error","code":"oom"}}\n\n',
      'event: error\ndata: {"error":{"message":"out of memory while decoding"}}\n\n',
    ]) {
      const { fetch } = mockFetch({ 'POST /v1/chat/completions': () => sse([chunk('Hi'), errorEvent, 'data: [DONE]\n\n']) });
      const seen: string[] = [];
      const e = await rejection(
        (async () => {
          for await (const c of new Api(BASE, fetch, null).chat({ model: 'm', messages: [] })) seen.push(c.choices[0]!.delta.content!);
        })(),
      );
      expect(e.message).toBe('out of memory while decoding');
      expect(seen).toEqual(['Hi']);
    }
  });
});

describe('chat', () => {
  it('sends an OpenAI streaming request with sampling and image parts, and yields chunks until [DONE]', async () => {
    const { fetch, calls } = mockFetch({
      'POST /v1/chat/completions': () =>
        sse([
          chunk('Hel'),
          chunk('lo'),
          `data: ${JSON.stringify(chunkOf({}, {}, 'stop'))}\n\n`,
          `data: ${JSON.stringify(chunkOf({}, { choices: [], usage: { prompt_tokens: 42, completion_tokens: 27, total_tokens: 69, prompt_tokens_details: { cached_tokens: 0 } }, stats: SAMPLE_STATS }))}\n\n`,
          'data: [DONE]\n\n',
          chunk('never read'),
        ]),
    });
    const api = new Api(BASE, fetch, null);
    const image = 'data:image/png;base64,iVBORw0KGgo=';
    const chunks = await collect(
      api.chat({
        model: 'tandem-tiny',
        messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: image } }, { type: 'text', text: 'What is this?' }] }],
        temperature: 0.2,
        top_p: 0.9,
        max_tokens: 64,
        seed: 7,
      }),
    );
    expect(calls[0]!.url).toBe(`${BASE}/v1/chat/completions`);
    expect(calls[0]!.body).toEqual({
      model: 'tandem-tiny',
      messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: image } }, { type: 'text', text: 'What is this?' }] }],
      temperature: 0.2,
      top_p: 0.9,
      max_tokens: 64,
      seed: 7,
      stream: true,
      stream_options: { include_usage: true },
    });
    expect(chunks.map((c) => c.choices[0]?.delta.content ?? '').join('')).toBe('Hello');
    expect(chunks).toHaveLength(4);
    expect(chunks[3]!.stats).toEqual(SAMPLE_STATS);
    expect(chunks[3]!.usage?.completion_tokens).toBe(27);
  });

  it('stops when aborted, with an AbortError, not an ApiError', async () => {
    const { fetch } = mockFetch({ 'POST /v1/chat/completions': () => sse([chunk('a')], { hang: true }) });
    const c = new AbortController();
    const seen: string[] = [];
    for await (const ch of new Api(BASE, fetch, null).chat({ model: 'm', messages: [] }, c.signal)) {
      seen.push(ch.choices[0]!.delta.content!);
      c.abort();
    }
    expect(seen).toEqual(['a']);
  });

  it('sends the API key as a bearer token when one is set', async () => {
    const { fetch, calls } = mockFetch({
      'GET /api/health': () => json({ status: 'ok', version: '0.1.0', uptime_s: 1, models_loaded: [], api_key_required: true, backend: 'cpu' }),
    });
    await new Api(BASE, fetch, 'secret').health();
    expect(calls[0]!.headers.Authorization).toBe('Bearer secret');
  });
});

describe('admin', () => {
  it('lists the models of `GET /api/models`, an unreadable folder without a format', async () => {
    const unreadable = modelStatus({ id: 'broken', name: 'broken', format: null, error: 'config.json: not found', loaded: false });
    const body: ModelList = { models: [modelStatus(), unreadable], default: 'tandem-tiny', models_dir: '/m' };
    const { fetch } = mockFetch({ 'GET /api/models': () => json(body) });
    const list = await new Api(BASE, fetch, null).adminModels();
    expect(list).toEqual(body.models);
    expect(list[1]!.format).toBeNull();
  });

  it('loads, unloads and patches settings at the documented paths, with ids escaped', async () => {
    const { fetch, calls } = mockFetch({
      'POST /api/models/a%2Fb/load': () => json(modelStatus()),
      'POST /api/models/a%2Fb/unload': () => json(modelStatus({ loaded: false, state: 'unloaded' })),
      'PATCH /api/models/a%2Fb/settings': () => json(modelStatus()),
    });
    const api = new Api(BASE, fetch, null);
    await api.loadModel('a/b');
    await api.unloadModel('a/b');
    await api.updateModelSettings('a/b', { mtp: { enabled: false, depth: 2 } });
    expect(calls.map((c) => `${c.method} ${c.url}`)).toEqual([
      `POST ${BASE}/api/models/a%2Fb/load`,
      `POST ${BASE}/api/models/a%2Fb/unload`,
      `PATCH ${BASE}/api/models/a%2Fb/settings`,
    ]);
    expect(calls[2]!.body).toEqual({ mtp: { enabled: false, depth: 2 } });
  });

  it('lists /v1/models', async () => {
    const model = { id: 'tandem-tiny', object: 'model', created: 1, owned_by: 'tandem' };
    const { fetch } = mockFetch({ 'GET /v1/models': () => json({ object: 'list', data: [model] }) });
    expect(await new Api(BASE, fetch, null).models()).toEqual([model]);
  });

  it('starts a conversion and follows its events, skipping what is not JSON', async () => {
    const events: JobEvent[] = [
      { event: 'validated', format: 'hf', tensors: 3, bytes: 100, mtp: 'complete' },
      { event: 'planned', tensors: 3, shards: 1, params: 50, predicted_bytes: 2400000000, predicted_bpw: 4.5, quantized_modules: 2, dense_modules: 1 },
      { event: 'progress', done: 1, total: 3, tensor: 'model.layers.0.mlp.up_proj.weight', bytes_done: 10, bytes_total: 30 },
      { event: 'error', message: 'disk full', error: { message: 'disk full', type: 'server_error', code: 'internal_error' } },
    ];
    const { fetch, calls } = mockFetch({
      'POST /api/convert': () => json({ job: 'j1' }, 202),
      'GET /api/convert/j1/events': () =>
        sse([`data: ${JSON.stringify(events[0])}\n\n`, ': keep-alive\n\n', 'data: not json\n\n', ...events.slice(1).map((e) => `data: ${JSON.stringify(e)}\n\n`)]),
    });
    const api = new Api(BASE, fetch, null);
    const job = await api.startConvert({ src: '/m/in', bits: 4, group_size: 64, recipe: 'uniform', mtp: 'keep', mtp_bits: 8 });
    expect(job).toBe('j1');
    expect(calls[0]!.body).toEqual({ src: '/m/in', bits: 4, group_size: 64, recipe: 'uniform', mtp: 'keep', mtp_bits: 8 });
    expect(await collect(api.convertEvents(job))).toEqual(events);
  });

  it('cancels a conversion with DELETE and reports a conversion that could not start', async () => {
    const { fetch, calls } = mockFetch({
      'DELETE /api/convert/j1': () => json({ job: 'j1', state: 'cancelled' }),
      'POST /api/convert': () => json({ error: { message: '/nowhere: no such folder', type: 'invalid_request_error', code: 'not_found' } }, 400),
    });
    const api = new Api(BASE, fetch, null);
    await api.cancelConvert('j1');
    expect(calls[0]!.method).toBe('DELETE');
    const e = await rejection(api.startConvert({ src: '/nowhere', bits: 4, group_size: 64, recipe: 'uniform', mtp: 'keep' }));
    expect(e.message).toBe('/nowhere: no such folder');
  });

  it('follows the stats stream, skipping what is not JSON', async () => {
    const snap = statsSnapshot({ generating: true, model: 'tandem-tiny', tok_s: 50, stats: SAMPLE_STATS, loaded_models: ['tandem-tiny'] });
    const { fetch } = mockFetch({ 'GET /api/stats/stream': () => sse([`data: ${JSON.stringify(snap)}\n\n`, 'data: hello\n\n', `event: stats\ndata: ${JSON.stringify(snap)}\n\n`]) });
    expect(await collect(new Api(BASE, fetch, null).statsStream())).toEqual([snap, snap]);
  });
});

describe('resolveBase', () => {
  it('is the same origin over http(s), the default engine inside tauri, and an explicit ?api= wins', () => {
    expect(resolveBase({ protocol: 'http:', hostname: '127.0.0.1', search: '' })).toBe('');
    expect(resolveBase({ protocol: 'tauri:', hostname: 'localhost', search: '' })).toBe('http://127.0.0.1:11435');
    expect(resolveBase({ protocol: 'http:', hostname: 'tauri.localhost', search: '' })).toBe('http://127.0.0.1:11435');
    expect(resolveBase({ protocol: 'http:', hostname: 'localhost', search: '?api=http://engine.test:9000/' })).toBe('http://engine.test:9000');
  });
});
