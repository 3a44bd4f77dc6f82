import { describe, expect, it } from 'vitest';
import { Api } from '../src/api';
import { applyChunk, ChatStore, type ChatState } from '../src/chats';
import { leaveOut, type StoredMessage } from '../src/conversation';
import { LiveFeed } from '../src/live';
import { MemoryStore } from '../src/storage';
import { chunkOf, mockFetch, SAMPLE_STATS, sse } from './helpers';

const data = (x: unknown) => `data: ${JSON.stringify(x)}\n\n`;

describe('applyChunk', () => {
  it('appends text and reasoning, takes the finish reason and stats, and leaves the message as it was', () => {
    const m: StoredMessage = { id: 'a', role: 'assistant', content: 'Hel', created: 1 };
    const frozen = structuredClone(m);
    const { message, tokens } = applyChunk(m, chunkOf({ content: 'lo' }, { stats: SAMPLE_STATS }, 'stop'));
    expect(message).toMatchObject({ content: 'Hello', finish_reason: 'stop', stats: SAMPLE_STATS });
    expect(tokens).toBe(1);
    expect(m).toEqual(frozen);
  });
});

describe('ChatStore', () => {
  it('replaces its state on every change and never mutates a state it has published', async () => {
    const { fetch } = mockFetch({
      'POST /v1/chat/completions': () =>
        sse([data(chunkOf({ role: 'assistant', content: '' })), data(chunkOf({ content: 'Hi' })), data(chunkOf({ content: '!' }, { stats: SAMPLE_STATS }, 'stop')), 'data: [DONE]\n\n']),
    });
    const chats = new ChatStore(new MemoryStore(), new Api('', fetch, null), new LiveFeed(), (e) => {
      throw e;
    });
    const seen: [ChatState, string][] = [];
    chats.subscribe((s) => seen.push([s, JSON.stringify(s)]));
    await chats.start();
    await chats.send('Hello', [], 'tandem-tiny');

    const last = chats.state;
    expect(last.streaming).toBeNull();
    expect(last.conversation!.title).toBe('Hello');
    expect(last.conversation!.messages.map((m) => [m.role, m.content])).toEqual([
      ['user', 'Hello'],
      ['assistant', 'Hi!'],
    ]);
    expect(last.conversation!.messages[1]!.stats).toEqual(SAMPLE_STATS);
    // Each published state still reads as it did when it was published.
    for (const [state, json] of seen) expect(JSON.stringify(state)).toBe(json);
    // The reply grew over several states, each a new object.
    const replies = seen.map(([s]) => s.conversation?.messages[1]).filter((m) => m !== undefined);
    expect(new Set(replies.map((m) => m.content))).toEqual(new Set(['', 'Hi', 'Hi!']));
    expect(new Set(replies).size).toBeGreaterThanOrEqual(3);
    expect(seen.some(([s]) => s.streaming?.messageId === last.conversation!.messages[1]!.id)).toBe(true);
  });
});

describe('deleting a chat while its reply streams', () => {
  it('does not save the stopped reply after the delete', async () => {
    const { fetch } = mockFetch({
      'POST /v1/chat/completions': () => sse([data(chunkOf({ role: 'assistant', content: 'Once' }))], { hang: true }),
    });
    const store = new MemoryStore();
    const errors: unknown[] = [];
    const chats = new ChatStore(store, new Api('', fetch, null), new LiveFeed(), (e) => errors.push(e));
    await chats.start();
    const sending = chats.send('Tell a story', [], 'tandem-tiny');
    for (let i = 0; i < 50 && !chats.state.conversation?.messages[1]?.content; i++) await new Promise((r) => setTimeout(r, 5));
    const id = chats.state.conversation!.id;
    expect(await store.list()).toHaveLength(1);
    await chats.remove(id, 'tandem-tiny');
    await sending;
    await new Promise((r) => setTimeout(r, 20));
    expect(await store.list()).toEqual([]);
    expect(await store.load(id)).toBeNull();
    expect(chats.state.summaries).toEqual([]);
    expect(chats.state.conversation!.id).not.toBe(id);
    expect(errors).toEqual([]);
  });
});

describe('a conversation past the context', () => {
  it('says what to do about it in the message', async () => {
    const message = 'the prompt has 90 tokens and 3000 more were asked for, but model `tandem-tiny` has a context of 2048 tokens';
    const { fetch } = mockFetch({
      'POST /v1/chat/completions': () =>
        new Response(JSON.stringify({ error: { message, type: 'invalid_request_error', code: 'context_length_exceeded' } }), { status: 400 }),
    });
    const chats = new ChatStore(new MemoryStore(), new Api('', fetch, null), new LiveFeed(), () => {});
    await chats.start();
    chats.changeSettings({ max_tokens: 3000 }, '');
    await chats.send('Hi', [], 'tandem-tiny');
    expect(chats.state.conversation!.messages[1]!.error).toBe(`${message} Lower or clear Max tokens under Sampling, or delete earlier messages.`);
  });
});

describe('the context policy', () => {
  const turn = (n: number): StoredMessage[] => [
    { id: `u${n}`, role: 'user', content: `q${n}`, created: n },
    { id: `a${n}`, role: 'assistant', content: `a${n}`, created: n },
  ];
  const history = [...turn(1), ...turn(2), ...turn(3), { id: 'u4', role: 'user', content: 'q4', created: 4 } as StoredMessage];
  const texts = (h: StoredMessage[] | null) => h?.map((m) => m.content) ?? null;

  it('leaves out the oldest turns, or those after the first, never the last', () => {
    expect(texts(leaveOut(history, 'rolling', 1))).toEqual(['q2', 'a2', 'q3', 'a3', 'q4']);
    expect(texts(leaveOut(history, 'rolling', 3))).toEqual(['q4']);
    expect(leaveOut(history, 'rolling', 4)).toBeNull();
    expect(texts(leaveOut(history, 'middle', 1))).toEqual(['q1', 'a1', 'q3', 'a3', 'q4']);
    expect(texts(leaveOut(history, 'middle', 2))).toEqual(['q1', 'a1', 'q4']);
    expect(leaveOut(history, 'middle', 3)).toBeNull();
    expect(leaveOut(history, 'stop', 1)).toBeNull();
  });

  async function chatWith(policy: 'rolling' | 'middle' | 'stop') {
    // An engine whose context holds at most three messages.
    const { fetch, calls } = mockFetch({
      'POST /v1/chat/completions': (call) => {
        const n = (call.body as { messages: unknown[] }).messages.length;
        if (n > 3) {
          const error = { message: `the prompt has ${n * 100} tokens …`, type: 'invalid_request_error', code: 'context_length_exceeded' };
          return new Response(JSON.stringify({ error }), { status: 400 });
        }
        return sse([data(chunkOf({ content: 'fits' }, {}, 'stop')), 'data: [DONE]\n\n']);
      },
    });
    const store = new MemoryStore();
    await store.save({ id: 'c', title: 't', created: 1, updated: 1, model: 'tandem-tiny', sampling: {}, messages: history.slice(0, 6), contextPolicy: policy });
    const chats = new ChatStore(store, new Api('', fetch, null), new LiveFeed(), () => {});
    await chats.start();
    await chats.send('q4', [], 'tandem-tiny');
    return { reply: chats.state.conversation!.messages.at(-1)!, calls, saved: (await store.load('c'))! };
  }

  it('rolls the window by default, keeping every message in the chat', async () => {
    const { reply, calls, saved } = await chatWith('rolling');
    expect(reply).toMatchObject({ content: 'fits', leftOut: 2 });
    expect(reply.error).toBeUndefined();
    const sent = (calls.at(-1)!.body as { messages: { content: string }[] }).messages.map((m) => m.content);
    expect(sent).toEqual(['q3', 'a3', 'q4']);
    expect(saved.messages).toHaveLength(8);
  });

  it('keeps the first turn with "middle", and fails with "stop"', async () => {
    const middle = await chatWith('middle');
    expect((middle.calls.at(-1)!.body as { messages: { content: string }[] }).messages.map((m) => m.content)).toEqual(['q1', 'a1', 'q4']);
    const stop = await chatWith('stop');
    expect(stop.calls).toHaveLength(1);
    expect(stop.reply.error).toContain('Delete earlier messages');
  });
});

describe('undoing the delete of a streaming chat', () => {
  it('brings it back with the reply as far as it came, marked stopped', async () => {
    const { fetch } = mockFetch({
      'POST /v1/chat/completions': () => sse([data(chunkOf({ role: 'assistant', content: 'Once upon' }))], { hang: true }),
    });
    const store = new MemoryStore();
    const chats = new ChatStore(store, new Api('', fetch, null), new LiveFeed(), () => {});
    await chats.start();
    const sending = chats.send('Tell a story', [], 'tandem-tiny');
    for (let i = 0; i < 50 && !chats.state.conversation?.messages[1]?.content; i++) await new Promise((r) => setTimeout(r, 5));
    const id = chats.state.conversation!.id;
    await chats.remove(id, 'tandem-tiny');
    await sending;
    expect(await store.load(id)).toBeNull();
    await chats.undoRemove();
    const back = (await store.load(id))!;
    expect(back.messages.map((m) => [m.role, m.content, m.stopped ?? false])).toEqual([
      ['user', 'Tell a story', false],
      ['assistant', 'Once upon', true],
    ]);
    expect(chats.state.conversation!.id).toBe(id);
  });
});
