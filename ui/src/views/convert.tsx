// Convert: a Hugging Face (or MLX) model folder -> an MLX quantized model that keeps its MTP head.

import { useEffect, useRef, useState } from 'preact/hooks';
import { api as defaultApi, type Api, ApiError, errorMessage, isAbort } from '../api';
import { showError } from '../components/banner';
import * as fmt from '../format';
import { pathFromDroppedText, subscribeFolderDrops } from '../shell';
import type { ConvertRequest, JobEvent } from '../generated';

/** The recipes as a request spells them (the CLI's spellings). */
export type Recipe = 'uniform' | 'mixed_3_6' | 'mixed_4_6' | 'auto';

export const RECIPES: { value: Recipe; label: string; hint: string }[] = [
  { value: 'uniform', label: 'Uniform', hint: 'every quantizable linear at the chosen bits' },
  { value: 'mixed_4_6', label: 'Mixed 4/6', hint: 'sensitive layers at 6 bits, the rest at 4' },
  { value: 'mixed_3_6', label: 'Mixed 3/6', hint: 'sensitive layers at 6 bits, the rest at 3' },
  { value: 'auto', label: 'Auto', hint: 'search for the best mix at a target bits per weight' },
];
export const BITS = [2, 3, 4, 5, 6, 8];
/** The (low, high) bits of a mixed recipe: sensitive layers get the high width. */
export const MIXED_BITS: Partial<Record<Recipe, [number, number]>> = { mixed_3_6: [3, 6], mixed_4_6: [4, 6] };
export const GROUP_SIZES = [32, 64, 128];

export type JobPhase = 'idle' | 'starting' | 'running' | 'finished' | 'error' | 'cancelled';

export interface JobState {
  phase: JobPhase;
  job: string | null;
  predictedBytes: number | null;
  predictedBpw: number | null;
  done: number;
  total: number;
  tensor: string | null;
  result: { path: string; bytes: number; bpw: number } | null;
  error: string | null;
  /** The destination exists: the person may replace it (the request's `force`) or pick another name. */
  exists?: boolean;
  /** The source is a folder nobody chose yet: the person may allow Tandem to read it. */
  confirmFolder?: string | null;
  /** Recipe `auto` measures each module first: how far it is, and when it began (ms), for an ETA. */
  calibration?: { done: number; total: number; module: string; tokens: number; since: number } | null;
  /** When the first tensor was written (ms), for an ETA. */
  writingSince?: number | null;
}

/** "about 40 s left" from the work done since `since`; null until there is enough to judge. */
export function eta(done: number, total: number, since: number | null | undefined, now: number): string | null {
  if (since == null || done <= 0 || done >= total) return null;
  const left = ((now - since) / done) * (total - done) / 1000;
  if (!Number.isFinite(left) || left < 1) return null;
  if (left < 90) return `about ${Math.round(left)} s left`;
  if (left < 90 * 60) return `about ${Math.round(left / 60)} min left`;
  return `about ${(left / 3600).toFixed(1)} h left`;
}

export const IDLE: JobState = {
  phase: 'idle',
  job: null,
  predictedBytes: null,
  predictedBpw: null,
  done: 0,
  total: 0,
  tensor: null,
  result: null,
  error: null,
};

/** The job's state after one event (`now`: when it came, in ms). */
export function applyConvertEvent(s: JobState, ev: JobEvent, now: number = Date.now()): JobState {
  switch (ev.event) {
    case 'validated':
      return { ...s, phase: 'running' };
    case 'calibrating':
      return {
        ...s,
        phase: 'running',
        calibration: { done: ev.done, total: ev.total, module: ev.module, tokens: ev.tokens, since: s.calibration?.since ?? now },
      };
    case 'planned':
      return { ...s, phase: 'running', predictedBytes: ev.predicted_bytes, predictedBpw: ev.predicted_bpw };
    case 'progress':
      return { ...s, phase: 'running', done: ev.done, total: ev.total, tensor: ev.tensor, writingSince: s.writingSince ?? now };
    case 'finished':
      return { ...s, phase: 'finished', done: s.total || s.done, result: { path: ev.path, bytes: ev.bytes, bpw: ev.bpw } };
    case 'error':
      return { ...s, phase: 'error', error: ev.message };
    case 'cancelled':
      return { ...s, phase: 'cancelled' };
  }
}

interface Form {
  src: string;
  name: string;
  recipe: Recipe;
  bits: number;
  groupSize: number;
  targetBpw: string;
  mtp: 'keep' | 'drop';
  /** "" = the server's default, "none" = unquantized, else bits. */
  mtpBits: string;
}

export function requestOf(f: Form, force = false): ConvertRequest {
  const req: ConvertRequest = {
    src: f.src.trim(),
    bits: f.bits,
    group_size: f.groupSize,
    recipe: f.recipe,
    mtp: f.mtp,
  };
  // A mixed recipe sets its own bits (the server refuses another width than its low one).
  if (MIXED_BITS[f.recipe]) delete req.bits;
  if (force) req.force = true;
  // The name shown as the field's placeholder is the one used when the field is left empty.
  const name = f.name.trim() || suggestName(f.src, f.recipe, f.bits);
  if (name) req.dst = name;
  if (f.recipe === 'auto' && f.targetBpw.trim()) {
    const t = parseFloat(f.targetBpw);
    if (Number.isFinite(t)) req.target_bpw = t;
  }
  if (f.mtp === 'keep' && f.mtpBits !== '') req.mtp_bits = f.mtpBits === 'none' ? null : Number(f.mtpBits);
  return req;
}

/**
 * The error for a conversion that could not start, as the Convert form says it. A destination that exists
 * becomes a choice (replace it, or another name) instead of the API's advice to pass `"force": true`.
 */
export function startError(e: unknown, src = ''): Pick<JobState, 'error' | 'exists' | 'confirmFolder'> {
  if (e instanceof ApiError && e.code === 'already_exists') {
    const what = e.message.split(/ already exists/)[0]?.trim();
    return { error: `${what || 'The destination'} already exists.`, exists: true };
  }
  if (e instanceof ApiError && e.code === 'folder_not_chosen' && src.trim()) {
    return {
      error: `Tandem reads only folders you chose. Allow it to read ${src.trim()}? Nothing there is changed; the converted model goes to the models folder.`,
      exists: false,
      confirmFolder: src.trim(),
    };
  }
  return { error: errorMessage(e), exists: false };
}

/** A name for the converted model from the source folder: "Qwen3.5-4B" + "-4bit". */
export function suggestName(src: string, recipe: Recipe, bits: number): string {
  const base = src.trim().replace(/[\\/]+$/, '').split(/[\\/]/).pop() ?? '';
  if (!base) return '';
  const suffix = recipe === 'uniform' ? `${bits}bit` : recipe === 'auto' ? 'auto' : recipe.replace('mixed_', 'mixed-').replace('_', '-');
  return `${base}-${suffix}`;
}

export function ConvertView(props: { client?: Api; onFinished: () => void; onShowModels: () => void }) {
  const client = props.client ?? defaultApi;
  const [form, setForm] = useState<Form>({
    src: '',
    name: '',
    recipe: 'uniform',
    bits: 4,
    groupSize: 64,
    targetBpw: '4.5',
    mtp: 'keep',
    mtpBits: '',
  });
  const [job, setJob] = useState<JobState>(IDLE);
  const [dropHint, setDropHint] = useState<string | null>(null);
  const [over, setOver] = useState(false);
  const controller = useRef<AbortController | null>(null);
  const nameRef = useRef<HTMLInputElement>(null);

  const set = (patch: Partial<Form>) => setForm((f) => ({ ...f, ...patch }));

  useEffect(
    () =>
      subscribeFolderDrops((path) => {
        setDropHint(null);
        set({ src: path });
      }),
    [],
  );

  useEffect(() => () => controller.current?.abort(), []);

  const active = job.phase === 'starting' || job.phase === 'running';

  async function follow(id: string, signal: AbortSignal) {
    let state: JobState = { ...IDLE, phase: 'running', job: id };
    setJob(state);
    try {
      for await (const ev of client.convertEvents(id, signal)) {
        state = applyConvertEvent(state, ev);
        setJob(state);
        if (ev.event === 'finished') props.onFinished();
        if (ev.event === 'error') showError(`Conversion failed: ${ev.message}`);
      }
      if (state.phase === 'running') {
        // The stream closed without a last word: ask the job itself.
        const st = await client.convertStatus(id, signal);
        if (st.state === 'finished') {
          state = { ...state, phase: 'finished', result: { path: st.path ?? '', bytes: st.bytes ?? 0, bpw: st.bpw ?? 0 } };
          props.onFinished();
        } else if (st.state === 'error') {
          state = { ...state, phase: 'error', error: st.error ?? 'Conversion failed' };
          showError(`Conversion failed: ${state.error}`);
        } else if (st.state === 'cancelled') {
          state = { ...state, phase: 'cancelled' };
        } else {
          state = { ...state, phase: 'error', error: 'Lost the progress stream of the conversion; it may still be running.' };
        }
        setJob(state);
      }
    } catch (e) {
      if (isAbort(e) || signal.aborted) return;
      setJob({ ...state, phase: 'error', error: errorMessage(e) });
      showError(e);
    }
  }

  async function start(e: Event | null, force = false) {
    e?.preventDefault();
    if (active) return;
    if (!form.src.trim()) {
      showError('Give the folder of the model to convert.');
      return;
    }
    setJob({ ...IDLE, phase: 'starting' });
    controller.current?.abort();
    const c = new AbortController();
    controller.current = c;
    try {
      const id = await client.startConvert(requestOf(form, force));
      await follow(id, c.signal);
    } catch (err) {
      const why = startError(err, form.src);
      setJob({ ...IDLE, phase: 'error', ...why });
      // A choice to make is shown by the form, not as an error besides.
      if (!why.exists && !why.confirmFolder) showError(err);
    }
  }

  /** The person allowed Tandem to read the folder: record that, then start again. */
  async function allowFolder(path: string) {
    try {
      await client.chooseFolder(path);
    } catch (err) {
      setJob({ ...IDLE, phase: 'error', error: errorMessage(err) });
      showError(err);
      return;
    }
    await start(null);
  }

  /** The desktop app's folder dialog. */
  async function browse() {
    try {
      const picked = await client.pickFolder('Choose a model folder to convert');
      if (picked?.path) {
        setDropHint(picked.model_folder ? null : 'This folder has no config.json and .safetensors files: is it the model\'s folder?');
        set({ src: picked.path });
      }
    } catch (err) {
      showError(err);
    }
  }

  async function cancel() {
    if (!job.job) return;
    try {
      await client.cancelConvert(job.job);
      setJob((s) => ({ ...s, phase: 'cancelled' }));
      controller.current?.abort();
    } catch (e) {
      showError(e);
    }
  }

  function onDrop(e: DragEvent) {
    e.preventDefault();
    setOver(false);
    const dt = e.dataTransfer;
    if (!dt) return;
    const file = dt.files?.[0] as (File & { path?: string }) | undefined;
    const path = file?.path || pathFromDroppedText(dt.getData('text/uri-list') || dt.getData('text/plain') || '');
    if (path) {
      setDropHint(null);
      set({ src: path });
    } else {
      setDropHint('A browser does not reveal where a dropped folder is: type or paste its path. (In the Tandem app, dropping and Browse… work.)');
    }
  }

  // While `auto` calibrates (before any tensor is written), the bar follows the modules measured.
  const cal = job.total === 0 && job.phase === 'running' ? job.calibration : null;
  const percent =
    job.total > 0 ? job.done / job.total : cal && cal.total > 0 ? cal.done / cal.total : job.phase === 'finished' ? 1 : 0;
  const left = cal ? eta(cal.done, cal.total, cal.since, Date.now()) : eta(job.done, job.total, job.writingSince, Date.now());
  const mixedBits = MIXED_BITS[form.recipe];
  const mixed = mixedBits != null;
  const placeholderName = suggestName(form.src, form.recipe, form.bits);

  return (
    <div class="page">
      <header class="page-header">
        <h1>Convert</h1>
      </header>
      <form class="convert" data-testid="convert-form" onSubmit={start} data-state={job.phase}>
        <div
          class={`dropzone ${over ? 'over' : ''}`}
          data-testid="convert-dropzone"
          onDragOver={(e) => {
            e.preventDefault();
            setOver(true);
          }}
          onDragLeave={() => setOver(false)}
          onDrop={onDrop}
        >
          <div class="dropzone-title">Drop a model folder here</div>
          <div class="dim small">A Hugging Face checkpoint (safetensors + config.json) or an MLX model</div>
          <input
            type="text"
            class="path-input"
            data-testid="convert-src"
            placeholder="/path/to/Qwen3.5-model"
            value={form.src}
            spellcheck={false}
            autocomplete="off"
            disabled={active}
            onInput={(e) => set({ src: (e.target as HTMLInputElement).value })}
          />
          {client.canPickFolder() && (
            <button type="button" class="button" data-testid="convert-browse" disabled={active} onClick={() => void browse()}>
              Browse…
            </button>
          )}
          {dropHint && <div class="notice small">{dropHint}</div>}
        </div>

        <div class="form-grid">
          <label class="field">
            <span class="field-label">Recipe</span>
            <select
              data-testid="convert-recipe"
              value={form.recipe}
              disabled={active}
              onChange={(e) => set({ recipe: (e.target as HTMLSelectElement).value as Recipe })}
            >
              {RECIPES.map((r) => (
                <option key={r.value} value={r.value}>
                  {r.label}
                </option>
              ))}
            </select>
            <span class="field-hint">{RECIPES.find((r) => r.value === form.recipe)?.hint}</span>
          </label>

          {form.recipe === 'auto' ? (
            <label class="field">
              <span class="field-label">Target bits per weight</span>
              <input
                type="number"
                step="0.1"
                min="2"
                max="8"
                data-testid="convert-target-bpw"
                value={form.targetBpw}
                disabled={active}
                onInput={(e) => set({ targetBpw: (e.target as HTMLInputElement).value })}
              />
            </label>
          ) : (
            <label class="field">
              <span class="field-label">Bits</span>
              <select
                data-testid="convert-bits"
                value={mixedBits ? 'mixed' : String(form.bits)}
                disabled={active || mixed}
                onChange={(e) => set({ bits: Number((e.target as HTMLSelectElement).value) })}
              >
                {/* A mixed recipe is not one width: it shows its range, not the last uniform choice. */}
                {mixedBits ? (
                  <option value="mixed">
                    {mixedBits[0]}–{mixedBits[1]}-bit (mixed)
                  </option>
                ) : (
                  BITS.map((b) => (
                    <option key={b} value={String(b)}>
                      {b}-bit
                    </option>
                  ))
                )}
              </select>
              {mixed && <span class="field-hint">set by the recipe</span>}
            </label>
          )}

          <label class="field">
            <span class="field-label">Group size</span>
            <select
              data-testid="convert-group-size"
              value={String(form.groupSize)}
              disabled={active}
              onChange={(e) => set({ groupSize: Number((e.target as HTMLSelectElement).value) })}
            >
              {GROUP_SIZES.map((g) => (
                <option key={g} value={String(g)}>
                  {g}
                </option>
              ))}
            </select>
          </label>

          <label class="field">
            <span class="field-label">MTP head</span>
            <select
              data-testid="convert-mtp"
              value={form.mtp}
              disabled={active}
              onChange={(e) => set({ mtp: (e.target as HTMLSelectElement).value as 'keep' | 'drop' })}
            >
              <option value="keep">Keep</option>
              <option value="drop">Drop</option>
            </select>
          </label>

          <label class="field">
            <span class="field-label">MTP head bits</span>
            <select
              data-testid="convert-mtp-bits"
              value={form.mtpBits}
              disabled={active || form.mtp === 'drop'}
              onChange={(e) => set({ mtpBits: (e.target as HTMLSelectElement).value })}
            >
              <option value="">Default</option>
              <option value="none">Unquantized</option>
              {[8, 6, 4].map((b) => (
                <option key={b} value={String(b)}>
                  {b}-bit
                </option>
              ))}
            </select>
          </label>

          <label class="field">
            <span class="field-label">Name</span>
            <input
              ref={nameRef}
              type="text"
              data-testid="convert-name"
              value={form.name}
              placeholder={placeholderName || 'from the folder’s name'}
              disabled={active}
              onInput={(e) => set({ name: (e.target as HTMLInputElement).value })}
            />
            <span class="field-hint">the new model’s folder under models_dir</span>
          </label>
        </div>

        <div class="convert-actions">
          {active ? (
            <button type="button" class="button button-stop" data-testid="convert-cancel" onClick={() => void cancel()} disabled={!job.job}>
              Cancel
            </button>
          ) : (
            <button type="submit" class="button button-primary" data-testid="convert-start" disabled={!form.src.trim()}>
              Convert
            </button>
          )}
          {job.predictedBytes != null && (
            <span class="predicted" data-testid="convert-predicted">
              predicted <b>{fmt.bytes(job.predictedBytes)}</b>
              {job.predictedBpw != null && <> · {fmt.fixed(job.predictedBpw, 2)} bits/weight</>}
            </span>
          )}
        </div>

        {job.phase !== 'idle' && (
          <div class="convert-status" data-testid="convert-status" data-state={job.phase}>
            {job.phase === 'error' && job.confirmFolder && (
              <div class="notice question">
                <div data-testid="convert-question">{job.error}</div>
                <div class="question-actions">
                  <button
                    type="button"
                    class="button button-primary"
                    data-testid="convert-allow-folder"
                    onClick={() => void allowFolder(job.confirmFolder ?? '')}
                  >
                    Allow and convert
                  </button>
                  <button type="button" class="link-button" data-testid="convert-deny-folder" onClick={() => setJob(IDLE)}>
                    Cancel
                  </button>
                </div>
              </div>
            )}
            {/* A conversion refused before it started has no progress to show. */}
            {!(job.phase === 'error' && job.job == null) && (
              <div
                class="progress"
                data-testid="convert-progress"
                role="progressbar"
                aria-valuemin={0}
                aria-valuemax={job.total || 1}
                aria-valuenow={job.done}
                data-done={job.done}
                data-total={job.total}
              >
                <div class={`progress-fill ${job.phase}`} style={{ width: `${percent * 100}%` }} />
              </div>
            )}
            <div class="progress-text small">
              {job.phase === 'starting' && 'Starting…'}
              {job.phase === 'running' &&
                (job.total > 0
                  ? `${job.done} / ${job.total} tensors (${fmt.percent(percent)})`
                  : cal
                    ? `Calibrating: ${cal.done} / ${cal.total} modules measured over ${fmt.integer(cal.tokens)} tokens`
                    : 'Planning…')}
              {job.phase === 'running' && left && <span class="dim" data-testid="convert-eta">{` · ${left}`}</span>}
              {cal && cal.module && (
                <span class="dim mono" data-testid="convert-calibrating">
                  {' '}
                  {cal.module}
                </span>
              )}
              {job.phase === 'running' && job.tensor && (
                <span class="dim mono" data-testid="convert-tensor">
                  {' '}
                  {job.tensor}
                </span>
              )}
              {job.phase === 'cancelled' && <span data-testid="convert-cancelled">Cancelled.</span>}
              {job.phase === 'error' && !job.confirmFolder && (
                <span class="error-text" data-testid="convert-error">
                  {job.error}
                </span>
              )}

              {job.phase === 'error' && job.exists && (
                <span class="convert-choice">
                  {' '}
                  <button type="button" class="button" data-testid="convert-replace" onClick={() => void start(null, true)}>
                    Replace it
                  </button>{' '}
                  <button
                    type="button"
                    class="link-button"
                    data-testid="convert-rename"
                    onClick={() => {
                      setJob(IDLE);
                      nameRef.current?.focus();
                    }}
                  >
                    Choose another name
                  </button>
                </span>
              )}
            </div>
            {job.phase === 'finished' && job.result && (
              <div class="notice notice-ok" data-testid="convert-result">
                <div>
                  Done: <b>{fmt.bytes(job.result.bytes)}</b> at {fmt.fixed(job.result.bpw, 2)} bits/weight
                </div>
                <div class="mono small" data-testid="convert-result-path">
                  {job.result.path}
                </div>
                <button type="button" class="link-button" onClick={props.onShowModels}>
                  Show in Models
                </button>
              </div>
            )}
          </div>
        )}
      </form>
    </div>
  );
}
