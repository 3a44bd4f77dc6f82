import { render } from 'preact';
import { act } from 'preact/test-utils';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { Api } from '../src/api';
import { dismiss, ErrorBanner } from '../src/components/banner';
import { LiveFeed } from '../src/live';
import type { Conversation } from '../src/conversation';
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

async function mount(routes: Parameters<typeof mockFetch>[0], store = new MemoryStore()) {
  const mock = mockFetch(routes);
  const client = new Api('', mock.fetch, null);
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

    stream.send(`data: ${JSON.stringify(chunkOf({}, { choices: [], usage: { prompt_tokens: 3, completion_tokens: 2, total_tokens: 5, prompt_tokens_details: { cached_tokens: 0 } }, stats: SAMPLE_STATS }))}\n\n`);
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

const PNG = 'data:image/png;base64,iVBORw0KGgo=';

/** A store holding one conversation: a user turn with an image, and its (failed) reply. */
async function storeWithImage(): Promise<MemoryStore> {
  const store = new MemoryStore();
  const c: Conversation = {
    id: 'c1',
    title: 'Look',
    created: 1,
    updated: 2,
    model: 'tandem-tiny',
    sampling: {},
    messages: [
      { id: 'u1', role: 'user', content: 'What is this?', images: [PNG], created: 1 },
      { id: 'a1', role: 'assistant', content: '', error: 'remove the 1 image(s)', created: 2 },
      { id: 'u2', role: 'user', content: '', images: [PNG], created: 3 },
    ],
  };
  await store.save(c);
  return store;
}

function replyOnce(text: string) {
  const s = controlledStream();
  s.content(text);
  s.send(`data: ${JSON.stringify(chunkOf({}, { choices: [], usage: { prompt_tokens: 30, completion_tokens: 12, total_tokens: 42, prompt_tokens_details: { cached_tokens: 0 } } }))}\n\n`);
  s.send('data: [DONE]\n\n');
  s.close();
  return s.response;
}

describe('images and a text-only model', () => {
  it('blocks Send while the chat holds an image, says why, and removes the images on request', async () => {
    const store = await storeWithImage();
    const { calls } = await mount({ 'POST /v1/chat/completions': () => replyOnce('Fine.') }, store);
    await waitFor(() => all('message-image').length === 2, 'the stored images');
    await type('And now?');
    expect((byId('chat-send') as HTMLButtonElement).disabled).toBe(true);
    expect(byId('vision-warning')!.textContent).toContain('cannot take images');
    expect(byId('vision-warning')!.textContent).toContain('2 images');
    // Enter does not send either.
    await act(async () => {
      byId('chat-input')!.dispatchEvent(new KeyboardEvent('keydown', { key: 'Enter', bubbles: true }));
    });
    expect(calls.filter((c) => c.method === 'POST')).toHaveLength(0);
    // Asking again would send the images too: no Regenerate, no Edit.
    expect(byId('chat-regenerate')).toBeNull();
    expect(byId('message-edit')).toBeNull();

    await click('chat-drop-images');
    expect(byId('chat-regenerate')).not.toBeNull();
    expect(all('message-image')).toHaveLength(0);
    expect(byId('vision-warning')).toBeNull();
    // The user turn that was only an image is gone; the one with text stays, without its image.
    expect(all('message-user').map((m) => m.textContent)).toEqual([expect.stringContaining('What is this?')]);
    await click('chat-send');
    await waitFor(() => calls.some((c) => c.method === 'POST'), 'the request');
    const body = calls.find((c) => c.method === 'POST')!.body as { messages: { content: unknown }[] };
    expect(JSON.stringify(body.messages)).not.toContain('image_url');
    const saved = await store.load('c1');
    await waitFor(() => !!saved, 'saved');
    expect(JSON.stringify((await store.load('c1'))!.messages)).not.toContain('data:image');
  });

  it('blocks Send with an attached image until the attachment is removed', async () => {
    await mount({});
    const input = byId('chat-file-input') as HTMLInputElement;
    const file = new File([new Uint8Array([137, 80, 78, 71])], 'cat.png', { type: 'image/png' });
    Object.defineProperty(input, 'files', { value: [file], configurable: true });
    await act(async () => {
      input.dispatchEvent(new Event('change', { bubbles: true }));
    });
    await waitFor(() => all('attachment-preview').length === 1, 'the preview');
    expect((byId('chat-send') as HTMLButtonElement).disabled).toBe(true);
    expect(byId('vision-warning')!.textContent).toContain('Remove the attached image to send');
    await click('attachment-remove');
    expect(all('attachment-preview')).toHaveLength(0);
    expect(byId('vision-warning')).toBeNull();
    await type('plain text');
    expect((byId('chat-send') as HTMLButtonElement).disabled).toBe(false);
  });

  it('deletes single messages, user or assistant, and saves the conversation without them', async () => {
    const store = await storeWithImage();
    await mount({}, store);
    await waitFor(() => all('message-user').length === 2, 'the messages');
    const del = (role: string) =>
      act(async () => {
        (q(`[data-testid="message-${role}"] [data-testid="message-delete"]`) as HTMLElement).click();
      });
    await del('assistant');
    expect(all('message-assistant')).toHaveLength(0);
    await del('user');
    await del('user');
    expect(all('message-user')).toHaveLength(0);
    await settle();
    expect((await store.load('c1'))!.messages).toEqual([]);
  });
});

describe('context and defaults', () => {
  it("writes the model's defaults without float noise", async () => {
    ADMIN[0] = modelStatus({ sampling: { temperature: 0.699999988079071, top_p: 0.949999988079071, top_k: 0, min_p: 0, repetition_penalty: 1, max_tokens: 512 } });
    try {
      await mount({});
      await click('chat-settings-toggle');
      expect((byId('setting-temperature') as HTMLInputElement).placeholder).toBe('default 0.7');
      expect((byId('setting-top-p') as HTMLInputElement).placeholder).toBe('default 0.95');
    } finally {
      ADMIN[0] = modelStatus();
    }
  });

  it('says MTP is off once in the header, with its reason', async () => {
    const why = 'the MTP head probes at best 0.004 top-1 agreement';
    const probe = { acceptance: null, tried: [], chosen: null, seconds: 1, tokens: 256, body_agreement: 0.2, inconclusive: false };
    ADMIN[0] = modelStatus({ mtp: { available: true, enabled: true, depth: 3, reason: why, repaired: null, adaptive: true, probe } });
    try {
      await mount({});
      const header = q('.chat-header')!.textContent!;
      expect(header.split('MTP off').length - 1).toBe(1);
      expect(header).toContain(why);
      expect(header).not.toContain('MTP depth');
    } finally {
      ADMIN[0] = modelStatus();
    }
  });

  it('shows the tokens the conversation uses against the model context', async () => {
    await mount({ 'POST /v1/chat/completions': () => replyOnce('Sure.') });
    expect(byId('chat-context')!.textContent).toBe('0 / 2,048 tokens');
    await type('Hi');
    await click('chat-send');
    await waitFor(() => byId('chat-context')!.textContent === '42 / 2,048 tokens', 'the usage');
  });

  it("starts a new chat from the model's defaults, not the previous chat's settings", async () => {
    const { calls } = await mount({ 'POST /v1/chat/completions': () => replyOnce('ok') });
    await click('chat-settings-toggle');
    const el = byId('setting-max-tokens') as HTMLInputElement;
    await act(async () => {
      el.value = '3000';
      el.dispatchEvent(new Event('input', { bubbles: true }));
    });
    await click('new-chat');
    await click('chat-settings-toggle');
    expect((byId('setting-max-tokens') as HTMLInputElement).value).toBe('');
    await type('x');
    await click('chat-send');
    await waitFor(() => calls.some((c) => c.method === 'POST'), 'the request');
    expect(calls.find((c) => c.method === 'POST')!.body).not.toHaveProperty('max_tokens');
  });
});

describe('chat settings', () => {
  it('sends top_k, min_p, repetition_penalty and thinking off, and Escape closes the popover', async () => {
    const { calls } = await mount({ 'POST /v1/chat/completions': () => replyOnce('ok') });
    await click('chat-settings-toggle');
    for (const [id, v] of [
      ['setting-top-k', '40'],
      ['setting-min-p', '0.05'],
      ['setting-repetition-penalty', '1.1'],
    ] as const) {
      const el = byId(id) as HTMLInputElement;
      await act(async () => {
        el.value = v;
        el.dispatchEvent(new Event('input', { bubbles: true }));
      });
    }
    const thinking = byId('setting-thinking') as HTMLSelectElement;
    await act(async () => {
      thinking.value = 'off';
      thinking.dispatchEvent(new Event('change', { bubbles: true }));
    });
    expect((byId('setting-repetition-penalty') as HTMLInputElement).placeholder).toBe('default 1');
    await act(async () => {
      document.dispatchEvent(new KeyboardEvent('keydown', { key: 'Escape', bubbles: true }));
    });
    expect(byId('chat-settings')).toBeNull();
    await type('x');
    await click('chat-send');
    await waitFor(() => calls.some((c) => c.method === 'POST'), 'the request');
    expect(calls.find((c) => c.method === 'POST')!.body).toMatchObject({
      top_k: 40,
      min_p: 0.05,
      repetition_penalty: 1.1,
      chat_template_kwargs: { enable_thinking: false },
    });
  });
});

describe('copying', () => {
  it('gives each code block a Copy button that copies its code and says Copied', async () => {
    const writeText = vi.fn(() => Promise.resolve());
    Object.defineProperty(navigator, 'clipboard', { value: { writeText }, configurable: true });
    try {
      await mount({ 'POST /v1/chat/completions': () => replyOnce('Here:\n\n```js\nconsole.log(1);\n```\n') });
      await type('code please');
      await click('chat-send');
      await waitFor(() => byId('message-assistant')?.dataset.streaming === 'false' && !!byId('code-copy'), 'the code block');
      await click('code-copy');
      await settle();
      expect(writeText).toHaveBeenCalledWith('console.log(1);\n');
      expect(byId('code-copy')!.textContent).toBe('Copied');
      await click('message-copy');
      await settle();
      expect(byId('message-copy')!.textContent).toBe('Copied');
    } finally {
      delete (navigator as { clipboard?: unknown }).clipboard;
    }
  });

  it('highlights the code, copies it as plain text, and Copied goes by itself (a second copy restarts its time)', async () => {
    const { COPIED_MS } = await import('../src/views/chat/message');
    const writeText = vi.fn(() => Promise.resolve());
    Object.defineProperty(navigator, 'clipboard', { value: { writeText }, configurable: true });
    try {
      await mount({ 'POST /v1/chat/completions': () => replyOnce('```python\ndef f(x):\n    return "x"\n```\n') });
      await type('code please');
      await click('chat-send');
      await waitFor(() => byId('message-assistant')?.dataset.streaming === 'false' && !!byId('code-copy'), 'the code block');
      expect(q('[data-testid="message-content"] pre code span[class^="hljs-"]')).not.toBeNull();
      vi.useFakeTimers();
      try {
        const copied = async (id: string) => {
          await click(id);
          await act(async () => {
            await Promise.resolve();
          });
        };
        const wait = (ms: number) =>
          act(async () => {
            vi.advanceTimersByTime(ms);
          });
        await copied('code-copy');
        expect(writeText).toHaveBeenCalledWith('def f(x):\n    return "x"\n');
        expect(byId('code-copy')!.textContent).toBe('Copied');
        await wait(COPIED_MS - 100);
        await copied('code-copy');
        await wait(200);
        expect(byId('code-copy')!.textContent).toBe('Copied');
        await wait(COPIED_MS);
        expect(byId('code-copy')!.textContent).toBe('Copy');
        await copied('message-copy');
        expect(byId('message-copy')!.textContent).toBe('Copied');
        await wait(COPIED_MS + 1);
        expect(byId('message-copy')!.textContent).toBe('Copy');
      } finally {
        vi.useRealTimers();
      }
    } finally {
      delete (navigator as { clipboard?: unknown }).clipboard;
    }
  });
});

describe('keys and the system prompt', () => {
  it('Escape stops a reply, Ctrl+Shift+M and / focus the picker and the input, Ctrl+Shift+O starts a new chat, and a system prompt shows in the header', async () => {
    const stream = controlledStream();
    const { calls } = await mount({ 'POST /v1/chat/completions': () => stream.response });
    await click('chat-settings-toggle');
    const system = byId('setting-system') as HTMLTextAreaElement;
    await act(async () => {
      system.value = 'Answer in French.';
      system.dispatchEvent(new Event('input', { bubbles: true }));
    });
    const press = (init: KeyboardEventInit) =>
      act(async () => {
        document.dispatchEvent(new KeyboardEvent('keydown', { bubbles: true, ...init }));
      });
    await press({ key: 'Escape' });
    expect(byId('chat-settings')).toBeNull();
    expect(byId('chat-system-indicator')!.title).toBe('System prompt: Answer in French.');
    await type('Bonjour');
    await click('chat-send');
    stream.content('Salut');
    await waitFor(() => byId('message-content')?.textContent?.trim() === 'Salut', 'the reply');
    await press({ key: 'Escape' });
    await waitFor(() => byId('message-assistant')!.dataset.streaming === 'false', 'the stop');
    expect(calls[0]!.signal!.aborted).toBe(true);
    await press({ key: 'M', ctrlKey: true, shiftKey: true });
    expect(document.activeElement).toBe(byId('chat-model-picker'));
    await press({ key: '/' });
    expect(document.activeElement).toBe(byId('chat-input'));
    await press({ key: 'O', ctrlKey: true, shiftKey: true });
    expect(all('message-user')).toHaveLength(0);
    expect(byId('chat-system-indicator')).toBeNull();
  });
});

describe('keyboard shortcuts in the chat', () => {
  const press = (init: KeyboardEventInit, target: EventTarget = document.body) =>
    act(async () => {
      target.dispatchEvent(new KeyboardEvent('keydown', { bubbles: true, cancelable: true, ...init }));
    });

  it('lists every shortcut behind ? (the key or the button); Escape or a click outside closes the list, not the reply', async () => {
    const { SHORTCUTS } = await import('../src/keys');
    const stream = controlledStream();
    const { calls } = await mount({ 'POST /v1/chat/completions': () => stream.response });
    await press({ key: '?', shiftKey: true });
    expect(all('shortcut').map((el) => el.querySelector('dd')!.textContent)).toEqual(SHORTCUTS.map((s) => s.what));
    expect(byId('shortcuts-toggle')!.getAttribute('aria-expanded')).toBe('true');
    await act(async () => {
      byId('message-list')!.dispatchEvent(new MouseEvent('mousedown', { bubbles: true }));
    });
    expect(byId('shortcuts-help')).toBeNull();

    await type('Hi');
    await click('chat-send');
    stream.content('Hel');
    await waitFor(() => byId('message-content')?.textContent?.trim() === 'Hel', 'the reply');
    await click('shortcuts-toggle');
    expect(byId('shortcuts-help')).not.toBeNull();
    await press({ key: 'Escape' });
    expect(byId('shortcuts-help')).toBeNull();
    expect(calls[0]!.signal!.aborted).toBe(false);
    await press({ key: 'Escape' });
    await waitFor(() => byId('message-assistant')!.dataset.streaming === 'false', 'the stop');
    expect(calls[0]!.signal!.aborted).toBe(true);
  });

  it('opens the model list with its shortcut where the browser can', async () => {
    const showPicker = vi.fn();
    await mount({});
    (byId('chat-model-picker') as HTMLSelectElement & { showPicker?: () => void }).showPicker = showPicker;
    await press({ key: 'M', ctrlKey: true, shiftKey: true });
    expect(document.activeElement).toBe(byId('chat-model-picker'));
    expect(showPicker).toHaveBeenCalledTimes(1);
  });

  it('on macOS takes Cmd, and says so in the titles', async () => {
    Object.defineProperty(navigator, 'platform', { value: 'MacIntel', configurable: true });
    try {
      await mount({});
      for (const id of ['new-chat', 'chat-model-picker', 'chat-settings-toggle']) {
        expect(byId(id)!.title, id).toContain('⌘');
        expect(byId(id)!.title, id).not.toContain('Ctrl');
      }
      await press({ key: 'S', ctrlKey: true, shiftKey: true });
      expect(byId('chat-settings')).toBeNull();
      await press({ key: 'S', metaKey: true, shiftKey: true });
      expect(byId('chat-settings')).not.toBeNull();
      await click('shortcuts-toggle');
      // One popover at a time.
      expect(byId('chat-settings')).toBeNull();
      expect(all('shortcut').some((el) => el.textContent!.includes('⌘'))).toBe(true);
    } finally {
      delete (navigator as { platform?: string }).platform;
    }
  });
});

describe('regenerations', () => {
  it('keeps earlier replies as versions to switch between, and saves the choice', async () => {
    let n = 0;
    const { store } = await mount({ 'POST /v1/chat/completions': () => replyOnce(`Reply ${++n}.`) });
    const done = (text: string) => () => byId('message-content')?.textContent?.trim() === text && !byId('chat-stop');
    await type('Hi');
    await click('chat-send');
    await waitFor(done('Reply 1.'), 'the first reply');
    expect(byId('message-versions')).toBeNull();
    await click('chat-regenerate');
    await waitFor(done('Reply 2.'), 'the second reply');
    await click('chat-regenerate');
    await waitFor(done('Reply 3.'), 'the third reply');
    expect(byId('message-version')!.textContent).toBe('3 / 3');
    expect(all('message-assistant')).toHaveLength(1);
    await click('message-version-prev');
    expect(byId('message-content')!.textContent!.trim()).toBe('Reply 2.');
    await click('message-version-prev');
    expect(byId('message-content')!.textContent!.trim()).toBe('Reply 1.');
    expect(byId('message-version')!.textContent).toBe('1 / 3');
    expect((byId('message-version-prev') as HTMLButtonElement).disabled).toBe(true);
    await settle();
    const [summary] = await store.list();
    const saved = await store.load(summary!.id);
    expect(saved!.messages[1]!.content).toBe('Reply 1.');
    expect(saved!.messages[1]!.versions!.map((v) => v.content)).toEqual(['Reply 2.', 'Reply 3.']);
    // The history sent next is the version shown.
    await click('message-version-next');
    expect(byId('message-content')!.textContent!.trim()).toBe('Reply 2.');
  });
});
