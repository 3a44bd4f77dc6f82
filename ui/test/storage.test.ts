import { afterEach, describe, expect, it } from 'vitest';
import { defaultStore, MemoryStore, newConversation, titleFrom, WebStorageStore, type Conversation, type ConversationStore } from '../src/storage';
import { SAMPLE_STATS } from './helpers';

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

describe('defaultStore', () => {
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
