import { render } from 'preact';
import { act } from 'preact/test-utils';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { Api } from '../src/api';
import { dismiss, ErrorBanner } from '../src/components/banner';
import { LiveFeed } from '../src/live';
import { MemoryStore } from '../src/storage';
import type { ChatCompletionChunk, ModelStatus, OpenAIModel } from '../src/generated';
import { ChatView } from '../src/views/chat/view';
import { chunkOf, json, mockFetch, modelStatus, SAMPLE_STATS } from './helpers';

vi.mock('../src/components/chart', () => ({ TokChart: () => <div data-testid="panel-chart" /> }));

const MODELS: OpenAIModel[] = [{ id: 'tandem-tiny', object: 'model', created: 0, owned_by: 'tandem' }];
const ADMIN: ModelStatus[] = [modelStatus()];

/** A streamed response the test writes into piece by piece. */
function controlledStream() {
  let ctrl!: ReadableStreamDefaultController<Uint8Array>;
  const body = new ReadableStream<Uint8Array>({
    start(c) {
      ctrl = c;
    },
  });
  const enc = new TextEncoder();
  return {
    response: new Response(body, { headers: { 'Content-Type': 'text/event-stream' } }),
    send(s: string) {
      ctrl.enqueue(enc.encode(s));
    },
    content(text: string, extra: Partial<ChatCompletionChunk> = {}) {
      this.send(`data: ${JSON.stringify(chunkOf({ content: text }, extra))}\n\n`);
    },
    close() {
      ctrl.close();
    },
  };
}

let root: HTMLElement | null = null;
afterEach(() => {
  if (root) {
    act(() => render(null, root!));
    root.remove();
    root = null;
  }
  dismiss();
});

async function settle(ms = 30) {
  await act(async () => {
    await new Promise((r) => setTimeout(r, ms));
  });
}

async function waitFor(check: () => boolean, what: string) {
  for (let i = 0; i < 100; i++) {
    if (check()) return;
    await settle(10);
  }
  throw new Error(`timed out waiting for ${what}`);
}

const q = (sel: string) => root!.querySelector(sel) as HTMLElement | null;
const byId = (id: string) => q(`[data-testid="${id}"]`);
const all = (id: string) => [...root!.querySelectorAll(`[data-testid="${id}"]`)] as HTMLElement[];

async function mount(routes: Parameters<typeof mockFetch>[0]) {
  const mock = mockFetch(routes);
  const client = new Api('', mock.fetch, null);
  const store = new MemoryStore();
  const feed = new LiveFeed();
  root = document.createElement('div');
  document.body.appendChild(root);
  act(() =>
    render(
      <>
        <ErrorBanner />
        <ChatView store={store} models={MODELS} adminModels={ADMIN} client={client} feed={feed} />
      </>,
      root!,
    ),
  );
  await settle();
  return { ...mock, store, feed };
}

async function type(text: string) {
  const input = byId('chat-input') as HTMLTextAreaElement;
  await act(async () => {
    input.value = text;
    input.dispatchEvent(new Event('input', { bubbles: true }));
  });
}

async function click(id: string) {
  await act(async () => {
    byId(id)!.click();
  });
}

describe('ChatView', () => {
  it('streams a reply with markdown, ends it with stats, and saves the conversation', async () => {
    const stream = controlledStream();
    const { calls, store, feed } = await mount({ 'POST /v1/chat/completions': () => stream.response });
    await type('Say hello');
    await click('chat-send');
    await waitFor(() => !!byId('message-assistant'), 'the assistant message');
    expect(byId('message-assistant')!.dataset.streaming).toBe('true');
    expect(byId('chat-stop')).not.toBeNull();
    expect(calls[0]!.body).toMatchObject({ model: 'tandem-tiny', messages: [{ role: 'user', content: 'Say hello' }], stream: true });

    stream.content('**Hello**');
    stream.content(' there');
    await waitFor(() => byId('message-content')!.textContent!.trim() === 'Hello there', 'the streamed text');
    expect(q('[data-testid="message-content"] strong')?.textContent).toBe('Hello');

    stream.send(`data: ${JSON.stringify(chunkOf({}, { choices: [], usage: { prompt_tokens: 3, completion_tokens: 2, total_tokens: 5 }, stats: SAMPLE_STATS }))}\n\n`);
    stream.send('data: [DONE]\n\n');
    stream.close();
    await waitFor(() => byId('message-assistant')!.dataset.streaming === 'false', 'the end of the stream');
    expect(byId('chat-send')).not.toBeNull();
    expect(byId('message-stats')!.textContent).toContain('63.4 tok/s');
    expect(feed.state.stats).toEqual(SAMPLE_STATS);
    expect(byId('panel-acceptance')).not.toBeNull();

    const [summary] = await store.list();
    expect(summary!.title).toBe('Say hello');
    const saved = await store.load(summary!.id);
    expect(saved!.messages.map((m) => [m.role, m.content])).toEqual([
      ['user', 'Say hello'],
      ['assistant', '**Hello** there'],
    ]);
    expect(all('conversation-item')).toHaveLength(1);
  });

  it('stops a reply by aborting the request, keeping the text so far', async () => {
    const stream = controlledStream();
    const { calls } = await mount({ 'POST /v1/chat/completions': () => stream.response });
    await type('Count');
    await click('chat-send');
    stream.content('1 2 3');
    await waitFor(() => byId('message-content')?.textContent?.trim() === '1 2 3', 'the first text');
    await click('chat-stop');
    await waitFor(() => byId('message-assistant')!.dataset.streaming === 'false', 'the stop');
    expect(calls[0]!.signal!.aborted).toBe(true);
    expect(byId('message-content')!.textContent!.trim()).toBe('1 2 3');
    expect(q('.message-meta .tag')?.textContent).toBe('stopped');
    expect(byId('error-banner')).toBeNull();
  });

  it("shows the server's error message in the banner and the message, and regenerates", async () => {
    let n = 0;
    const { calls } = await mount({
      'POST /v1/chat/completions': () => {
        n++;
        if (n === 1) return json({ error: { message: 'model `tandem-tiny` failed to load: out of memory', type: 'server_error', code: 'load_failed' } }, 500);
        const s = controlledStream();
        s.content('Recovered.');
        s.send('data: [DONE]\n\n');
        s.close();
        return s.response;
      },
    });
    await type('Hi');
    await click('chat-send');
    await waitFor(() => !!byId('error-banner'), 'the error banner');
    expect(byId('error-banner')!.textContent).toContain('model `tandem-tiny` failed to load: out of memory');
    expect(byId('message-error')!.textContent).toBe('model `tandem-tiny` failed to load: out of memory');

    await click('chat-regenerate');
    await waitFor(() => byId('message-content')?.textContent?.trim() === 'Recovered.', 'the regenerated reply');
    await waitFor(() => byId('message-assistant')!.dataset.streaming === 'false', 'its end');
    expect(all('message-assistant')).toHaveLength(1);
    // The failed reply is not sent back as history.
    expect(calls[1]!.body).toMatchObject({ messages: [{ role: 'user', content: 'Hi' }] });
  });

  it('sends per-chat sampling settings', async () => {
    const stream = controlledStream();
    const { calls } = await mount({ 'POST /v1/chat/completions': () => stream.response });
    await click('chat-settings-toggle');
    for (const [id, v] of [
      ['setting-temperature', '0.2'],
      ['setting-top-p', '0.9'],
      ['setting-max-tokens', '32'],
      ['setting-seed', '11'],
    ] as const) {
      const el = byId(id) as HTMLInputElement;
      await act(async () => {
        el.value = v;
        el.dispatchEvent(new Event('input', { bubbles: true }));
      });
    }
    expect((byId('setting-temperature') as HTMLInputElement).placeholder).toBe('default 0.7');
    await type('x');
    await click('chat-send');
    await waitFor(() => calls.length > 0, 'the request');
    expect(calls[0]!.body).toMatchObject({ temperature: 0.2, top_p: 0.9, max_tokens: 32, seed: 11 });
    stream.close();
  });
});
