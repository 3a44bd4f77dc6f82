// Settings: what GET /api/settings says is shown, each change is the PATCH it should be, the engine's
// refusals are said beside the setting, the server's state and request log are read only while shown; and
// the two places new chats take their defaults from (a model's system prompt, Settings' context policy).
import { render } from 'preact';
import { useState } from 'preact/hooks';
import { act } from 'preact/test-utils';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { Api } from '../src/api';
import { dismiss, ErrorBanner } from '../src/components/banner';
import type { ContextPolicy } from '../src/conversation';
import type { LoggedRequest, ModelStatus, OpenAIModel, ServerInfo, SettingsView } from '../src/generated';
import { LiveFeed } from '../src/live';
import { MemoryStore } from '../src/storage';
import { applyTheme, rememberedTheme } from '../src/theme';
import { ChatView } from '../src/views/chat/view';
import { ModelsView } from '../src/views/models';
import { POLL_MS, SettingsPage } from '../src/views/settings';
import { type Call, json, mockFetch, modelStatus, sse, chunkOf, settle, waitFor } from './helpers';

vi.mock('../src/components/chart', () => ({ TokChart: () => <div data-testid="panel-chart" /> }));

const SETTINGS: SettingsView = {
  settings: {
    config_path: '/home/ada/.tandem/models.toml',
    models_dir: '/home/ada/.tandem/models',
    conversations_dir: '/home/ada/.tandem/conversations',
    default_model: 'tandem-tiny',
    server: { port: 11435, expose: false, api_key_set: false },
    ui: { theme: 'system', context_policy: 'rolling' },
  },
  restart_needed: false,
};

const INFO: ServerInfo = {
  url: 'http://127.0.0.1:11435',
  listening: '127.0.0.1:11435',
  exposed: false,
  api_key_required: false,
  uptime_s: 3725,
  requests_served: 1234,
  restart_needed: false,
};

/** Newest first, as the engine answers. */
const LOG: LoggedRequest[] = [
  { at_ms: Date.UTC(2025, 0, 1, 12, 0, 3), method: 'POST', path: '/v1/chat/completions', status: 500, ms: 2.5 },
  { at_ms: Date.UTC(2025, 0, 1, 12, 0, 2), method: 'GET', path: '/api/models/nope', status: 404, ms: 0.4 },
  { at_ms: Date.UTC(2025, 0, 1, 12, 0, 1), method: 'GET', path: '/api/models', status: 200, ms: 1.25 },
];

/** The PATCH answer: the settings with `patch` applied, as the engine would save them. */
function patched(view: SettingsView, patch: Record<string, unknown>): SettingsView {
  const p = patch as { server?: Record<string, unknown>; ui?: Record<string, unknown> } & Record<string, unknown>;
  const { server, ui, ...top } = p;
  const s = view.settings;
  const nextServer = { ...s.server };
  if (server?.port !== undefined) nextServer.port = server.port as number;
  if (server?.expose !== undefined) nextServer.expose = server.expose as boolean;
  if (server?.api_key !== undefined) nextServer.api_key_set = server.api_key !== '';
  return {
    settings: { ...s, ...top, server: nextServer, ui: { ...s.ui, ...ui } },
    restart_needed: server !== undefined || view.restart_needed,
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
  vi.useRealTimers();
  localStorage.removeItem('tandem.apiKey');
  delete document.documentElement.dataset.theme;
});

const byId = (id: string) => root!.querySelector(`[data-testid="${id}"]`) as HTMLElement | null;
const all = (id: string) => [...root!.querySelectorAll(`[data-testid="${id}"]`)] as HTMLElement[];

async function setValue(id: string, v: string, event = 'input') {
  const el = byId(id) as HTMLInputElement | HTMLSelectElement | HTMLTextAreaElement;
  await act(async () => {
    el.value = v;
    el.dispatchEvent(new Event(event, { bubbles: true }));
  });
}
async function click(id: string) {
  await act(async () => {
    byId(id)!.click();
  });
}
async function submit(id: string) {
  await act(async () => {
    (byId(id)!.closest('form') as HTMLFormElement).requestSubmit();
  });
}

/** The page as the app holds it: the settings it shows are those the last PATCH answered. */
function Harness(props: { client: Api; active: boolean; models: ModelStatus[] }) {
  const [view, setView] = useState<SettingsView>(SETTINGS);
  return <SettingsPage client={props.client} active={props.active} settings={view} loadError={null} models={props.models} onSaved={setView} />;
}

type Routes = Parameters<typeof mockFetch>[0];

/** Mounts Settings (with the error banner, to see that errors are not said twice). */
async function mount(routes: Routes = {}, opts: { active?: boolean } = {}) {
  let saved = SETTINGS;
  const mock = mockFetch({
    'GET /api/server': () => json(INFO),
    'GET /api/server/requests': () => json({ requests: LOG }),
    'PATCH /api/settings': (call) => json((saved = patched(saved, call.body as Record<string, unknown>))),
    ...routes,
  });
  const client = new Api('', mock.fetch, null);
  const models = [modelStatus(), modelStatus({ id: 'other', name: 'other', default: false })];
  root = document.createElement('div');
  document.body.appendChild(root);
  const draw = (active: boolean) =>
    act(() =>
      render(
        <>
          <ErrorBanner />
          <Harness client={client} active={active} models={models} />
        </>,
        root!,
      ),
    );
  draw(opts.active ?? true);
  await settle();
  return { ...mock, draw };
}

const patches = (calls: Call[]) => calls.filter((c) => c.method === 'PATCH').map((c) => c.body);

describe('the Settings page', () => {
  it('shows what GET /api/settings and GET /api/server say', async () => {
    await mount();
    expect((byId('settings-models-dir') as HTMLInputElement).value).toBe('/home/ada/.tandem/models');
    expect((byId('settings-conversations-dir') as HTMLInputElement).value).toBe('/home/ada/.tandem/conversations');
    expect((byId('settings-default-model') as HTMLSelectElement).value).toBe('tandem-tiny');
    expect([...(byId('settings-default-model') as HTMLSelectElement).options].map((o) => o.value)).toEqual(['tandem-tiny', 'other']);
    expect((byId('settings-context-policy') as HTMLSelectElement).value).toBe('rolling');
    expect((byId('settings-theme') as HTMLSelectElement).value).toBe('system');
    expect((byId('settings-port') as HTMLInputElement).value).toBe('11435');
    expect((byId('settings-expose') as HTMLInputElement).checked).toBe(false);
    expect(byId('settings-api-key-state')!.textContent).toContain('No key is set');
    expect(byId('settings-config-path')!.textContent).toContain('/home/ada/.tandem/models.toml');
    expect(byId('settings-server-url')!.textContent).toBe('http://127.0.0.1:11435');
    expect(byId('settings-server-listening')!.textContent).toBe('127.0.0.1:11435');
    expect(byId('settings-server-exposed')!.dataset.exposed).toBe('false');
    expect(byId('settings-server-key-required')!.textContent).toBe('not required');
    expect(byId('settings-server-uptime')!.textContent).toBe('1 h 2 min');
    expect(byId('settings-server-served')!.textContent).toBe('1,234');
    expect(byId('settings-restart-notice')).toBeNull();
    // Without the desktop app there is no folder dialog: no Browse….
    expect(byId('settings-models-dir-browse')).toBeNull();
  });

  it('labels every control', async () => {
    await mount();
    const controls = [...root!.querySelectorAll('[data-testid="settings-page"] input, [data-testid="settings-page"] select')];
    expect(controls.length).toBeGreaterThanOrEqual(8);
    for (const el of controls) expect((el as HTMLInputElement).labels?.length ?? 0, el.getAttribute('data-testid') ?? '').toBeGreaterThan(0);
  });

  it('saves the theme as {"ui":{"theme":"dark"}} and applies it to the whole document at once', async () => {
    const { calls } = await mount();
    await setValue('settings-theme', 'dark', 'change');
    expect(document.documentElement.dataset.theme).toBe('dark');
    await waitFor(() => patches(calls).length === 1, 'the PATCH');
    expect(patches(calls)[0]).toEqual({ ui: { theme: 'dark' } });
    await settle();
    expect((byId('settings-theme') as HTMLSelectElement).value).toBe('dark');
    expect(document.documentElement.dataset.theme).toBe('dark');
  });

  it('puts the theme back and says why when it cannot be saved', async () => {
    applyTheme('light');
    await mount({
      'PATCH /api/settings': () => json({ error: { message: 'models.toml: Permission denied (os error 13)', type: 'invalid_request_error', code: 'settings_not_saved' } }, 400),
    });
    await setValue('settings-theme', 'dark', 'change');
    await waitFor(() => !!byId('settings-theme-error'), 'the error');
    expect(byId('settings-theme-error')!.textContent).toBe('models.toml: Permission denied (os error 13)');
    expect((byId('settings-theme') as HTMLSelectElement).value).toBe('system');
    // `system` in jsdom: its matchMedia says light.
    expect(document.documentElement.dataset.theme).toBe('light');
  });

  it("shows a 400's message beside the setting that failed, once", async () => {
    const message = 'models_dir = "/root/models": cannot create it (Permission denied)';
    const { calls } = await mount({
      'PATCH /api/settings': () => json({ error: { message, type: 'invalid_request_error', code: 'invalid_setting' } }, 400),
    });
    expect((byId('settings-models-dir-save') as HTMLButtonElement).disabled).toBe(true);
    await setValue('settings-models-dir', '/root/models');
    await click('settings-models-dir-save');
    await waitFor(() => !!byId('settings-models-dir-error'), 'the error');
    expect(patches(calls)).toEqual([{ models_dir: '/root/models' }]);
    expect(byId('settings-models-dir-error')!.textContent).toBe(message);
    expect(root!.textContent!.split(message).length - 1).toBe(1);
    expect(byId('error-banner')).toBeNull();
    // The typed path stays, to correct it.
    expect((byId('settings-models-dir') as HTMLInputElement).value).toBe('/root/models');
  });

  it('saves the policy of new chats and the default model as they are chosen', async () => {
    const { calls } = await mount();
    await setValue('settings-context-policy', 'middle', 'change');
    await waitFor(() => patches(calls).length === 1, 'the first PATCH');
    await setValue('settings-default-model', 'other', 'change');
    await waitFor(() => patches(calls).length === 2, 'the second PATCH');
    expect(patches(calls)).toEqual([{ ui: { context_policy: 'middle' } }, { default_model: 'other' }]);
    await settle();
    expect((byId('settings-context-policy') as HTMLSelectElement).value).toBe('middle');
    expect((byId('settings-default-model') as HTMLSelectElement).value).toBe('other');
  });

  it('says a changed port applies when Tandem restarts', async () => {
    const { calls } = await mount();
    expect(byId('settings-restart-notice')).toBeNull();
    await setValue('settings-port', '11500');
    await click('settings-server-save');
    await waitFor(() => !!byId('settings-restart-notice'), 'the notice');
    expect(patches(calls)).toEqual([{ server: { port: 11500 } }]);
    expect(byId('settings-restart-notice')!.textContent).toContain('Saved; applies when Tandem restarts');
    expect((byId('settings-port') as HTMLInputElement).value).toBe('11500');
  });

  it('refuses to allow other devices without an API key, sending nothing', async () => {
    const { calls } = await mount();
    await click('settings-expose');
    expect((byId('settings-expose') as HTMLInputElement).checked).toBe(true);
    await submit('settings-server-save');
    await settle();
    expect(patches(calls)).toEqual([]);
    expect(byId('settings-server-error')!.textContent).toMatch(/API key/);

    // With a key it goes, and this browser keeps the key to send it.
    await setValue('settings-api-key', 's3cret-key');
    await click('settings-server-save');
    await waitFor(() => patches(calls).length === 1, 'the PATCH');
    expect(patches(calls)[0]).toEqual({ server: { expose: true, api_key: 's3cret-key' } });
    await settle();
    expect(byId('settings-server-error')).toBeNull();
    expect(byId('settings-api-key-state')!.textContent).toContain('A key is set');
    expect((byId('settings-api-key') as HTMLInputElement).value).toBe('');
    expect(localStorage.getItem('tandem.apiKey')).toBe('s3cret-key');
  });

  it("says the engine's refusal of a key, and removes a key with an empty one", async () => {
    const message = 'server.api_key = (hidden): expected starts or ends with a space';
    let refuse = true;
    const { calls } = await mount({
      'PATCH /api/settings': (call) =>
        refuse
          ? json({ error: { message, type: 'invalid_request_error', code: 'invalid_setting' } }, 400)
          : json(patched({ ...SETTINGS, settings: { ...SETTINGS.settings, server: { ...SETTINGS.settings.server, api_key_set: true } } }, call.body as Record<string, unknown>)),
    });
    await setValue('settings-api-key', ' spaced ');
    await click('settings-server-save');
    await waitFor(() => !!byId('settings-server-error'), 'the error');
    expect(byId('settings-server-error')!.textContent).toBe(message);
    expect(byId('error-banner')).toBeNull();

    refuse = false;
    await setValue('settings-api-key', 'fine');
    await click('settings-server-save');
    await waitFor(() => !!byId('settings-api-key-remove'), 'the key set');
    localStorage.setItem('tandem.apiKey', 'fine');
    await click('settings-api-key-remove');
    expect(byId('settings-api-key-state')!.textContent).toContain('removed when you save');
    await click('settings-server-save');
    await waitFor(() => patches(calls).length === 3, 'the removal');
    expect(patches(calls)[2]).toEqual({ server: { api_key: '' } });
    await settle();
    expect(byId('settings-api-key-state')!.textContent).toContain('No key is set');
    expect(localStorage.getItem('tandem.apiKey')).toBeNull();
  });

  it('lists the requests newest first and marks the failed ones', async () => {
    await mount();
    const rows = all('settings-request-row');
    expect(rows.map((r) => r.textContent)).toEqual([
      expect.stringContaining('/v1/chat/completions'),
      expect.stringContaining('/api/models/nope'),
      expect.stringContaining('/api/models'),
    ]);
    expect(rows.map((r) => r.querySelector('[data-testid="settings-request-status"]')!.textContent)).toEqual(['500', '404', '200']);
    expect(rows.map((r) => r.dataset.failed)).toEqual(['true', 'true', 'false']);
    expect(rows.map((r) => r.classList.contains('failed'))).toEqual([true, true, false]);
    expect(rows[0]!.textContent).toContain('POST');
  });

  it('reads the server and its log every 2 s only while shown', async () => {
    const { calls, draw } = await mount({}, { active: false });
    vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout'] });
    const reads = () => calls.filter((c) => c.url === '/api/server/requests').length;
    await act(async () => {
      await vi.advanceTimersByTimeAsync(3 * POLL_MS);
    });
    expect(reads()).toBe(0);
    expect(byId('settings-request-log')).toBeNull();

    draw(true);
    await act(async () => {
      await vi.advanceTimersByTimeAsync(10);
    });
    expect(reads()).toBe(1);
    expect(all('settings-request-row')).toHaveLength(3);
    await act(async () => {
      await vi.advanceTimersByTimeAsync(POLL_MS);
    });
    expect(reads()).toBe(2);

    draw(false);
    await act(async () => {
      await vi.advanceTimersByTimeAsync(3 * POLL_MS);
    });
    expect(reads()).toBe(2);
  });

  it('copies the address and says Copied', async () => {
    const writeText = vi.fn(() => Promise.resolve());
    Object.defineProperty(navigator, 'clipboard', { value: { writeText }, configurable: true });
    try {
      await mount();
      await click('settings-server-copy');
      await settle();
      expect(writeText).toHaveBeenCalledWith('http://127.0.0.1:11435');
      expect(byId('settings-server-copy')!.textContent).toBe('Copied');
    } finally {
      delete (navigator as { clipboard?: unknown }).clipboard;
    }
  });

  it("in the desktop app, Browse… fills a folder from the shell's dialog", async () => {
    (globalThis as { __TANDEM_SHELL__?: unknown }).__TANDEM_SHELL__ = { folderDialog: { header: 'x-tandem-shell', token: 't0k' } };
    try {
      const { calls } = await mount({ 'POST /api/folders/pick': () => json({ path: '/Volumes/chats', model_folder: false }) });
      await click('settings-conversations-dir-browse');
      await waitFor(() => (byId('settings-conversations-dir') as HTMLInputElement).value === '/Volumes/chats', 'the picked folder');
      await click('settings-conversations-dir-save');
      await waitFor(() => patches(calls).length === 1, 'the PATCH');
      expect(patches(calls)[0]).toEqual({ conversations_dir: '/Volumes/chats' });
    } finally {
      delete (globalThis as { __TANDEM_SHELL__?: unknown }).__TANDEM_SHELL__;
    }
  });
});

describe('the theme', () => {
  it('follows the system while it is `system`, and stops when one is chosen', () => {
    const listeners = new Set<() => void>();
    const query = {
      matches: false,
      addEventListener: (_: string, f: () => void) => listeners.add(f),
      removeEventListener: (_: string, f: () => void) => listeners.delete(f),
    };
    const real = window.matchMedia;
    window.matchMedia = (() => query) as unknown as typeof window.matchMedia;
    try {
      const el = document.createElement('html');
      applyTheme('system', el);
      expect(el.dataset.theme).toBe('light');
      query.matches = true;
      for (const f of listeners) f();
      expect(el.dataset.theme).toBe('dark');
      applyTheme('light', el);
      expect(el.dataset.theme).toBe('light');
      expect(listeners.size).toBe(0);
    } finally {
      window.matchMedia = real;
    }
  });
});

describe("a model's system prompt", () => {
  it('is saved from the Models view, and an empty one removes it', async () => {
    let prompt: string | null = null;
    let reloads = 0;
    const mock = mockFetch({
      'PATCH /api/models/tandem-tiny/settings': (call) => {
        const p = (call.body as { system_prompt: string }).system_prompt;
        prompt = p === '' ? null : p;
        return json(modelStatus({ system_prompt: prompt }));
      },
    });
    const client = new Api('', mock.fetch, null);
    root = document.createElement('div');
    document.body.appendChild(root);
    const draw = () =>
      render(
        <ModelsView
          models={[modelStatus({ system_prompt: prompt })]}
          loading={false}
          reload={async () => {
            reloads++;
            draw();
          }}
          client={client}
          onConvert={() => {}}
        />,
        root!,
      );
    act(draw);
    expect((byId('model-system-prompt') as HTMLTextAreaElement).value).toBe('');
    expect((byId('model-system-prompt-save') as HTMLButtonElement).disabled).toBe(true);
    await setValue('model-system-prompt', 'Answer in French.');
    await click('model-system-prompt-save');
    await waitFor(() => reloads === 1, 'the reload');
    expect(mock.calls.map((c) => c.body)).toEqual([{ system_prompt: 'Answer in French.' }]);
    await settle();
    expect((byId('model-system-prompt') as HTMLTextAreaElement).value).toBe('Answer in French.');
    expect((byId('model-system-prompt-save') as HTMLButtonElement).disabled).toBe(true);

    await setValue('model-system-prompt', '');
    await click('model-system-prompt-save');
    await waitFor(() => reloads === 2, 'the second reload');
    expect(mock.calls[1]!.body).toEqual({ system_prompt: '' });
    expect(prompt).toBeNull();
  });

  it('says why it was not saved beside it', async () => {
    const message = 'system_prompt: too long (at most 100000 characters)';
    const mock = mockFetch({
      'PATCH /api/models/tandem-tiny/settings': () => json({ error: { message, type: 'invalid_request_error', code: 'invalid_setting' } }, 400),
    });
    root = document.createElement('div');
    document.body.appendChild(root);
    act(() =>
      render(
        <ModelsView models={[modelStatus()]} loading={false} reload={async () => {}} client={new Api('', mock.fetch, null)} onConvert={() => {}} />,
        root!,
      ),
    );
    await setValue('model-system-prompt', 'x');
    await click('model-system-prompt-save');
    await waitFor(() => !!byId('model-system-prompt-error'), 'the error');
    expect(byId('model-system-prompt-error')!.textContent).toBe(message);
    expect((byId('model-system-prompt') as HTMLTextAreaElement).value).toBe('x');
  });
});

describe('a new chat', () => {
  const MODELS: OpenAIModel[] = [
    { id: 'tandem-tiny', object: 'model', created: 0, owned_by: 'tandem' },
    { id: 'other', object: 'model', created: 0, owned_by: 'tandem' },
  ];
  const FRENCH = modelStatus({ system_prompt: 'Answer in French.' });
  const OTHER = modelStatus({ id: 'other', name: 'other', default: false, system_prompt: null });

  async function mountChat(admin: ModelStatus[], policy: ContextPolicy | undefined) {
    const mock = mockFetch({
      'POST /v1/chat/completions': () => sse([`data: ${JSON.stringify(chunkOf({ content: 'Bonjour' }, {}, 'stop'))}\n\n`, 'data: [DONE]\n\n']),
    });
    const client = new Api('', mock.fetch, null);
    const store = new MemoryStore();
    const feed = new LiveFeed();
    root = document.createElement('div');
    document.body.appendChild(root);
    const draw = (a: ModelStatus[], p: ContextPolicy | undefined) =>
      act(() => render(<ChatView store={store} models={MODELS} adminModels={a} client={client} feed={feed} contextPolicy={p} />, root!));
    draw(admin, policy);
    await settle();
    return { ...mock, draw };
  }

  const policyShown = async () => {
    await click('chat-settings-toggle');
    const v = (byId('setting-context-policy') as HTMLSelectElement).value;
    await click('chat-settings-toggle');
    return v;
  };

  it("starts with its model's system prompt and the settings' context policy", async () => {
    const { calls } = await mountChat([FRENCH, OTHER], 'middle');
    await click('new-chat');
    expect(byId('chat-system-indicator')!.title).toBe('System prompt: Answer in French.');
    expect(await policyShown()).toBe('middle');
    await act(async () => {
      const input = byId('chat-input') as HTMLTextAreaElement;
      input.value = 'Hello';
      input.dispatchEvent(new Event('input', { bubbles: true }));
    });
    await click('chat-send');
    await waitFor(() => calls.some((c) => c.method === 'POST'), 'the request');
    expect((calls.find((c) => c.method === 'POST')!.body as { messages: unknown[] }).messages).toEqual([
      { role: 'system', content: 'Answer in French.' },
      { role: 'user', content: 'Hello' },
    ]);
  });

  it('takes the defaults when they arrive after it was opened, and those of another model chosen before writing', async () => {
    const { draw } = await mountChat([], undefined);
    expect(byId('chat-system-indicator')).toBeNull();
    draw([FRENCH, OTHER], 'stop');
    await settle();
    expect(byId('chat-system-indicator')!.title).toBe('System prompt: Answer in French.');
    expect(await policyShown()).toBe('stop');
    await setValue('chat-model-picker', 'other', 'change');
    expect(byId('chat-system-indicator')).toBeNull();
    await setValue('chat-model-picker', 'tandem-tiny', 'change');
    expect(byId('chat-system-indicator')).not.toBeNull();
  });

  it('keeps what the person changed in it', async () => {
    const { draw } = await mountChat([FRENCH, OTHER], 'middle');
    await click('new-chat');
    await click('chat-settings-toggle');
    await setValue('setting-system', 'Be brief.');
    await setValue('setting-context-policy', 'rolling', 'change');
    await click('chat-settings-toggle');
    draw([modelStatus({ system_prompt: 'Answer in German.' }), OTHER], 'stop');
    await settle();
    expect(byId('chat-system-indicator')!.title).toBe('System prompt: Be brief.');
    expect(await policyShown()).toBe('rolling');
  });
});

describe('the remembered theme', () => {
  it('is the last one applied, so the next start shows it before the engine answers', () => {
    localStorage.removeItem('tandem.theme');
    expect(rememberedTheme()).toBe('system');
    applyTheme('dark');
    expect(rememberedTheme()).toBe('dark');
    applyTheme('light');
    expect(rememberedTheme()).toBe('light');
    localStorage.setItem('tandem.theme', 'purple');
    expect(rememberedTheme()).toBe('system');
    applyTheme('system');
  });
});
