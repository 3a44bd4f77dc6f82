// Settings: models.toml's app-wide settings (the folders, the default model, how new chats start, the theme,
// how the server listens), the server's state, and its latest API requests. Each setting saves on its own and
// says its own error beside it (the engine's message names the setting); the server's apply when it restarts.

import type { ComponentChildren } from 'preact';
import { useEffect, useState } from 'preact/hooks';
import { type Api, errorMessage, rememberApiKey } from '../api';
import * as fmt from '../format';
import type { AppPatch, AppSettings, ContextPolicy, LoggedRequest, ModelStatus, ServerInfo, ServerPatch, SettingsView, Theme } from '../generated';
import { applyTheme } from '../theme';
import { useCopied } from './chat/message';

/** How often the server's state and its request log are read while Settings is shown. */
export const POLL_MS = 2000;

const POLICIES: { value: ContextPolicy; label: string }[] = [
  { value: 'rolling', label: 'Rolling: leave out the oldest turns' },
  { value: 'middle', label: 'Middle: keep the first turn, leave out the ones after it' },
  { value: 'stop', label: 'Stop: end with an error' },
];

const THEMES: { value: Theme; label: string }[] = [
  { value: 'system', label: 'System' },
  { value: 'light', label: 'Light' },
  { value: 'dark', label: 'Dark' },
];

type Saved = (s: SettingsView) => void;

/** One setting's save: its PATCH, and its error, said where the setting is. */
function useSave(client: Api, onSaved: Saved) {
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);
  async function save(patch: AppPatch): Promise<boolean> {
    setBusy(true);
    setError(null);
    try {
      onSaved(await client.updateSettings(patch));
      return true;
    } catch (e) {
      setError(errorMessage(e));
      return false;
    } finally {
      setBusy(false);
    }
  }
  return { busy, error, setError, save };
}

function ErrorText({ id, error }: { id: string; error: string | null }) {
  return error ? (
    <div class="error-text small" role="alert" data-testid={id}>
      {error}
    </div>
  ) : null;
}

function Section(props: { id: string; title: string; children: ComponentChildren }) {
  return (
    <section class="settings-section" data-testid={`settings-${props.id}`} aria-labelledby={`settings-${props.id}-title`}>
      <h2 id={`settings-${props.id}-title`}>{props.title}</h2>
      {props.children}
    </section>
  );
}

/** A folder: typed, or picked with the desktop app's dialog where there is one. */
function FolderField(props: {
  name: 'models_dir' | 'conversations_dir';
  label: string;
  hint: string;
  saved: string;
  client: Api;
  onSaved: Saved;
}) {
  const { busy, error, setError, save } = useSave(props.client, props.onSaved);
  // The path being edited; null: the saved one is shown.
  const [draft, setDraft] = useState<string | null>(null);
  const id = `settings-${props.name.replace('_', '-')}`;
  const path = draft ?? props.saved;
  const changed = draft != null && draft.trim() !== '' && draft.trim() !== props.saved;

  async function browse() {
    try {
      const picked = await props.client.pickFolder(`Choose the ${props.label.toLowerCase()}`);
      if (picked?.path) setDraft(picked.path);
    } catch (e) {
      setError(errorMessage(e));
    }
  }

  async function submit(e: Event) {
    e.preventDefault();
    // The engine answers the path resolved (`~` expanded): shown once saved.
    if (changed && (await save({ [props.name]: path.trim() }))) setDraft(null);
  }

  return (
    <form class="field" onSubmit={submit}>
      <label class="field-label" for={id}>
        {props.label}
      </label>
      <div class="settings-row">
        <input
          id={id}
          type="text"
          class="path-input"
          data-testid={id}
          value={path}
          spellcheck={false}
          autocomplete="off"
          disabled={busy}
          onInput={(e) => setDraft((e.target as HTMLInputElement).value)}
        />
        {props.client.canPickFolder() && (
          <button type="button" class="button" data-testid={`${id}-browse`} disabled={busy} onClick={() => void browse()}>
            Browse…
          </button>
        )}
        <button type="submit" class="button" data-testid={`${id}-save`} disabled={busy || !changed}>
          {busy ? 'Saving…' : 'Save'}
        </button>
      </div>
      <span class="field-hint">{props.hint}</span>
      <ErrorText id={`${id}-error`} error={error} />
    </form>
  );
}

/** A setting chosen from a list, saved as soon as it is chosen. */
function Choice<T extends string>(props: {
  id: string;
  label: string;
  value: T;
  options: { value: T; label: string; disabled?: boolean }[];
  hint?: ComponentChildren;
  patch: (v: T) => AppPatch;
  client: Api;
  onSaved: Saved;
  /** Shows a choice at once, before it is saved (and the saved one again if it cannot be). */
  preview?: (v: T) => void;
}) {
  const { busy, error, save } = useSave(props.client, props.onSaved);
  const [chosen, setChosen] = useState<T | null>(null);
  const id = `settings-${props.id}`;

  async function choose(v: T) {
    const was = props.value;
    setChosen(v);
    props.preview?.(v);
    if (!(await save(props.patch(v)))) props.preview?.(was);
    setChosen(null);
  }

  return (
    <div class="field">
      <label class="field-label" for={id}>
        {props.label}
      </label>
      <select
        id={id}
        data-testid={id}
        value={chosen ?? props.value}
        disabled={busy || props.options.length === 0}
        onChange={(e) => void choose((e.target as HTMLSelectElement).value as T)}
      >
        {props.options.map((o) => (
          <option key={o.value} value={o.value} disabled={o.disabled}>
            {o.label}
          </option>
        ))}
      </select>
      {props.hint && <span class="field-hint">{props.hint}</span>}
      <ErrorText id={`${id}-error`} error={error} />
    </div>
  );
}

function DefaultModel(props: { settings: AppSettings; models: ModelStatus[]; client: Api; onSaved: Saved }) {
  const current = props.settings.default_model;
  const names = props.models.map((m) => m.name);
  // The saved one stays shown while the list is being read (or if its folder is gone).
  if (current && !names.includes(current)) names.unshift(current);
  const options: { value: string; label: string; disabled?: boolean }[] = names.map((n) => ({ value: n, label: n }));
  if (!current) options.unshift({ value: '', label: names.length ? 'None chosen: the first listed' : 'No models', disabled: true });
  return (
    <Choice
      id="default-model"
      label="Model"
      value={current ?? ''}
      options={options}
      hint="Listed first, so new chats take it; also what a request naming no model gets."
      patch={(v) => ({ default_model: v })}
      client={props.client}
      onSaved={props.onSaved}
    />
  );
}

/** How the server listens: its port, other devices, the API key. Saved together; they apply when it restarts. */
function ServerForm(props: { settings: AppSettings; client: Api; onSaved: Saved }) {
  const saved = props.settings.server;
  const { busy, error, setError, save } = useSave(props.client, props.onSaved);
  // Edits; null (or empty, for the key) leaves the saved value.
  const [port, setPort] = useState<string | null>(null);
  const [expose, setExpose] = useState<boolean | null>(null);
  const [key, setKey] = useState('');
  const [removeKey, setRemoveKey] = useState(false);
  const portText = port ?? String(saved.port);
  const exposed = expose ?? saved.expose;
  const keyAfter = key !== '' || (saved.api_key_set && !removeKey);
  const changed = portText !== String(saved.port) || exposed !== saved.expose || key !== '' || removeKey;

  async function submit(e: Event) {
    e.preventDefault();
    const n = Number(portText.trim());
    if (!/^\d+$/.test(portText.trim()) || n < 1 || n > 65535) {
      setError('The port must be a whole number from 1 to 65535.');
      return;
    }
    // The engine refuses it too; said here before anything is sent.
    if (exposed && !keyAfter) {
      setError('Other devices can be allowed only with an API key (else anyone on the network could use your models): set one below.');
      return;
    }
    const server: ServerPatch = {};
    if (n !== saved.port) server.port = n;
    if (exposed !== saved.expose) server.expose = exposed;
    if (key) server.api_key = key;
    else if (removeKey) server.api_key = '';
    if (!(await save({ server }))) return;
    // This browser sends the key once the engine requires it (api.ts reads it back).
    if (server.api_key !== undefined) rememberApiKey(server.api_key || null);
    setPort(null);
    setExpose(null);
    setKey('');
    setRemoveKey(false);
  }

  return (
    <form class="settings-form" data-testid="settings-server-form" onSubmit={submit}>
      <div class="field">
        <label class="field-label" for="settings-port">
          Port
        </label>
        <input
          id="settings-port"
          type="number"
          min="1"
          max="65535"
          step="1"
          class="settings-port"
          data-testid="settings-port"
          value={portText}
          disabled={busy}
          onInput={(e) => setPort((e.target as HTMLInputElement).value)}
        />
      </div>
      <div class="field">
        <label class="switch">
          <input
            type="checkbox"
            data-testid="settings-expose"
            checked={exposed}
            disabled={busy}
            onChange={(e) => setExpose((e.target as HTMLInputElement).checked)}
          />
          <span class="switch-track" aria-hidden="true" />
          <span>Allow other devices on the network</span>
        </label>
        <span class="field-hint">Off: only this computer can connect. On: other devices can, with the API key.</span>
      </div>
      <div class="field">
        <label class="field-label" for="settings-api-key">
          API key
        </label>
        <div class="settings-row">
          <input
            id="settings-api-key"
            type="password"
            class="settings-key"
            data-testid="settings-api-key"
            autocomplete="new-password"
            placeholder={saved.api_key_set ? 'Type a new key to replace it' : 'Type a key to set one'}
            value={key}
            disabled={busy}
            onInput={(e) => {
              setKey((e.target as HTMLInputElement).value);
              setRemoveKey(false);
            }}
          />
          {saved.api_key_set && !removeKey && (
            <button
              type="button"
              class="link-button"
              data-testid="settings-api-key-remove"
              disabled={busy}
              onClick={() => {
                setKey('');
                setRemoveKey(true);
              }}
            >
              Remove the key
            </button>
          )}
        </div>
        <span class="field-hint" data-testid="settings-api-key-state">
          {removeKey ? (
            <>
              The key is removed when you save.{' '}
              <button type="button" class="link-button" data-testid="settings-api-key-keep" onClick={() => setRemoveKey(false)}>
                Keep it
              </button>
            </>
          ) : saved.api_key_set ? (
            'A key is set. Clients send it as “Authorization: Bearer <key>”.'
          ) : (
            'No key is set.'
          )}{' '}
          This browser keeps a key you set here, to send it.
        </span>
      </div>
      <div class="settings-row">
        <button type="submit" class="button button-primary" data-testid="settings-server-save" disabled={busy || !changed}>
          {busy ? 'Saving…' : 'Save'}
        </button>
      </div>
      <ErrorText id="settings-server-error" error={error} />
    </form>
  );
}

/** What the running server is: where it listens, for whom, since when. */
function ServerFacts({ info }: { info: ServerInfo }) {
  const [copied, copy] = useCopied();
  return (
    <dl class="settings-facts" data-testid="settings-server-info">
      <div>
        <dt>Address</dt>
        <dd>
          <span class="mono" data-testid="settings-server-url">
            {info.url}
          </span>{' '}
          <button type="button" class="link-button" data-testid="settings-server-copy" title="Copy the address" onClick={() => copy(info.url)}>
            {copied ?? 'Copy'}
          </button>
        </dd>
      </div>
      <div>
        <dt>Listening on</dt>
        <dd class="mono" data-testid="settings-server-listening">
          {info.listening}
        </dd>
      </div>
      <div>
        <dt>Network</dt>
        <dd data-testid="settings-server-exposed" data-exposed={info.exposed ? 'true' : 'false'}>
          {info.exposed ? 'other devices may connect' : 'this computer only'}
        </dd>
      </div>
      <div>
        <dt>API key</dt>
        <dd data-testid="settings-server-key-required">{info.api_key_required ? 'required' : 'not required'}</dd>
      </div>
      <div>
        <dt>Up for</dt>
        <dd data-testid="settings-server-uptime">{fmt.duration(info.uptime_s)}</dd>
      </div>
      <div>
        <dt>Requests served</dt>
        <dd data-testid="settings-server-served">{fmt.integer(info.requests_served)}</dd>
      </div>
    </dl>
  );
}

function RequestTable({ requests }: { requests: LoggedRequest[] }) {
  if (requests.length === 0) {
    return (
      <p class="dim small" data-testid="settings-request-log-empty">
        No API requests yet.
      </p>
    );
  }
  return (
    <div class="request-log-scroll">
      <table class="request-log" data-testid="settings-request-log">
        <thead>
          <tr>
            <th scope="col">Time</th>
            <th scope="col">Method</th>
            <th scope="col">Path</th>
            <th scope="col">Status</th>
            <th scope="col" class="num">
              ms
            </th>
          </tr>
        </thead>
        <tbody>
          {requests.map((r, i) => {
            const failed = r.status >= 400;
            return (
              <tr key={`${r.at_ms}-${i}`} class={failed ? 'failed' : ''} data-testid="settings-request-row" data-failed={failed ? 'true' : 'false'}>
                <td class="mono">{fmt.clock(r.at_ms)}</td>
                <td>{r.method}</td>
                <td class="mono request-path" title={r.path}>
                  {r.path}
                </td>
                <td class="mono" data-testid="settings-request-status">
                  {failed ? <span class="badge badge-failed">{r.status}</span> : r.status}
                </td>
                <td class="num mono">{fmt.fixed(r.ms, r.ms < 10 ? 1 : 0)}</td>
              </tr>
            );
          })}
        </tbody>
      </table>
    </div>
  );
}

interface Polled {
  info: ServerInfo | null;
  infoError: string | null;
  requests: LoggedRequest[] | null;
  requestsError: string | null;
}

/** The server's state and its request log, read now and every POLL_MS while `active` (the rail keeps Settings mounted). */
function useServerPoll(client: Api, active: boolean): Polled {
  const [polled, setPolled] = useState<Polled>({ info: null, infoError: null, requests: null, requestsError: null });
  useEffect(() => {
    if (!active) return;
    const controller = new AbortController();
    let timer: ReturnType<typeof setTimeout> | undefined;
    const read = async () => {
      const [info, log] = await Promise.allSettled([client.serverInfo(controller.signal), client.requestLog(controller.signal)]);
      if (controller.signal.aborted) return;
      setPolled((p) => ({
        info: info.status === 'fulfilled' ? info.value : p.info,
        infoError: info.status === 'rejected' ? errorMessage(info.reason) : null,
        requests: log.status === 'fulfilled' ? log.value : p.requests,
        requestsError: log.status === 'rejected' ? errorMessage(log.reason) : null,
      }));
      timer = setTimeout(read, POLL_MS);
    };
    void read();
    return () => {
      controller.abort();
      clearTimeout(timer);
    };
  }, [client, active]);
  return polled;
}

export function SettingsPage(props: {
  client: Api;
  /** Settings is the view shown: only then are the server's state and log read. */
  active: boolean;
  /** As `GET /api/settings` last answered; null until then. */
  settings: SettingsView | null;
  /** Why the settings could not be read. */
  loadError: string | null;
  models: ModelStatus[];
  onSaved: Saved;
}) {
  const { client, onSaved } = props;
  const polled = useServerPoll(client, props.active);
  const s = props.settings?.settings;
  const restartNeeded = props.settings?.restart_needed ?? false;
  return (
    <div class="page settings-page" data-testid="settings-page">
      <header class="page-header">
        <h1>Settings</h1>
        <span class="spacer" />
        {s && (
          <span class="dim small" data-testid="settings-config-path">
            saved in <span class="mono">{s.config_path}</span>
          </span>
        )}
      </header>
      {!s && props.loadError && (
        <div class="error-text" role="alert" data-testid="settings-load-error">
          The settings could not be read: {props.loadError}
        </div>
      )}
      {!s && !props.loadError && <p class="dim">Reading the settings…</p>}
      {s && (
        <>
          <Section id="folders" title="Folders">
            <FolderField
              name="models_dir"
              label="Models folder"
              hint="Where conversions and downloads go, and where models are found."
              saved={s.models_dir}
              client={client}
              onSaved={onSaved}
            />
            <FolderField
              name="conversations_dir"
              label="Conversations folder"
              hint="Chats saved from now on go there and are listed from there; those saved before stay in the old folder."
              saved={s.conversations_dir}
              client={client}
              onSaved={onSaved}
            />
          </Section>
          <Section id="default" title="Default model">
            <DefaultModel settings={s} models={props.models} client={client} onSaved={onSaved} />
          </Section>
          <Section id="new-chats" title="New chats">
            <Choice
              id="context-policy"
              label="When a chat outgrows the model’s context"
              value={s.ui.context_policy}
              options={POLICIES}
              hint="New chats start with this; each chat can change its own under Sampling. The chat keeps every message: only the request is shortened."
              patch={(v) => ({ ui: { context_policy: v } })}
              client={client}
              onSaved={onSaved}
            />
          </Section>
          <Section id="appearance" title="Appearance">
            <Choice
              id="theme"
              label="Theme"
              value={s.ui.theme}
              options={THEMES}
              hint="System follows this computer’s light or dark appearance."
              patch={(v) => ({ ui: { theme: v } })}
              preview={applyTheme}
              client={client}
              onSaved={onSaved}
            />
          </Section>
          <Section id="server" title="Server">
            {restartNeeded && (
              <div class="notice notice-warn" role="status" data-testid="settings-restart-notice">
                Saved; applies when Tandem restarts. Until then the server goes on as it started.
              </div>
            )}
            {polled.info && <ServerFacts info={polled.info} />}
            <ErrorText id="settings-server-info-error" error={polled.infoError} />
            <ServerForm settings={s} client={client} onSaved={onSaved} />
          </Section>
        </>
      )}
      <Section id="requests" title="Request log">
        <p class="dim small">
          The API’s latest requests, newest first: method, path and status only (no queries, bodies or keys). Read every{' '}
          {POLL_MS / 1000} s while this page is shown.
        </p>
        <ErrorText id="settings-request-log-error" error={polled.requestsError} />
        {polled.requests && <RequestTable requests={polled.requests} />}
      </Section>
    </div>
  );
}
