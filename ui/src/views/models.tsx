// Models: what is on disk, what is loaded, and whether MTP runs for each (and why not).

import { useState } from 'preact/hooks';
import { api as defaultApi, type Api, ApiError, errorMessage } from '../api';
import { showError } from '../components/banner';
import { MtpHealth } from '../components/mtp_health';
import * as fmt from '../format';
import { mtpMostlyParked } from '../figures';
import { useLive } from '../live';
import type { ModelStatus } from '../generated';
import { DOWNLOAD_STARTED } from './download';

export const MAX_DEPTH = 6;

export function quantizationLabel(m: Pick<ModelStatus, 'quantization' | 'dtype'>): string {
  const q = m.quantization;
  if (q == null) return m.dtype ? `${m.dtype} (unquantized)` : 'unquantized';
  // A mixed model's `bits` is only its default: the label gives its range of widths when the API has it.
  const range = q.bits_range && q.bits_range[0] !== q.bits_range[1] ? `${q.bits_range[0]}–${q.bits_range[1]}-bit` : null;
  const mixed = range ? `mixed precision (${range})` : q.bits != null ? `mixed precision (mostly ${q.bits}-bit)` : 'mixed precision';
  const parts = [q.mixed ? mixed : q.bits != null ? `${q.bits}-bit` : 'quantized'];
  if (q.group_size) parts.push(`group ${q.group_size}`);
  if (q.mode && q.mode !== 'affine') parts.push(q.mode);
  return parts.join(', ');
}

function mtpLabel(m: ModelStatus): string {
  if (!m.mtp.available) return 'unavailable';
  if (!m.mtp.enabled) return 'off';
  return `on · depth ${m.mtp.depth}`;
}

function ModelRow(props: { m: ModelStatus; client: Api; reload: () => Promise<void>; slow: boolean; onGraft?: () => void }) {
  const { m, client, reload, slow } = props;
  const [pending, setPending] = useState<string | null>(null);

  async function act(label: string, f: () => Promise<unknown>) {
    setPending(label);
    try {
      await f();
    } catch (e) {
      showError(e);
    } finally {
      await reload();
      setPending(null);
    }
  }

  const depth = m.mtp.depth > 0 ? m.mtp.depth : 3;
  return (
    <div
      class={`model-row ${m.loaded ? 'loaded' : ''}`}
      data-testid="model-row"
      data-model-id={m.id}
      data-loaded={m.loaded ? 'true' : 'false'}
    >
      <div class="model-main">
        <div class="model-title">
          <span class="model-name" data-testid="model-name">
            {m.name}
          </span>
          {/* No format: the folder could not be read (`error` says why). */}
          <span class={`badge badge-${m.format ?? 'unreadable'}`} data-testid="model-format">
            {m.format ? m.format.toUpperCase() : 'UNREADABLE'}
          </span>
          {m.loaded && (
            <span class="badge badge-ok" data-testid="model-loaded">
              loaded
            </span>
          )}
        </div>
        <div class="model-path dim small" title={m.path}>
          {m.path}
        </div>
        <dl class="model-facts">
          <div>
            <dt>size</dt>
            <dd data-testid="model-size">{fmt.bytes(m.size_bytes)}</dd>
          </div>
          <div>
            <dt>quantization</dt>
            <dd data-testid="model-quantization">{quantizationLabel(m)}</dd>
          </div>
          <div>
            <dt>MTP</dt>
            <dd data-testid="model-mtp" data-mtp-enabled={m.mtp.enabled ? 'true' : 'false'}>
              {mtpLabel(m)}
            </dd>
          </div>
          <div>
            <dt>MTP head</dt>
            <dd>
              {/* The reason and the repair have their notices below: said once. */}
              <MtpHealth mtp={m.mtp} reasonShown />
            </dd>
          </div>
        </dl>
        {m.error && (
          <div class="notice notice-warn small" data-testid="model-error">
            {m.error}
          </div>
        )}
        {m.mtp.reason && (
          <div class="notice notice-warn small" data-testid="model-mtp-reason">
            {m.mtp.reason}
            {!m.mtp.available && m.format === 'mlx' && m.base_model && (
              <>
                {' '}
                <button
                  type="button"
                  class="link-button"
                  data-testid="model-graft"
                  disabled={pending != null}
                  title={`Fetch only the files of ${m.base_model} that hold its MTP head, graft it onto a new model ${m.name}-mtp, and check it with the acceptance probe`}
                  onClick={() =>
                    void act('graft', async () => {
                      const v = await client.graftHead(m.id);
                      window.dispatchEvent(new CustomEvent(DOWNLOAD_STARTED, { detail: v }));
                      props.onGraft?.();
                    })
                  }
                >
                  Get its MTP head from {m.base_model}
                </button>
              </>
            )}
          </div>
        )}
        {slow && m.mtp.enabled && (
          <div class="notice notice-warn small" data-testid="model-mtp-slow">
            In its last generation the adaptive controller parked drafting for most steps: MTP does not pay for this
            model on this machine. Turning it off may be as fast or faster.
          </div>
        )}
        {m.mtp.repaired && (
          <div class="notice small" data-testid="model-mtp-repaired">
            {m.mtp.repaired}
          </div>
        )}
        <SystemPrompt m={m} client={client} reload={reload} />
      </div>
      <div class="model-controls">
        <label class={`switch ${!m.mtp.available ? 'disabled' : ''}`} title={m.mtp.available ? 'Speculative decoding with the MTP head' : (m.mtp.reason ?? 'This model has no MTP head')}>
          <input
            type="checkbox"
            data-testid="model-mtp-toggle"
            checked={m.mtp.available && m.mtp.enabled}
            disabled={!m.mtp.available || pending != null}
            onChange={(e) =>
              void act('mtp', () =>
                client.updateModelSettings(m.id, { mtp: { enabled: (e.target as HTMLInputElement).checked, depth } }),
              )
            }
          />
          <span class="switch-track" aria-hidden="true" />
          <span>MTP</span>
        </label>
        <label class="switch" title="Let the adaptive controller park drafting that does not pay (off: every cycle drafts at full depth)">
          <input
            type="checkbox"
            data-testid="model-mtp-adaptive"
            checked={m.mtp.adaptive ?? true}
            disabled={!m.mtp.available || !m.mtp.enabled || pending != null}
            onChange={(e) =>
              void act('adaptive', () =>
                client.updateModelSettings(m.id, { mtp: { adaptive: (e.target as HTMLInputElement).checked } }),
              )
            }
          />
          <span class="switch-track" aria-hidden="true" />
          <span>adaptive</span>
        </label>
        <label class="depth">
          <span class="dim small">depth</span>
          <select
            data-testid="model-mtp-depth"
            value={String(depth)}
            disabled={!m.mtp.available || !m.mtp.enabled || pending != null}
            onChange={(e) =>
              void act('depth', () =>
                client.updateModelSettings(m.id, { mtp: { enabled: m.mtp.enabled, depth: Number((e.target as HTMLSelectElement).value) } }),
              )
            }
          >
            {Array.from({ length: MAX_DEPTH }, (_, i) => i + 1).map((d) => (
              <option key={d} value={String(d)}>
                {d}
              </option>
            ))}
          </select>
        </label>
        {m.loaded ? (
          <button
            class="button"
            data-testid="model-unload"
            disabled={pending != null}
            onClick={() => void act('unload', () => client.unloadModel(m.id))}
          >
            {pending === 'unload' ? 'Unloading…' : 'Unload'}
          </button>
        ) : (
          <button
            class="button button-primary"
            data-testid="model-load"
            disabled={pending != null}
            onClick={() => void act('load', () => client.loadModel(m.id))}
          >
            {pending === 'load' ? 'Loading…' : 'Load'}
          </button>
        )}
      </div>
    </div>
  );
}

/** The system prompt new chats on this model start with (each chat may still change its own). */
function SystemPrompt(props: { m: ModelStatus; client: Api; reload: () => Promise<void> }) {
  const saved = props.m.system_prompt ?? '';
  // The text being edited; null: the saved prompt is shown (and follows a reload).
  const [draft, setDraft] = useState<string | null>(null);
  const [saving, setSaving] = useState(false);
  const [error, setError] = useState<string | null>(null);
  const text = draft ?? saved;

  async function save() {
    setSaving(true);
    setError(null);
    try {
      // An empty prompt removes it.
      await props.client.updateModelSettings(props.m.id, { system_prompt: text.trim() ? text : '' });
      await props.reload();
      setDraft(null);
    } catch (e) {
      setError(errorMessage(e));
    } finally {
      setSaving(false);
    }
  }

  return (
    <div class="model-system">
      <label class="field">
        <span class="field-label">System prompt for new chats</span>
        <textarea
          data-testid="model-system-prompt"
          rows={2}
          value={text}
          placeholder="None"
          disabled={saving}
          onInput={(e) => setDraft((e.target as HTMLTextAreaElement).value)}
        />
      </label>
      <div class="model-system-actions">
        <button
          type="button"
          class="button"
          data-testid="model-system-prompt-save"
          disabled={saving || draft == null || draft === saved}
          onClick={() => void save()}
        >
          {saving ? 'Saving…' : 'Save'}
        </button>
        <span class="dim small">Each chat can change its own under Sampling.</span>
      </div>
      {error && (
        <div class="error-text small" data-testid="model-system-prompt-error">
          {error}
        </div>
      )}
    </div>
  );
}

export function ModelsView(props: {
  models: ModelStatus[];
  loading: boolean;
  reload: () => Promise<void>;
  client?: Api;
  onConvert: () => void;
  /** A graft started: where its progress shows (the Download page). */
  onGraft?: () => void;
}) {
  const client = props.client ?? defaultApi;
  // The last generation's statistics say whether MTP paid for its model here.
  const live = useLive();
  const slowModel = mtpMostlyParked(live.stats) ? live.model : null;
  return (
    <div class="page">
      <header class="page-header">
        <h1>Models</h1>
        <span class="spacer" />
        <button class="button" data-testid="models-convert" onClick={props.onConvert}>
          Convert a model…
        </button>
        <AddFolder client={client} reload={props.reload} />
        <button class="button" data-testid="models-refresh" onClick={() => void props.reload()} disabled={props.loading}>
          {props.loading ? 'Refreshing…' : 'Refresh'}
        </button>
      </header>
      <div class="model-list" data-testid="model-list">
        {props.models.length === 0 && !props.loading && (
          <p class="dim empty" data-testid="models-empty">
            No models found. Convert one, or add a model folder you already have (Add model folder…).
          </p>
        )}
        {props.models.map((m) => (
          <ModelRow key={m.id} m={m} client={client} reload={props.reload} onGraft={props.onGraft} slow={slowModel != null && (slowModel === m.id || slowModel === m.name)} />
        ))}
      </div>
    </div>
  );
}

type AddState =
  | { step: 'closed' }
  | { step: 'path'; path: string; error: string | null }
  | { step: 'confirm'; path: string }
  | { step: 'busy'; path: string };

/**
 * "Add model folder…": registers a model folder that is already on disk (an MLX conversion or a raw
 * checkpoint) without converting it. The app's Browse… picks it natively; in a browser the person types
 * the path and confirms that Tandem may read it.
 */
export function AddFolder(props: { client: Api; reload: () => Promise<void> }) {
  const [st, setSt] = useState<AddState>({ step: 'closed' });

  async function add(path: string, allow: boolean) {
    setSt({ step: 'busy', path });
    try {
      if (allow) await props.client.chooseFolder(path);
      await props.client.addModel({ path });
      setSt({ step: 'closed' });
      await props.reload();
    } catch (e) {
      if (e instanceof ApiError && e.code === 'folder_not_chosen') setSt({ step: 'confirm', path });
      else setSt({ step: 'path', path, error: errorMessage(e) });
    }
  }

  async function open() {
    if (!props.client.canPickFolder()) {
      setSt({ step: 'path', path: '', error: null });
      return;
    }
    try {
      const picked = await props.client.pickFolder('Choose a model folder to add');
      if (picked?.path) await add(picked.path, false);
    } catch (e) {
      showError(e);
    }
  }

  return (
    <span class="add-folder">
      <button class="button" data-testid="models-add-folder" disabled={st.step === 'busy'} onClick={() => void open()}>
        Add model folder…
      </button>
      {(st.step === 'path' || st.step === 'busy') && (
        <form
          class="add-folder-form"
          data-testid="add-folder-form"
          onSubmit={(e) => {
            e.preventDefault();
            if (st.path.trim()) void add(st.path.trim(), false);
          }}
        >
          <input
            type="text"
            class="path-input"
            data-testid="add-folder-path"
            placeholder="/path/to/model-folder"
            value={st.path}
            spellcheck={false}
            autocomplete="off"
            disabled={st.step === 'busy'}
            onInput={(e) => setSt({ step: 'path', path: (e.target as HTMLInputElement).value, error: null })}
          />
          <button type="submit" class="button" data-testid="add-folder-submit" disabled={st.step === 'busy' || !st.path.trim()}>
            {st.step === 'busy' ? 'Adding…' : 'Add'}
          </button>
          <button type="button" class="link-button" onClick={() => setSt({ step: 'closed' })}>
            Cancel
          </button>
          {st.step === 'path' && st.error && (
            <div class="error-text small" data-testid="add-folder-error">
              {st.error}
            </div>
          )}
        </form>
      )}
      {st.step === 'confirm' && (
        <div class="notice small" data-testid="add-folder-confirm">
          Allow Tandem to read <span class="mono">{st.path}</span> and list it as a model? Nothing there is changed.{' '}
          <button type="button" class="button" data-testid="add-folder-allow" onClick={() => void add(st.path, true)}>
            Allow and add
          </button>{' '}
          <button type="button" class="link-button" onClick={() => setSt({ step: 'closed' })}>
            Cancel
          </button>
        </div>
      )}
    </span>
  );
}
