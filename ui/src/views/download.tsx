// Download: a model from Hugging Face (ORG/NAME[@REVISION]) into the Hub cache, linked into the models
// folder. Downloads are engine jobs: they go on while this page is closed and are found again on reload.

import { useEffect, useRef, useState } from 'preact/hooks';
import { api as defaultApi, type Api, errorMessage, isAbort } from '../api';
import { showError } from '../components/banner';
import * as fmt from '../format';
import { onFolderDropped } from '../shell';
import type { CatalogView, DownloadView, Fit, HubModel, ModelStatus, PreviewView } from '../generated';

/** Sent on `window` when a download starts elsewhere in the UI (a graft from Models), detail: its view. */
export const DOWNLOAD_STARTED = 'tandem:download-started';

/** One sentence on whether a model of this fit runs on a machine of `memoryTotal` bytes. */
export function fitText(fit: Fit, memoryTotal: number): string {
  const context = fit.context_tokens > 0 ? ` with a ${fmt.integer(fit.context_tokens)}-token context` : '';
  if (fit.fits) return `Runs here: needs about ${fmt.bytes(fit.need)}${context} of this machine's ${fmt.bytes(memoryTotal)}.`;
  if (fit.recommended_bits != null)
    return `Too large for this machine as it is (about ${fmt.bytes(fit.need)}${context} of ${fmt.bytes(memoryTotal)}): convert it to ${fit.recommended_bits} bits or fewer to run it here.`;
  return `Too large for this machine (about ${fmt.bytes(fit.need)}${context} of ${fmt.bytes(memoryTotal)}), even quantized.`;
}

/** "27B · raw bf16 · MTP head" for a catalogue entry. */
export function catalogLabel(e: CatalogView): string {
  const params = e.params_b >= 1 ? `${fmt.num(e.params_b)}B` : `${fmt.num(e.params_b * 1000)}M`;
  const format = e.format === 'hf' ? 'raw bf16' : e.bits >= 16 ? 'MLX bf16' : `MLX ${e.bits}-bit`;
  const head = e.mtp ? 'MTP head' : e.base ? 'no MTP head (graftable)' : 'no MTP head';
  return [params, format, head, e.vision ? 'vision' : null].filter(Boolean).join(' · ');
}

/** Catalogue entries whose repo contains every word of `query` (all of them for an empty query). */
export function matchCatalog(entries: CatalogView[], query: string): CatalogView[] {
  const words = query.toLowerCase().split(/\s+/).filter(Boolean);
  return entries.filter((e) => words.every((w) => e.repo.toLowerCase().includes(w)));
}

/** "about 40 s left" at the download's speed; null while unknown. */
export function downloadEta(v: Pick<DownloadView, 'total_bytes' | 'done_bytes' | 'bytes_per_s'>): string | null {
  const left = v.total_bytes - v.done_bytes;
  if (v.bytes_per_s <= 0 || left <= 0) return null;
  const s = left / v.bytes_per_s;
  if (s < 90) return `about ${Math.max(1, Math.round(s))} s left`;
  if (s < 90 * 60) return `about ${Math.round(s / 60)} min left`;
  return `about ${(s / 3600).toFixed(1)} h left`;
}

/** Globs from the include field: separated by commas or spaces. */
export function includeOf(text: string): string[] {
  return text
    .split(/[\s,]+/)
    .map((s) => s.trim())
    .filter(Boolean);
}

export function DownloadPage(props: { client?: Api; onFinished: () => void; onShowModels: () => void }) {
  const client = props.client ?? defaultApi;
  const [repo, setRepo] = useState('');
  const [include, setInclude] = useState('');
  const [busy, setBusy] = useState(false);
  const [downloads, setDownloads] = useState<DownloadView[]>([]);
  const [catalog, setCatalog] = useState<CatalogView[]>([]);
  const [memoryTotal, setMemoryTotal] = useState(0);
  const [query, setQuery] = useState('');
  const [found, setFound] = useState<HubModel[] | null>(null);
  const [preview, setPreview] = useState<PreviewView | null>(null);
  const [previewError, setPreviewError] = useState<string | null>(null);
  const [checking, setChecking] = useState(false);
  const [models, setModels] = useState<ModelStatus[]>([]);
  const followed = useRef(new Map<string, AbortController>());

  const upsert = (v: DownloadView) =>
    setDownloads((all) => (all.some((d) => d.job === v.job) ? all.map((d) => (d.job === v.job ? v : d)) : [...all, v]));

  const refreshModels = () => client.adminModels().then(setModels, () => undefined);
  const refreshCatalog = () =>
    client.catalog().then(
      (c) => {
        setCatalog(c.entries);
        setMemoryTotal(c.memory_total);
      },
      () => undefined,
    );

  /** Polls the job while its events arrive (the view carries speed and totals). */
  async function follow(job: string) {
    if (followed.current.has(job)) return;
    const c = new AbortController();
    followed.current.set(job, c);
    try {
      for await (const ev of client.pullEvents(job, c.signal)) {
        upsert(await client.pullStatus(job, c.signal));
        if (ev.event === 'finished') {
          props.onFinished();
          void refreshModels();
          void refreshCatalog();
        }
      }
      upsert(await client.pullStatus(job, c.signal));
    } catch (e) {
      if (!isAbort(e) && !c.signal.aborted) showError(e);
    } finally {
      followed.current.delete(job);
    }
  }

  useEffect(() => {
    const c = new AbortController();
    client.listPulls(c.signal).then(
      (list) => {
        setDownloads(list);
        for (const d of list) if (d.state === 'queued' || d.state === 'running') void follow(d.job);
      },
      (e) => !isAbort(e) && showError(e),
    );
    void refreshCatalog();
    void refreshModels();
    const started = (e: Event) => {
      const v = (e as CustomEvent<DownloadView>).detail;
      upsert(v);
      void follow(v.job);
    };
    window.addEventListener(DOWNLOAD_STARTED, started);
    return () => {
      c.abort();
      window.removeEventListener(DOWNLOAD_STARTED, started);
      for (const f of followed.current.values()) f.abort();
    };
  }, [client]);

  // The Hub's search, a moment after typing stops (three letters at least).
  useEffect(() => {
    const q = query.trim();
    if (q.length < 3) {
      setFound(null);
      return;
    }
    const c = new AbortController();
    const t = setTimeout(() => {
      client.searchHub(q, c.signal).then(setFound, (e) => {
        if (!isAbort(e)) setFound([]);
      });
    }, 400);
    return () => {
      clearTimeout(t);
      c.abort();
    };
  }, [query, client]);

  async function check(target: string) {
    const r = target.trim();
    if (!r) return;
    setChecking(true);
    setPreview(null);
    setPreviewError(null);
    try {
      setPreview(await client.previewRepo(r));
    } catch (err) {
      setPreviewError(errorMessage(err));
    } finally {
      setChecking(false);
    }
  }

  function choose(r: string) {
    setRepo(r);
    void check(r);
  }

  async function start(e: Event | null, again?: DownloadView) {
    e?.preventDefault();
    const target = again ? `${again.repo}@${again.revision}` : repo.trim();
    if (!target || busy) return;
    setBusy(true);
    try {
      const v = again?.graft_onto
        ? await client.graftHead(again.graft_onto, { from: target })
        : await client.startPull({ repo: target, include: again ? again.include : includeOf(include) });
      upsert(v);
      void follow(v.job);
    } catch (err) {
      showError(errorMessage(err));
    } finally {
      setBusy(false);
    }
  }

  async function graft(model: string) {
    try {
      const v = await client.graftHead(model);
      upsert(v);
      void follow(v.job);
    } catch (err) {
      showError(errorMessage(err));
    }
  }

  const shown = matchCatalog(catalog, query);
  const inCatalog = new Set(catalog.map((e) => e.repo.toLowerCase()));
  const fromHub = (found ?? []).filter((m) => !inCatalog.has(m.id.toLowerCase()));
  return (
    <div class="page">
      <header class="page-header">
        <h1>Download</h1>
      </header>
      <section class="catalog" data-testid="catalog">
        <label class="field">
          <span class="field-label">Find a model</span>
          <input
            type="search"
            data-testid="catalog-search"
            placeholder="Qwen3.5 27B, 4bit, mlx-community…"
            value={query}
            spellcheck={false}
            autocomplete="off"
            onInput={(e) => setQuery((e.target as HTMLInputElement).value)}
          />
        </label>
        <div class="catalog-list">
          {shown.map((e) => (
            <div class="catalog-row" key={e.repo} data-testid="catalog-row" data-repo={e.repo} data-fits={String(e.fit.fits)}>
              <div>
                <b>{e.repo}</b> <span class="dim small">{catalogLabel(e)}</span>
                {e.note && <div class="dim small">{e.note}</div>}
                <div class={`small ${e.fit.fits ? 'dim' : 'warn-text'}`}>
                  About {fmt.bytes(e.estimated_bytes)} of weights. {fitText(e.fit, memoryTotal)}
                </div>
              </div>
              <div class="catalog-actions">
                {e.model ? (
                  <span class="small" data-testid="catalog-downloaded">
                    Downloaded as <b>{e.model}</b>
                  </span>
                ) : (
                  <button type="button" class="button" data-testid="catalog-choose" onClick={() => choose(e.repo)}>
                    Choose
                  </button>
                )}
              </div>
            </div>
          ))}
          {shown.length === 0 && query.trim() && <div class="dim small">No catalogue entry matches.</div>}
        </div>
        {fromHub.length > 0 && (
          <div class="hub-results" data-testid="hub-results">
            <div class="field-label">On the Hub</div>
            {fromHub.map((m) => (
              <button type="button" class="link-button hub-result" key={m.id} data-testid="hub-result" data-repo={m.id} onClick={() => choose(m.id)}>
                {m.id} <span class="dim small">{fmt.integer(m.downloads)} downloads</span>
              </button>
            ))}
          </div>
        )}
      </section>
      <form class="download-form" data-testid="download-form" onSubmit={(e) => void start(e)}>
        <label class="field">
          <span class="field-label">Hugging Face repo</span>
          <input
            type="text"
            class="path-input"
            data-testid="download-repo"
            placeholder="Qwen/Qwen3.5-4B or mlx-community/Qwen3.5-4B-4bit (optionally @revision)"
            value={repo}
            spellcheck={false}
            autocomplete="off"
            onInput={(e) => {
              setRepo((e.target as HTMLInputElement).value);
              setPreview(null);
              setPreviewError(null);
            }}
          />
        </label>
        <label class="field">
          <span class="field-label">Only these files</span>
          <input
            type="text"
            data-testid="download-include"
            placeholder="every file (or globs: *.json, *.safetensors)"
            value={include}
            spellcheck={false}
            onInput={(e) => setInclude((e.target as HTMLInputElement).value)}
          />
        </label>
        <button type="button" class="button" data-testid="download-check" disabled={checking || !repo.trim()} onClick={() => void check(repo)}>
          {checking ? 'Checking…' : 'Check'}
        </button>
        <button type="submit" class="button button-primary" data-testid="download-start" disabled={busy || !repo.trim()}>
          Download
        </button>
      </form>
      {preview && <PreviewPanel p={preview} />}
      {previewError && (
        <div class="notice notice-warn small" data-testid="download-preview-error">
          {previewError}
        </div>
      )}
      <p class="dim small download-hint">
        Files go to the Hugging Face cache (shared with other tools: what they fetched is not fetched again), are checked
        against the Hub's checksums, and appear under Models. A stopped download resumes where it was.
      </p>
      <div class="download-list" data-testid="download-list">
        {downloads
          .slice()
          .reverse()
          .map((d) => (
            <DownloadRow
              key={d.job}
              d={d}
              client={client}
              model={models.find((m) => m.name === d.model)}
              onShowModels={props.onShowModels}
              onResume={() => void start(null, d)}
              onGraft={(m) => void graft(m)}
            />
          ))}
      </div>
    </div>
  );
}

/** What a repo holds and whether it fits, before its download. */
function PreviewPanel({ p }: { p: PreviewView }) {
  return (
    <div class="notice small download-preview" data-testid="download-preview" data-fits={String(p.fit.fits)} data-mtp={String((p.mtp_tensors ?? 0) > 0)}>
      <div>
        <b>{p.repo}</b> <span class="dim mono">{p.commit.slice(0, 12)}</span>: {p.files.length} files, {fmt.bytes(p.total_bytes)} (
        {fmt.bytes(p.weight_bytes)} of weights{p.quantized ? ', quantized' : ''}
        {p.format ? `, ${p.format === 'hf' ? 'raw checkpoint' : 'MLX layout'}` : ''}
        {p.vision ? ', vision' : ''}).
      </div>
      <div class={p.fit.fits ? '' : 'warn-text'}>{fitText(p.fit, p.memory_total)}</div>
      <div data-testid="download-advice">{p.advice}</div>
    </div>
  );
}

function DownloadRow(props: {
  d: DownloadView;
  client: Api;
  model?: ModelStatus;
  onShowModels: () => void;
  onResume: () => void;
  onGraft: (model: string) => void;
}) {
  const d = props.d;
  const m = props.model;
  const headless = m != null && !m.mtp.available && m.format === 'mlx' && m.base_model != null;
  const running = d.state === 'queued' || d.state === 'running';
  const share = d.total_bytes > 0 ? d.done_bytes / d.total_bytes : d.state === 'finished' ? 1 : 0;
  const left = running ? downloadEta(d) : null;
  return (
    <div class="download-row" data-testid="download-row" data-repo={d.repo} data-state={d.state} data-graft-onto={d.graft_onto ?? undefined}>
      <div class="download-title">
        {d.graft_onto && <span>MTP head for <b>{d.graft_onto}</b> from </span>}
        <b>{d.repo}</b> <span class="dim">@{d.revision}</span>
        {d.commit && <span class="dim mono small"> {d.commit.slice(0, 12)}</span>}
      </div>
      <div class="progress" data-testid="download-progress" data-done={d.done_bytes} data-total={d.total_bytes}>
        <div class={`progress-fill ${d.state === "finished" ? "finished" : d.state === "error" ? "error" : ""}`} style={{ width: `${Math.round(share * 100)}%` }} />
      </div>
      <div class="small">
        {fmt.bytes(d.done_bytes)} of {fmt.bytes(d.total_bytes)}
        {d.cached_bytes > 0 && <span class="dim"> ({fmt.bytes(d.cached_bytes)} already here)</span>}
        {running && d.bytes_per_s > 0 && <span> · {fmt.bytes(d.bytes_per_s)}/s</span>}
        {left && <span> · {left}</span>}
        {running && d.file && <span class="dim mono"> · {d.file}</span>}
      </div>
      {d.fit && !d.graft_onto && (
        <div class={`small ${d.fit.fits ? 'dim' : 'warn-text'}`} data-testid="download-fit" data-fits={String(d.fit.fits)}>
          {fitText(d.fit, d.memory_total)}
        </div>
      )}
      {d.state === 'error' && (
        <div class="error-text small" data-testid="download-error">
          {d.error}
        </div>
      )}
      {d.state === 'cancelled' && <div class="small">Cancelled: what arrived is kept, and downloading again resumes it.</div>}
      <div class="download-actions">
        {(d.state === 'cancelled' || d.state === 'error') && (
          <button type="button" class="link-button" data-testid="download-resume" onClick={props.onResume}>
            {d.state === 'cancelled' ? 'Resume' : 'Try again'}
          </button>
        )}
        {running && (
          <button type="button" class="link-button" data-testid="download-cancel" onClick={() => void props.client.cancelPull(d.job).catch(showError)}>
            Cancel
          </button>
        )}
        {d.state === 'finished' && d.model && (
          <>
            <span data-testid="download-done">
              Ready as model <b>{d.model}</b>.
            </span>{' '}
            <button type="button" class="link-button" onClick={props.onShowModels}>
              Show in Models
            </button>{' '}
            {!d.graft_onto && (
              <button
                type="button"
                class="link-button"
                data-testid="download-convert"
                title="Quantize it with Convert, keeping its MTP head"
                onClick={() => d.path && onFolderDropped(d.path)}
              >
                Convert…
              </button>
            )}{' '}
            {headless && m && (
              <button
                type="button"
                class="link-button"
                data-testid="download-graft"
                title={`Fetch only the files of ${m.base_model} that hold its MTP head, graft it, and check it with the acceptance probe`}
                onClick={() => props.onGraft(m.name)}
              >
                Get its MTP head from {m.base_model}
              </button>
            )}
          </>
        )}
      </div>
    </div>
  );
}
