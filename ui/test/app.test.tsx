import { render } from 'preact';
import { act } from 'preact/test-utils';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { Api } from '../src/api';
import { App } from '../src/app';
import { MemoryStore } from '../src/storage';
import { json, mockFetch, statsSnapshot } from './helpers';

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
