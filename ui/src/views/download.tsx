// Download: a model from Hugging Face (ORG/NAME[@REVISION]) into the Hub cache, linked into the models
// folder. Downloads are engine jobs: they go on while this page is closed and are found again on reload.

import { useEffect, useRef, useState } from 'preact/hooks';
import { api as defaultApi, type Api, errorMessage, isAbort } from '../api';
import { showError } from '../components/banner';
import * as fmt from '../format';
import { onFolderDropped } from '../shell';
import type { DownloadView } from '../generated';

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
  const followed = useRef(new Map<string, AbortController>());

  const upsert = (v: DownloadView) =>
    setDownloads((all) => (all.some((d) => d.job === v.job) ? all.map((d) => (d.job === v.job ? v : d)) : [...all, v]));

  /** Polls the job while its events arrive (the view carries speed and totals). */
  async function follow(job: string) {
    if (followed.current.has(job)) return;
    const c = new AbortController();
    followed.current.set(job, c);
    try {
      for await (const ev of client.pullEvents(job, c.signal)) {
        upsert(await client.pullStatus(job, c.signal));
        if (ev.event === 'finished') props.onFinished();
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
    return () => {
      c.abort();
      for (const f of followed.current.values()) f.abort();
    };
  }, [client]);

  async function start(e: Event | null, again?: DownloadView) {
    e?.preventDefault();
    const target = again ? `${again.repo}@${again.revision}` : repo.trim();
    if (!target || busy) return;
    setBusy(true);
    try {
      const v = await client.startPull({ repo: target, include: again ? again.include : includeOf(include) });
      upsert(v);
      void follow(v.job);
    } catch (err) {
      showError(errorMessage(err));
    } finally {
      setBusy(false);
    }
  }

  return (
    <div class="page">
      <header class="page-header">
        <h1>Download</h1>
      </header>
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
            onInput={(e) => setRepo((e.target as HTMLInputElement).value)}
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
        <button type="submit" class="button button-primary" data-testid="download-start" disabled={busy || !repo.trim()}>
          Download
        </button>
      </form>
      <p class="dim small download-hint">
        Files go to the Hugging Face cache (shared with other tools: what they fetched is not fetched again), are checked
        against the Hub's checksums, and appear under Models. A stopped download resumes where it was.
      </p>
      <div class="download-list" data-testid="download-list">
        {downloads
          .slice()
          .reverse()
          .map((d) => (
            <DownloadRow key={d.job} d={d} client={client} onShowModels={props.onShowModels} onResume={() => void start(null, d)} />
          ))}
      </div>
    </div>
  );
}

function DownloadRow(props: { d: DownloadView; client: Api; onShowModels: () => void; onResume: () => void }) {
  const d = props.d;
  const running = d.state === 'queued' || d.state === 'running';
  const share = d.total_bytes > 0 ? d.done_bytes / d.total_bytes : d.state === 'finished' ? 1 : 0;
  const left = running ? downloadEta(d) : null;
  return (
    <div class="download-row" data-testid="download-row" data-repo={d.repo} data-state={d.state}>
      <div class="download-title">
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
      {d.fit && (
        <div class={`small ${d.fit.fits ? 'dim' : 'warn-text'}`} data-testid="download-fit" data-fits={String(d.fit.fits)}>
          {d.fit.fits
            ? `Runs here: needs about ${fmt.bytes(d.fit.need)} of this machine's ${fmt.bytes(d.memory_total)}.`
            : d.fit.recommended_bits != null
              ? `Too large for this machine as it is (about ${fmt.bytes(d.fit.need)} of ${fmt.bytes(d.memory_total)}): convert it to ${d.fit.recommended_bits} bits or fewer to run it here.`
              : `Too large for this machine (about ${fmt.bytes(d.fit.need)} of ${fmt.bytes(d.memory_total)}), even quantized.`}
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
            <button
              type="button"
              class="link-button"
              data-testid="download-convert"
              title="Quantize it with Convert, keeping its MTP head"
              onClick={() => d.path && onFolderDropped(d.path)}
            >
              Convert…
            </button>
          </>
        )}
      </div>
    </div>
  );
}
