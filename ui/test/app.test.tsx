import { render } from 'preact';
import { act } from 'preact/test-utils';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { Api } from '../src/api';
import { App } from '../src/app';
import { MemoryStore } from '../src/storage';
import { json, mockFetch, modelStatus, statsSnapshot } from './helpers';

vi.mock('../src/components/chart', () => ({ TokChart: () => <div data-testid="panel-chart" /> }));

let root: HTMLElement | null = null;
const realMatchMedia = window.matchMedia;
afterEach(() => {
  if (root) {
    act(() => render(null, root!));
    root.remove();
    root = null;
  }
  window.matchMedia = realMatchMedia;
  delete document.documentElement.dataset.theme;
  history.replaceState(null, '', '#/chat');
});

describe('the window at 720 px', () => {
  it('keeps New chat and the list; the Stats drawer starts closed, opens with the toggle and closes with Escape', async () => {
    // A narrow window, as `(max-width: 980px)` reports it.
    window.matchMedia = ((query: string) => ({ ...realMatchMedia(query), matches: query.includes('max-width: 980px') })) as typeof window.matchMedia;
    const { fetch } = mockFetch({
      'GET /api/health': () => json({ status: 'ok', version: 'test', uptime_s: 1, models_loaded: [], api_key_required: false, backend: 'cpu' }),
      'GET /v1/models': () => json({ object: 'list', data: [] }),
      'GET /api/models': () => json({ models: [] }),
      'GET /api/stats': () => json(statsSnapshot()),
    });
    root = document.createElement('div');
    document.body.appendChild(root);
    act(() => render(<App client={new Api('', fetch, null)} store={new MemoryStore()} />, root!));
    await act(async () => {
      await new Promise((r) => setTimeout(r, 30));
    });
    const byId = (id: string) => root!.querySelector(`[data-testid="${id}"]`) as HTMLElement | null;
    expect(byId('new-chat')).not.toBeNull();
    expect(byId('conversation-list')).not.toBeNull();
    expect(byId('live-panel')).toBeNull();
    await act(async () => byId('panel-toggle')!.click());
    expect(byId('live-panel')).not.toBeNull();
    await act(async () => {
      document.body.dispatchEvent(new KeyboardEvent('keydown', { key: 'Escape', bubbles: true }));
    });
    expect(byId('live-panel')).toBeNull();
  });
});

describe('settings in the window', () => {
  it("apply the saved theme at start, open from the rail, and give new chats their policy and the model's prompt", async () => {
    const settings = {
      settings: {
        config_path: '/c/models.toml',
        models_dir: '/c/models',
        conversations_dir: '/c/conversations',
        default_model: 'tandem-tiny',
        server: { port: 11435, expose: false, api_key_set: false },
        ui: { theme: 'dark', context_policy: 'stop' },
      },
      restart_needed: false,
    };
    const { fetch, calls } = mockFetch({
      'GET /api/health': () => json({ status: 'ok', version: 'test', uptime_s: 1, models_loaded: [], api_key_required: false, backend: 'cpu' }),
      'GET /v1/models': () => json({ object: 'list', data: [{ id: 'tandem-tiny', object: 'model', created: 0, owned_by: 'tandem' }] }),
      'GET /api/models': () => json({ models: [modelStatus({ system_prompt: 'Be terse.' })] }),
      'GET /api/stats': () => json(statsSnapshot()),
      'GET /api/settings': () => json(settings),
      'GET /api/server': () => json({ url: 'http://127.0.0.1:11435', listening: '127.0.0.1:11435', exposed: false, api_key_required: false, uptime_s: 5, requests_served: 3, restart_needed: false }),
      'GET /api/server/requests': () => json({ requests: [] }),
    });
    root = document.createElement('div');
    document.body.appendChild(root);
    act(() => render(<App client={new Api('', fetch, null)} store={new MemoryStore()} />, root!));
    await act(async () => {
      await new Promise((r) => setTimeout(r, 50));
    });
    const byId = (id: string) => root!.querySelector(`[data-testid="${id}"]`) as HTMLElement | null;
    expect(document.documentElement.dataset.theme).toBe('dark');
    // The first chat, opened before the settings and models were read, takes them.
    expect(byId('chat-system-indicator')!.title).toBe('System prompt: Be terse.');
    await act(async () => byId('chat-settings-toggle')!.click());
    expect((byId('setting-context-policy') as HTMLSelectElement).value).toBe('stop');

    // Settings is read from the engine only while shown.
    expect(calls.some((c) => c.url === '/api/server/requests')).toBe(false);
    await act(async () => byId('nav-settings')!.click());
    expect(location.hash).toBe('#/settings');
    expect(root.querySelector('[data-view="settings"]')!.hasAttribute('hidden')).toBe(false);
    expect((byId('settings-theme') as HTMLSelectElement).value).toBe('dark');
    await act(async () => {
      await new Promise((r) => setTimeout(r, 30));
    });
    expect(byId('settings-request-log-empty')).not.toBeNull();
  });
});
