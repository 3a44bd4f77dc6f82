// Conversation tools: rename, search, undo a delete, export / import, edit a message and ask again.
import { render } from 'preact';
import { act } from 'preact/test-utils';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { Api } from '../src/api';
import { dismiss, ErrorBanner } from '../src/components/banner';
import type { Conversation } from '../src/conversation';
import type { OpenAIModel } from '../src/generated';
import { LiveFeed } from '../src/live';
import { MemoryStore } from '../src/storage';
import { fileName, fromJson, toJson, toMarkdown } from '../src/transfer';
import { COPIED_MS } from '../src/views/chat/message';
import { ChatView } from '../src/views/chat/view';
import { chunkOf, mockFetch, modelStatus, sse, settle, waitFor } from './helpers';

vi.mock('../src/components/chart', () => ({ TokChart: () => <div data-testid="panel-chart" /> }));

const MODELS: OpenAIModel[] = [{ id: 'tandem-tiny', object: 'model', created: 0, owned_by: 'tandem' }];

function chat(id: string, title: string, updated: number, extra: Partial<Conversation> = {}): Conversation {
  return {
    id,
    title,
    created: 1,
    updated,
    model: 'tandem-tiny',
    sampling: {},
    messages: [
      { id: `${id}-u`, role: 'user', content: `Question of ${title}`, created: 1 },
      { id: `${id}-a`, role: 'assistant', content: '<think>hmm</think>Answer with `code`.', model: 'tandem-tiny', created: 2 },
    ],
    ...extra,
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
const q = (sel: string) => root!.querySelector(sel) as HTMLElement | null;
const byId = (id: string) => q(`[data-testid="${id}"]`);
const all = (id: string) => [...root!.querySelectorAll(`[data-testid="${id}"]`)] as HTMLElement[];
const titles = () => all('conversation-item').map((e) => e.querySelector('.conversation-open')?.textContent);
const click = (el: HTMLElement | null) =>
  act(async () => {
    el!.click();
  });
async function input(el: HTMLElement | null, value: string) {
  await act(async () => {
    (el as HTMLInputElement).value = value;
    el!.dispatchEvent(new Event('input', { bubbles: true }));
  });
}
async function key(el: HTMLElement | null, k: string) {
  await act(async () => {
    el!.dispatchEvent(new KeyboardEvent('keydown', { key: k, bubbles: true, cancelable: true }));
  });
}

async function mount(store: MemoryStore, routes: Parameters<typeof mockFetch>[0] = {}) {
  const mock = mockFetch(routes);
  root = document.createElement('div');
  document.body.appendChild(root);
  act(() =>
    render(
      <>
        <ErrorBanner />
        <ChatView store={store} models={MODELS} adminModels={[modelStatus()]} client={new Api('', mock.fetch, null)} feed={new LiveFeed()} />
      </>,
      root!,
    ),
  );
  await waitFor(() => all('conversation-item').length > 0 || store === null, 'the list');
  return mock;
}

async function twoChats() {
  const store = new MemoryStore();
  await store.save(chat('a', 'Bicycles in the hills', 20));
  await store.save(chat('b', 'Lighthouse story', 10));
  return store;
}

describe('conversation tools', () => {
  it('renames a chat, and the name is saved', async () => {
    const store = await twoChats();
    await mount(store);
    await click(q('[data-conversation-id="b"] [data-testid="conversation-rename"]'));
    const field = byId('conversation-rename-input');
    await input(field, 'The keeper');
    await key(field, 'Enter');
    await waitFor(() => titles().includes('The keeper'), 'the new title');
    expect((await store.load('b'))!.title).toBe('The keeper');
    // Escape leaves a title as it was.
    await click(q('[data-conversation-id="a"] [data-testid="conversation-rename"]'));
    await input(byId('conversation-rename-input'), 'Nope');
    await key(byId('conversation-rename-input'), 'Escape');
    expect(titles()).toContain('Bicycles in the hills');
  });

  it('filters the list by title, then by the messages', async () => {
    await mount(await twoChats());
    await input(byId('conversation-search'), 'light');
    expect(titles()).toEqual(['Lighthouse story']);
    await input(byId('conversation-search'), 'zzz');
    expect(titles()).toEqual([]);
    await waitFor(() => byId('conversation-list')!.textContent!.includes('No chat matches'), 'the full search');
    // The messages are searched too.
    await input(byId('conversation-search'), 'question of bicycles');
    await waitFor(() => titles().length === 1, 'a match in the messages');
    expect(titles()).toEqual(['Bicycles in the hills']);
    await input(byId('conversation-search'), '');
    expect(titles()).toHaveLength(2);
  });

  it('undoes a delete', async () => {
    const store = await twoChats();
    await mount(store);
    await click(q('[data-conversation-id="a"] [data-testid="conversation-delete"]'));
    await waitFor(() => !!byId('conversation-undo'), 'the undo');
    expect(await store.load('a')).toBeNull();
    expect(byId('conversation-undo-bar')!.textContent).toContain('Bicycles in the hills');
    await click(byId('conversation-undo'));
    await waitFor(() => titles().includes('Bicycles in the hills'), 'the chat back');
    expect((await store.load('a'))!.messages).toHaveLength(2);
    expect(byId('conversation-undo-bar')).toBeNull();
  });

  it('imports an exported chat as a new one, and refuses a file that is not one', async () => {
    const store = await twoChats();
    await mount(store);
    const file = (text: string, name = 'chat.json') => new File([text], name, { type: 'application/json' });
    const pick = async (f: File) => {
      const el = byId('chat-import-input') as HTMLInputElement;
      Object.defineProperty(el, 'files', { value: [f], configurable: true });
      await act(async () => {
        el.dispatchEvent(new Event('change', { bubbles: true }));
      });
    };
    await pick(file(toJson(chat('a', 'Bicycles in the hills', 5))));
    await settle(50);
    await waitFor(() => all('conversation-item').length === 3, 'the imported chat');
    expect(titles().filter((t) => t === 'Bicycles in the hills')).toHaveLength(2);
    expect((await store.load('a'))!.updated).toBe(20);
    await pick(file('{"title": "x"}', 'bad.json'));
    await waitFor(() => !!byId('error-banner'), 'the error');
    expect(byId('error-message')!.textContent).toBe('Could not import bad.json: the file is not a Tandem conversation (no messages)');
  });

  it('edits a user message and regenerates the reply from it', async () => {
    const store = await twoChats();
    const reply = () =>
      sse([`data: ${JSON.stringify(chunkOf({ content: 'New answer.' }, {}, 'stop'))}\n\n`, 'data: [DONE]\n\n']);
    const { calls } = await mount(store, { 'POST /v1/chat/completions': reply });
    await waitFor(() => all('message-user').length === 1, 'the shown chat');
    await click(byId('message-edit'));
    await input(byId('message-edit-input'), 'A better question');
    await click(byId('message-edit-save'));
    await waitFor(() => byId('message-content')?.textContent?.trim() === 'New answer.' && !byId('chat-stop'), 'the new reply');
    expect(all('message-user').map((m) => m.querySelector('.message-text')?.textContent)).toEqual(['A better question']);
    expect(all('message-assistant')).toHaveLength(1);
    expect(calls.find((c) => c.method === 'POST')!.body).toMatchObject({ messages: [{ role: 'user', content: 'A better question' }] });
    await settle();
    expect((await store.load('a'))!.messages.map((m) => m.content)).toEqual(['A better question', 'New answer.']);
  });
});

describe('export', () => {
  it('writes Markdown to read (answers without their thinking) and JSON that imports back the same', () => {
    const c = chat('a', 'Bicycles: in the hills?', 20, { system: 'Be brief.' });
    c.messages[0]!.images = ['data:image/png;base64,xx'];
    const md = toMarkdown(c);
    expect(md).toContain('# Bicycles: in the hills?');
    expect(md).toContain('## You\n\n_1 image attached_\n\nQuestion of');
    expect(md).toContain('## Assistant (tandem-tiny)\n\nAnswer with `code`.');
    expect(md).not.toContain('hmm');
    expect(md).toContain('## System\n\nBe brief.');
    const back = fromJson(toJson(c));
    expect({ ...back, updated: 0 }).toEqual({ ...c, updated: 0 });
    expect(fromJson(toJson(c), (id) => id === 'a').id).not.toBe('a');
    expect(fileName(c, 'md')).toBe('Bicycles-in-the-hills.md');
    expect(() => fromJson('nope')).toThrow('not JSON');
    expect(() => fromJson('{"messages": [{"role": "robot"}]}')).toThrow('message 1');
  });
});

describe('the context menu', () => {
  it("offers a message's actions instead of the browser's menu, and Escape closes it", async () => {
    const store = await twoChats();
    await mount(store);
    await waitFor(() => all('message-assistant').length === 1, 'the shown chat');
    const menuOn = async (el: HTMLElement) => {
      const ev = new MouseEvent('contextmenu', { bubbles: true, cancelable: true, clientX: 10, clientY: 10 });
      await act(async () => {
        el.dispatchEvent(ev);
      });
      return ev;
    };
    const ev = await menuOn(q('[data-testid="message-assistant"] [data-testid="message-content"]')!);
    expect(ev.defaultPrevented).toBe(true);
    expect(all('context-menu-item').map((b) => b.textContent)).toEqual(['Copy reply', 'Regenerate', 'Delete message']);
    await key(document.body, 'Escape');
    expect(byId('context-menu')).toBeNull();
    // The input keeps the browser's menu.
    expect((await menuOn(byId('chat-input')!)).defaultPrevented).toBe(false);
    await menuOn(byId('message-user')!);
    expect(all('context-menu-item').map((b) => b.textContent)).toEqual(['Copy message', 'Edit message', 'Delete message']);
    await click(all('context-menu-item')[2]!);
    expect(all('message-user')).toHaveLength(0);
    expect(byId('context-menu')).toBeNull();
    await settle();
    expect((await store.load('a'))!.messages.map((m) => m.role)).toEqual(['assistant']);
  });

  const menuAt = async (el: Element) => {
    await act(async () => {
      el.dispatchEvent(new MouseEvent('contextmenu', { bubbles: true, cancelable: true, clientX: 40, clientY: 60 }));
    });
  };
  const item = (label: string) => all('context-menu-item').find((b) => b.textContent === label) ?? null;

  it('says Copied where the menu was, and the word goes by itself', async () => {
    const writeText = vi.fn(() => Promise.resolve());
    Object.defineProperty(navigator, 'clipboard', { value: { writeText }, configurable: true });
    try {
      await mount(await twoChats());
      await waitFor(() => all('message-assistant').length === 1, 'the shown chat');
      await menuAt(q('[data-testid="message-assistant"] [data-testid="message-content"]')!);
      vi.useFakeTimers();
      try {
        await click(item('Copy reply'));
        await act(async () => {
          await Promise.resolve();
        });
        expect(writeText).toHaveBeenCalledWith('Answer with `code`.');
        expect(byId('context-menu')).toBeNull();
        const flash = byId('copy-flash')!;
        expect(flash.textContent).toBe('Copied');
        expect([flash.style.left, flash.style.top]).toEqual(['40px', '60px']);
        await act(async () => {
          vi.advanceTimersByTime(COPIED_MS + 1);
        });
        expect(byId('copy-flash')).toBeNull();
      } finally {
        vi.useRealTimers();
      }
    } finally {
      delete (navigator as { clipboard?: unknown }).clipboard;
    }
  });

  it("says Copy failed when the clipboard refuses, and offers a code block's code", async () => {
    const writeText = vi.fn(() => Promise.reject(new Error('denied')));
    Object.defineProperty(navigator, 'clipboard', { value: { writeText }, configurable: true });
    try {
      const store = new MemoryStore();
      const [question] = chat('c', 'Code', 30).messages;
      await store.save(chat('c', 'Code', 30, { messages: [question!, { id: 'c-a', role: 'assistant', content: 'Run:\n\n```sh\nls -la\n```\n', created: 2 }] }));
      await mount(store);
      await waitFor(() => !!q('[data-testid="message-content"] pre code'), 'the code block');
      await menuAt(q('[data-testid="message-content"] pre code')!);
      expect(all('context-menu-item').map((b) => b.textContent)).toEqual(['Copy code', 'Copy reply', 'Regenerate', 'Delete message']);
      await click(item('Copy code'));
      await waitFor(() => !!byId('copy-flash'), 'the feedback');
      expect(writeText).toHaveBeenCalledWith('ls -la\n');
      expect(byId('copy-flash')!.textContent).toBe('Copy failed');
    } finally {
      delete (navigator as { clipboard?: unknown }).clipboard;
    }
  });

  it('edits a message from the menu, and the arrow keys move between the items', async () => {
    await mount(await twoChats());
    await waitFor(() => all('message-user').length === 1, 'the shown chat');
    await menuAt(byId('message-user')!);
    const items = all('context-menu-item');
    expect(document.activeElement).toBe(items[0]);
    await key(document.activeElement as HTMLElement, 'ArrowDown');
    expect(document.activeElement).toBe(items[1]);
    await key(document.activeElement as HTMLElement, 'ArrowUp');
    await key(document.activeElement as HTMLElement, 'ArrowUp');
    expect(document.activeElement).toBe(items[items.length - 1]);
    await click(item('Edit message'));
    expect(byId('context-menu')).toBeNull();
    expect((byId('message-edit-input') as HTMLTextAreaElement).value).toBe('Question of Bicycles in the hills');
    await click(byId('message-edit-cancel'));
    expect(byId('message-edit-input')).toBeNull();
  });

  it('closes on a click outside it, and Escape closes only the menu, not the reply streaming', async () => {
    const mock = await mount(await twoChats(), { 'POST /v1/chat/completions': () => sse([`data: ${JSON.stringify(chunkOf({ content: 'Going' }))}\n\n`], { hang: true }) });
    await waitFor(() => all('message-assistant').length === 1, 'the shown chat');
    await menuAt(q('[data-testid="message-assistant"] [data-testid="message-content"]')!);
    await act(async () => {
      document.body.dispatchEvent(new MouseEvent('mousedown', { bubbles: true }));
    });
    expect(byId('context-menu')).toBeNull();
    await input(byId('chat-input'), 'More');
    await click(byId('chat-send'));
    await waitFor(() => !!byId('chat-stop') && q('[data-streaming="true"]')?.textContent?.includes('Going') === true, 'the reply streaming');
    await menuAt(byId('message-user')!);
    expect(byId('context-menu')).not.toBeNull();
    await key(document.activeElement as HTMLElement, 'Escape');
    expect(byId('context-menu')).toBeNull();
    expect(byId('chat-stop')).not.toBeNull();
    expect(mock.calls.find((c) => c.method === 'POST')!.signal!.aborted).toBe(false);
    await key(document.body, 'Escape');
    await waitFor(() => !byId('chat-stop'), 'the stop');
  });
});
