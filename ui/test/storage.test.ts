import { afterEach, describe, expect, it } from 'vitest';
import { Api } from '../src/api';
import { type Conversation, newConversation, titleFrom } from '../src/conversation';
import { defaultStore, EngineStore, MemoryStore, migrate, ServerStore, WebStorageStore, type ConversationStore } from '../src/storage';
import { json, SAMPLE_STATS } from './helpers';

/**
 * An engine's `/api/conversations` in memory, as the server answers (src/server/conversations.rs):
 * `store: false` is an engine without it (404 "no route"), `down` one that cannot be reached, `limit` its
 * body limit (413 beyond).
 */
function fakeEngine(opts: { store?: boolean; limit?: number } = {}) {
  const files = new Map<string, string>();
  const calls: string[] = [];
  const state = { down: false };
  const fetch = async (input: RequestInfo | URL, init: RequestInit = {}): Promise<Response> => {
    const url = new URL(String(input));
    const method = (init.method ?? 'GET').toUpperCase();
    calls.push(`${method} ${url.pathname}`);
    if (state.down) throw new TypeError('Failed to fetch');
    const m = /^\/api\/conversations(?:\/([^/]+))?$/.exec(url.pathname);
    if (!m || opts.store === false) {
      return json({ error: { message: `no route ${method} ${url.pathname}`, type: 'not_found_error', code: 'not_found' } }, 404);
    }
    const missing = (id: string) => json({ error: { message: `no conversation \`${id}\``, type: 'not_found_error', code: 'conversation_not_found' } }, 404);
    const id = m[1] === undefined ? null : decodeURIComponent(m[1]);
    if (id === null) {
      const conversations = [...files.values()]
        .map((raw) => JSON.parse(raw) as Conversation)
        .map(({ id, title, updated }) => ({ id, title, updated }))
        .sort((a, b) => b.updated - a.updated);
      return json({ conversations });
    }
    if (method === 'GET') return files.has(id) ? new Response(files.get(id), { headers: { 'Content-Type': 'application/json' } }) : missing(id);
    if (method === 'DELETE') return files.delete(id) ? json({ id, deleted: true }) : missing(id);
    const body = String(init.body);
    if (opts.limit !== undefined && body.length > opts.limit) {
      return json({ error: { message: 'the request body is larger than the server accepts', type: 'invalid_request_error', code: 'body_too_large' } }, 413);
    }
    const c = JSON.parse(body) as Conversation;
    const created = !files.has(id);
    files.set(id, body);
    return json({ id, title: c.title, updated: c.updated }, created ? 201 : 200);
  };
  return { client: new Api('http://127.0.0.1:11435', fetch as typeof globalThis.fetch, null), files, calls, state };
}

function sample(title: string, updated: number): Conversation {
  const c = newConversation('tandem-tiny', { temperature: 0.3, seed: 1 });
  c.title = title;
  c.updated = updated;
  c.system = 'Be brief.';
  c.messages.push(
    { id: 'u1', role: 'user', content: 'What is this?', images: ['data:image/png;base64,iVBORw0KGgo='], created: 1 },
    { id: 'a1', role: 'assistant', content: '<think>hm</think>A dot.', model: 'tandem-tiny', stats: SAMPLE_STATS, finish_reason: 'stop', created: 2 },
  );
  return c;
}

const stores: [string, () => ConversationStore][] = [
  ['WebStorageStore (localStorage)', () => new WebStorageStore(window.localStorage)],
  ['MemoryStore', () => new MemoryStore()],
  ['ServerStore (the engine)', () => new ServerStore(fakeEngine().client)],
  ['EngineStore (the engine, chosen)', () => new EngineStore(fakeEngine().client, new MemoryStore())],
];

afterEach(() => window.localStorage.clear());

describe.each(stores)('%s', (_name, make) => {
  it('round-trips a conversation, images and stats included', async () => {
    const store = make();
    const c = sample('First', 1000);
    await store.save(c);
    expect(await store.load(c.id)).toEqual(c);
  });

  it('lists newest first, updates in place and removes', async () => {
    const store = make();
    const a = sample('A', 1000);
    const b = sample('B', 2000);
    await store.save(a);
    await store.save(b);
    expect((await store.list()).map((s) => s.title)).toEqual(['B', 'A']);
    a.title = 'A renamed';
    a.updated = 3000;
    await store.save(a);
    expect(await store.list()).toEqual([
      { id: a.id, title: 'A renamed', updated: 3000 },
      { id: b.id, title: 'B', updated: 2000 },
    ]);
    await store.remove(a.id);
    expect((await store.list()).map((s) => s.id)).toEqual([b.id]);
    expect(await store.load(a.id)).toBeNull();
  });
});

describe('WebStorageStore', () => {
  it('survives a new instance over the same storage (a reload)', async () => {
    const c = sample('Persisted', 5);
    await new WebStorageStore(window.localStorage).save(c);
    expect(await new WebStorageStore(window.localStorage).load(c.id)).toEqual(c);
  });

  it('says the storage is full in words when the quota is exceeded', async () => {
    const full = {
      getItem: () => null,
      setItem: () => {
        throw new DOMException('exceeded', 'QuotaExceededError');
      },
      removeItem: () => {},
    } as unknown as Storage;
    await expect(new WebStorageStore(full).save(sample('Big', 1))).rejects.toThrow(/storage is full/);
  });
});

describe('ServerStore', () => {
  it('sends whole conversations to the engine and reads them back', async () => {
    const engine = fakeEngine();
    const store = new ServerStore(engine.client);
    const c = sample('On disk', 7);
    await store.save(c);
    expect(JSON.parse(engine.files.get(c.id)!)).toEqual(c);
    expect(engine.calls).toEqual([`PUT /api/conversations/${c.id}`]);
    expect(await new ServerStore(engine.client).load(c.id)).toEqual(c);
    expect(await store.load('unknown')).toBeNull();
    await store.remove('unknown'); // already gone: not an error
  });

  it('says in words when a conversation is larger than the engine accepts', async () => {
    const store = new ServerStore(fakeEngine({ limit: 100 }).client);
    await expect(store.save(sample('Big', 1))).rejects.toThrow(/Could not save the conversation "Big": it is larger than the engine accepts/);
  });
});

describe('EngineStore', () => {
  it("moves this browser's conversations to an engine that has none, then uses the engine", async () => {
    const local = new WebStorageStore(window.localStorage);
    const a = sample('Old A', 1000);
    const b = sample('Old B', 2000);
    await local.save(a);
    await local.save(b);
    const engine = fakeEngine();
    const store = new EngineStore(engine.client, local);
    expect((await store.list()).map((s) => s.title)).toEqual(['Old B', 'Old A']);
    expect(JSON.parse(engine.files.get(a.id)!)).toEqual(a);
    expect(JSON.parse(engine.files.get(b.id)!)).toEqual(b);
    // Moved, not copied: this browser keeps nothing (the page's origin may change with the port).
    expect(await local.list()).toEqual([]);
    expect(window.localStorage.getItem(`tandem.conversation.v1.${a.id}`)).toBeNull();
    // The choice is made once; later calls go straight to the engine.
    const c = sample('New', 3000);
    await store.save(c);
    expect(engine.files.has(c.id)).toBe(true);
    expect(await local.list()).toEqual([]);
    expect(engine.calls.filter((x) => x === 'GET /api/conversations')).toHaveLength(2);
    // A new page (a reload) sees them all on the engine.
    expect((await new EngineStore(engine.client, new WebStorageStore(window.localStorage)).list()).map((s) => s.title)).toEqual([
      'New',
      'Old B',
      'Old A',
    ]);
  });

  it("never replaces the engine's newer copy, and moves what it lacks", async () => {
    const engine = fakeEngine();
    const server = new ServerStore(engine.client);
    const shared = sample('Shared, newer on the engine', 5000);
    await server.save(shared);
    const local = new MemoryStore();
    await local.save({ ...shared, title: 'Shared, older here', updated: 4000 });
    const newer = sample('Newer here', 6000);
    await server.save({ ...newer, title: 'Older on the engine', updated: 1 });
    await local.save(newer);
    const only = sample('Only here', 10);
    await local.save(only);
    const result = await migrate(local, server, await server.list());
    expect(result.failed).toEqual([]);
    expect(result.moved.sort()).toEqual([shared.id, newer.id, only.id].sort());
    expect((await server.load(shared.id))!.title).toBe('Shared, newer on the engine');
    expect((await server.load(newer.id))!.title).toBe('Newer here');
    expect(await server.load(only.id)).toEqual(only);
    expect(await local.list()).toEqual([]);
  });

  it('keeps a conversation that cannot be moved, says so, and moves the others', async () => {
    const local = new WebStorageStore(window.localStorage);
    const small = sample('Small', 1);
    const big = sample('Huge', 2);
    big.messages[0]!.images = ['data:image/png;base64,' + 'A'.repeat(20_000)];
    await local.save(small);
    await local.save(big);
    const engine = fakeEngine({ limit: 10_000 });
    const problems: string[] = [];
    const store = new EngineStore(engine.client, local, (m) => problems.push(m));
    expect((await store.list()).map((s) => s.title)).toEqual(['Small']);
    expect((await local.list()).map((s) => s.title)).toEqual(['Huge']);
    expect(await local.load(big.id)).toEqual(big);
    expect(problems).toHaveLength(1);
    expect(problems[0]).toMatch(/1 conversation kept in this browser could not be moved.*"Huge".*larger than the engine accepts/);
  });

  it('keeps using this browser when the engine has no conversation store', async () => {
    const local = new WebStorageStore(window.localStorage);
    const old = sample('Here', 1);
    await local.save(old);
    const engine = fakeEngine({ store: false });
    const store = new EngineStore(engine.client, local);
    expect((await store.list()).map((s) => s.title)).toEqual(['Here']);
    const c = sample('Also here', 2);
    await store.save(c);
    expect(await local.load(c.id)).toEqual(c);
    expect(engine.calls).toEqual(['GET /api/conversations']);
  });

  it('writes nowhere while the engine cannot be reached, and chooses once it answers', async () => {
    const local = new WebStorageStore(window.localStorage);
    const engine = fakeEngine();
    engine.state.down = true;
    const store = new EngineStore(engine.client, local);
    const c = sample('Waiting', 1);
    await expect(store.save(c)).rejects.toThrow(/Cannot reach the Tandem engine/);
    await expect(store.list()).rejects.toThrow(/Cannot reach/);
    expect(await local.list()).toEqual([]);
    engine.state.down = false;
    await store.save(c);
    expect(engine.files.has(c.id)).toBe(true);
    expect(await local.list()).toEqual([]);
  });
});

describe('defaultStore', () => {
  it("uses the engine's store given the engine's client", () => {
    expect(defaultStore(fakeEngine().client)).toBeInstanceOf(EngineStore);
  });

  it("prefers the shell's store when it provides one", () => {
    const injected = new MemoryStore();
    (globalThis as { __TANDEM_STORAGE__?: unknown }).__TANDEM_STORAGE__ = injected;
    try {
      expect(defaultStore()).toBe(injected);
    } finally {
      delete (globalThis as { __TANDEM_STORAGE__?: unknown }).__TANDEM_STORAGE__;
    }
    expect(defaultStore()).toBeInstanceOf(WebStorageStore);
  });
});

describe('titleFrom', () => {
  it('takes the first line, shortened', () => {
    expect(titleFrom('  Hello there\nsecond line')).toBe('Hello there');
    expect(titleFrom('x'.repeat(100))).toHaveLength(58);
    expect(titleFrom('', 2)).toBe('Image');
  });
});
