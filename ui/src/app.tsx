// The window: a narrow rail to move between Chat, Models, Download, Convert and Settings; every view stays
// mounted so a streaming reply or a running conversion goes on while another view is shown.

import { useCallback, useEffect, useMemo, useState } from 'preact/hooks';
import { api as defaultApi, type Api, errorMessage } from './api';
import { dismissConnection, ErrorBanner, showError } from './components/banner';
import { live } from './live';
import { subscribeFolderDrops } from './shell';
import { type ConversationStore, defaultStore } from './storage';
import type { ModelStatus, OpenAIModel, SettingsView } from './generated';
import { applyTheme } from './theme';
import { ChatView } from './views/chat/view';
import { ConvertView } from './views/convert';
import { DownloadPage } from './views/download';
import { ModelsView } from './views/models';
import { SettingsPage } from './views/settings';

export type View = 'chat' | 'models' | 'download' | 'convert' | 'settings';
const VIEWS: { id: View; label: string }[] = [
  { id: 'chat', label: 'Chat' },
  { id: 'models', label: 'Models' },
  { id: 'download', label: 'Download' },
  { id: 'convert', label: 'Convert' },
  { id: 'settings', label: 'Settings' },
];

function viewFromHash(): View {
  const h = (globalThis.location?.hash ?? '').replace(/^#\/?/, '');
  return VIEWS.find((v) => v.id === h)?.id ?? 'chat';
}

/** The rail's icons. Convert turns one model into another: two opposed arrows (not a download arrow). */
export const ICONS: Record<View, string> = {
  chat: 'M4 5h16v10H9l-5 4z',
  models: 'M4 7l8-4 8 4-8 4zM4 12l8 4 8-4M4 17l8 4 8-4',
  convert: 'M4 8h15M15 4l4 4-4 4M20 16H5M9 12l-4 4 4 4',
  download: 'M12 3v12M7 10l5 5 5-5M5 20h14',
  // Three sliders.
  settings: 'M4 6h16M4 12h16M4 18h16M9 4v4M15 10v4M7 16v4',
};

function Icon({ view }: { view: View }) {
  const d = ICONS[view];
  return (
    <svg viewBox="0 0 24 24" width="20" height="20" aria-hidden="true">
      <path d={d} fill="none" stroke="currentColor" stroke-width="1.7" stroke-linejoin="round" stroke-linecap="round" />
    </svg>
  );
}

export function App({ client = defaultApi, store }: { client?: Api; store?: ConversationStore }) {
  // The engine keeps the conversations (moving any this browser kept there); see storage.ts.
  const conversations = useMemo(() => store ?? defaultStore(client, showError), [store, client]);
  const [view, setView] = useState<View>(viewFromHash);
  const [models, setModels] = useState<OpenAIModel[]>([]);
  const [adminModels, setAdminModels] = useState<ModelStatus[]>([]);
  const [loadingModels, setLoadingModels] = useState(false);
  const [online, setOnline] = useState<boolean | null>(null);
  // The app-wide settings: the theme, and the context policy new chats start with; Settings edits them.
  const [settings, setSettings] = useState<SettingsView | null>(null);
  const [settingsError, setSettingsError] = useState<string | null>(null);
  // In a narrow window the panel is a drawer over the chat: closed until the Stats toggle opens it.
  const [panel, setPanel] = useState(() => !globalThis.matchMedia?.('(max-width: 980px)').matches);

  // In a narrow window the panel is a drawer over the chat: Escape closes it, after any menu or popover open
  // over it (components/dismiss.ts marks the key used) and before the chat's own use of the key.
  useEffect(() => {
    if (!panel || view !== 'chat') return;
    const onKey = (e: KeyboardEvent) => {
      if (e.key === 'Escape' && !e.defaultPrevented && globalThis.matchMedia?.('(max-width: 980px)').matches) {
        e.preventDefault();
        setPanel(false);
      }
    };
    document.addEventListener('keydown', onKey, true);
    return () => document.removeEventListener('keydown', onKey, true);
  }, [panel, view]);

  const go = useCallback((v: View) => {
    setView(v);
    if (globalThis.history) history.replaceState(null, '', `#/${v}`);
  }, []);

  useEffect(() => {
    const onHash = () => setView(viewFromHash());
    window.addEventListener('hashchange', onHash);
    return () => window.removeEventListener('hashchange', onHash);
  }, []);

  const reloadModels = useCallback(async () => {
    setLoadingModels(true);
    try {
      const [openai, admin] = await Promise.allSettled([client.models(), client.adminModels()]);
      if (openai.status === 'fulfilled') setModels(openai.value);
      if (admin.status === 'fulfilled') setAdminModels(admin.value);
      const failed = [openai, admin].find((r): r is PromiseRejectedResult => r.status === 'rejected');
      if (failed) showError(failed.reason);
    } finally {
      setLoadingModels(false);
    }
  }, [client]);

  const loadSettings = useCallback(async () => {
    try {
      setSettings(await client.settings());
      setSettingsError(null);
    } catch (e) {
      // Said on the Settings page, where it matters; the window keeps its defaults meanwhile.
      setSettingsError(errorMessage(e));
    }
  }, [client]);

  const theme = settings?.settings.ui.theme;
  useEffect(() => {
    if (theme) applyTheme(theme);
  }, [theme]);

  // Health: poll while the window is open; reload models and settings when the engine comes (back) online.
  useEffect(() => {
    let stopped = false;
    let wasOnline: boolean | null = null;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const check = async () => {
      let ok = false;
      try {
        await client.health();
        ok = true;
      } catch {
        ok = false;
      }
      if (stopped) return;
      setOnline(ok);
      if (ok && wasOnline === false) dismissConnection();
      if (ok && wasOnline !== true) {
        void reloadModels();
        void loadSettings();
      }
      wasOnline = ok;
      timer = setTimeout(check, ok ? 10000 : 3000);
    };
    void check();
    return () => {
      stopped = true;
      clearTimeout(timer);
    };
  }, [client, reloadModels, loadSettings]);

  // The live statistics stream.
  useEffect(() => {
    const c = new AbortController();
    client.stats(c.signal).then((s) => live.snapshot(s), () => {});
    void live.follow(client, c.signal);
    return () => c.abort();
  }, [client]);

  // A folder dropped on the window (by the desktop shell) opens Convert.
  useEffect(() => subscribeFolderDrops(() => go('convert')), [go]);

  // The stats stream says which models are loaded; when that changes (a chat loaded one, another client
  // unloaded one), refresh the lists.
  useEffect(() => {
    let key = live.state.loadedModels.join('\n');
    return live.subscribe((s) => {
      const k = s.loadedModels.join('\n');
      if (k !== key) {
        key = k;
        void reloadModels();
      }
    });
  }, [reloadModels]);

  return (
    <div class="app">
      <nav class="rail" aria-label="Views">
        <div class="brand" title="Tandem">
          <svg viewBox="0 0 24 24" width="22" height="22" aria-hidden="true">
            <circle cx="9" cy="12" r="5.5" fill="none" stroke="currentColor" stroke-width="1.8" />
            <circle cx="15" cy="12" r="5.5" fill="none" stroke="var(--accent)" stroke-width="1.8" />
          </svg>
        </div>
        {VIEWS.map((v) => (
          <button
            key={v.id}
            class={`rail-item ${view === v.id ? 'active' : ''}`}
            data-testid={`nav-${v.id}`}
            aria-current={view === v.id ? 'page' : undefined}
            onClick={() => go(v.id)}
          >
            <Icon view={v.id} />
            <span>{v.label}</span>
          </button>
        ))}
        <span class="spacer" />
        {view === 'chat' && (
          <button
            class={`rail-item small ${panel ? 'active' : ''}`}
            data-testid="panel-toggle"
            onClick={() => setPanel((p) => !p)}
            title="Show or hide the live statistics"
          >
            <svg viewBox="0 0 24 24" width="20" height="20" aria-hidden="true">
              <path d="M4 19V9M10 19V5M16 19v-7M21 19H3" fill="none" stroke="currentColor" stroke-width="1.7" stroke-linecap="round" />
            </svg>
            <span>Stats</span>
          </button>
        )}
        <div
          class={`health ${online ? 'ok' : online === false ? 'down' : ''}`}
          data-testid="health-status"
          data-online={online == null ? 'unknown' : online ? 'true' : 'false'}
          title={online ? 'Engine connected' : online === false ? 'Engine not reachable' : 'Connecting…'}
        >
          <span class="dot" />
          <span>{online ? 'engine' : online === false ? 'offline' : '…'}</span>
        </div>
      </nav>
      <main class="main">
        <ErrorBanner offline={online === false} />
        {online === false && (
          <div class="offline" data-testid="engine-offline">
            Cannot reach the Tandem engine{client.base ? ` at ${client.base}` : ''}. Start it with <code>tandem serve</code>;
            this page reconnects by itself.
          </div>
        )}
        <div class="view" hidden={view !== 'chat'} data-view="chat">
          <ChatView
            store={conversations}
            models={models}
            adminModels={adminModels}
            client={client}
            showPanel={panel}
            contextPolicy={settings?.settings.ui.context_policy}
            conversationsDir={settings?.settings.conversations_dir}
          />
        </div>
        <div class="view" hidden={view !== 'models'} data-view="models">
          <ModelsView models={adminModels} loading={loadingModels} reload={reloadModels} client={client} onConvert={() => go('convert')} onGraft={() => go('download')} />
        </div>
        <div class="view" hidden={view !== 'download'} data-view="download">
          <DownloadPage client={client} onFinished={() => void reloadModels()} onShowModels={() => go('models')} />
        </div>
        <div class="view" hidden={view !== 'convert'} data-view="convert">
          <ConvertView client={client} onFinished={() => void reloadModels()} onShowModels={() => go('models')} />
        </div>
        <div class="view" hidden={view !== 'settings'} data-view="settings">
          <SettingsPage
            client={client}
            active={view === 'settings'}
            settings={settings}
            loadError={settingsError}
            models={adminModels}
            onSaved={(s) => {
              // Another models folder, or another default model (listed first): the model lists change.
              const was = settings?.settings;
              if (s.settings.models_dir !== was?.models_dir || s.settings.default_model !== was?.default_model) void reloadModels();
              setSettings(s);
            }}
          />
        </div>
      </main>
    </div>
  );
}
