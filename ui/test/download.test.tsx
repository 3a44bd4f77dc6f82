import { render } from 'preact';
import { act } from 'preact/test-utils';
import { afterEach, describe, expect, it } from 'vitest';
import { Api } from '../src/api';
import { dismiss } from '../src/components/banner';
import { DownloadPage, catalogLabel, downloadEta, fitText, includeOf, matchCatalog } from '../src/views/download';
import type { CatalogView, DownloadView, PreviewView } from '../src/generated';
import { json, mockFetch, modelStatus, sse } from './helpers';

let root: HTMLElement | null = null;
afterEach(() => {
  if (root) {
    act(() => render(null, root!));
    root.remove();
    root = null;
  }
  dismiss();
});

const view = (over: Partial<DownloadView> = {}): DownloadView => ({
  job: '1',
  repo: 'tandem/tiny',
  revision: 'main',
  include: [],
  graft_onto: null,
  state: 'running',
  created_ms: 0,
  finished_ms: null,
  commit: '0123456789abcdef0123456789abcdef01234567',
  total_bytes: 1000,
  done_bytes: 250,
  cached_bytes: 0,
  file: 'model.safetensors',
  bytes_per_s: 50,
  fit: null,
  memory_total: 0,
  model: null,
  path: null,
  error: null,
  last_event: null,
  ...over,
});

describe('download figures', () => {
  it('give an ETA from the speed, none while it is unknown', () => {
    expect(downloadEta(view())).toBe('about 15 s left');
    expect(downloadEta(view({ bytes_per_s: 0 }))).toBeNull();
    expect(downloadEta(view({ done_bytes: 1000 }))).toBeNull();
    expect(downloadEta(view({ total_bytes: 1e9, done_bytes: 0, bytes_per_s: 1e6 }))).toBe('about 17 min left');
  });
  it('read include globs separated by commas or spaces', () => {
    expect(includeOf(' *.json, *.safetensors  tokenizer.model ')).toEqual(['*.json', '*.safetensors', 'tokenizer.model']);
    expect(includeOf('')).toEqual([]);
  });
});

describe('the Download page', () => {
  it('starts a pull, follows it to the end and offers Convert', async () => {
    let polls = 0;
    let finished = 0;
    const mock = mockFetch({
      'GET /api/pull': () => json({ downloads: [] }),
      'POST /api/pull': () => json(view({ state: 'queued', done_bytes: 0, bytes_per_s: 0 }), 202),
      'GET /api/pull/1/events': () =>
        sse([
          `data: ${JSON.stringify({ event: 'progress', file: 'model.safetensors', file_done: 250, file_size: 900, done: 250, total: 1000 })}\n\n`,
          `data: ${JSON.stringify({ event: 'finished', model: 'tiny', path: '/m/models/tiny', pulled: {} })}\n\n`,
        ]),
      'GET /api/pull/1': () =>
        json(++polls < 2 ? view() : view({ state: 'finished', done_bytes: 1000, model: 'tiny', path: '/m/models/tiny' })),
    });
    root = document.createElement('div');
    document.body.appendChild(root);
    act(() =>
      render(<DownloadPage client={new Api('', mock.fetch, null)} onFinished={() => void finished++} onShowModels={() => {}} />, root!),
    );
    const input = root.querySelector('[data-testid="download-repo"]') as HTMLInputElement;
    await act(async () => {
      input.value = 'tandem/tiny';
      input.dispatchEvent(new Event('input', { bubbles: true }));
    });
    await act(async () => {
      (root!.querySelector('[data-testid="download-start"]') as HTMLButtonElement).click();
    });
    for (let i = 0; i < 100 && !root.querySelector('[data-testid="download-done"]'); i++) {
      await act(async () => {
        await new Promise((r) => setTimeout(r, 10));
      });
    }
    const row = root.querySelector('[data-testid="download-row"]') as HTMLElement;
    expect(row.dataset.state).toBe('finished');
    expect(row.textContent).toContain('Ready as model tiny');
    expect(row.querySelector('[data-testid="download-convert"]')).not.toBeNull();
    expect(row.querySelector('[data-testid="download-fit"]')).toBeNull(); // no listing figures in this mock
    expect(finished).toBe(1);
    const post = mock.calls.find((c) => c.method === 'POST');
    expect(post?.body).toEqual({ repo: 'tandem/tiny', include: [] });
  });
});

describe('a download too large for this machine', () => {
  it('says so and names the quantization that would run', async () => {
    const big = view({ state: 'running', memory_total: 32e9, fit: { need: 60e9, fits: false, recommended_bits: 5, state_bytes: 0, context_tokens: 0 } });
    const mock = mockFetch({ 'GET /api/pull': () => json({ downloads: [big] }), 'GET /api/pull/1/events': () => sse([]), 'GET /api/pull/1': () => json(big) });
    root = document.createElement('div');
    document.body.appendChild(root);
    act(() => render(<DownloadPage client={new Api('', mock.fetch, null)} onFinished={() => {}} onShowModels={() => {}} />, root!));
    for (let i = 0; i < 50 && !root.querySelector('[data-testid="download-fit"]'); i++) {
      await act(async () => {
        await new Promise((r) => setTimeout(r, 10));
      });
    }
    const fit = root.querySelector('[data-testid="download-fit"]') as HTMLElement;
    expect(fit.dataset.fits).toBe('false');
    expect(fit.textContent).toContain('convert it to 5 bits or fewer');
  });
});

describe('a cancelled download', () => {
  it('resumes with the same repo, revision and files', async () => {
    const cancelled = view({ state: 'cancelled', revision: 'v2', include: ['*.json'] });
    const mock = mockFetch({
      'GET /api/pull': () => json({ downloads: [cancelled] }),
      'POST /api/pull': () => json(view({ job: '2', state: 'queued' }), 202),
      'GET /api/pull/2/events': () => sse([]),
      'GET /api/pull/2': () => json(view({ job: '2', state: 'finished', model: 'tiny', path: '/m/tiny' })),
    });
    root = document.createElement('div');
    document.body.appendChild(root);
    act(() => render(<DownloadPage client={new Api('', mock.fetch, null)} onFinished={() => {}} onShowModels={() => {}} />, root!));
    for (let i = 0; i < 50 && !root.querySelector('[data-testid="download-resume"]'); i++) {
      await act(async () => {
        await new Promise((r) => setTimeout(r, 10));
      });
    }
    expect(root.querySelector('[data-testid="download-resume"]')!.textContent).toBe('Resume');
    await act(async () => {
      (root!.querySelector('[data-testid="download-resume"]') as HTMLButtonElement).click();
    });
    for (let i = 0; i < 50 && !mock.calls.some((c) => c.method === 'POST'); i++) {
      await act(async () => {
        await new Promise((r) => setTimeout(r, 10));
      });
    }
    expect(mock.calls.find((c) => c.method === 'POST')?.body).toEqual({ repo: 'tandem/tiny@v2', include: ['*.json'] });
  });
});

const entry = (over: Partial<CatalogView> = {}): CatalogView => ({
  repo: 'Qwen/Qwen3.5-27B',
  format: 'hf',
  params_b: 27,
  bits: 16,
  mtp: true,
  vision: true,
  estimated_bytes: 54e9,
  fit: { need: 59.6e9, fits: false, recommended_bits: 5, state_bytes: 0, context_tokens: 0 },
  model: null,
  ...over,
});

async function until(root: HTMLElement, selector: string, ms = 2000) {
  for (let i = 0; i < ms / 10 && !root.querySelector(selector); i++) {
    await act(async () => {
      await new Promise((r) => setTimeout(r, 10));
    });
  }
  return root.querySelector(selector) as HTMLElement | null;
}

describe('the catalogue figures', () => {
  it('say what fits with the context counted, and label entries', () => {
    const fit = { need: 20e9, fits: true, recommended_bits: null, state_bytes: 2e9, context_tokens: 32768 };
    expect(fitText(fit, 64e9)).toBe("Runs here: needs about 20.0 GB with a 32,768-token context of this machine's 64.0 GB.");
    expect(fitText({ ...fit, fits: false, recommended_bits: 4 }, 16e9)).toContain('convert it to 4 bits or fewer');
    expect(fitText({ ...fit, fits: false, context_tokens: 0 }, 16e9)).not.toContain('context');
    expect(catalogLabel(entry())).toBe('27B · raw bf16 · MTP head · vision');
    expect(catalogLabel(entry({ format: 'mlx', bits: 4, mtp: false, base: 'Qwen/Qwen3.5-27B', vision: false, params_b: 0.8 }))).toBe(
      '800M · MLX 4-bit · no MTP head (graftable)',
    );
    const all = [entry(), entry({ repo: 'mlx-community/Qwen3.5-27B-4bit' }), entry({ repo: 'Qwen/Qwen3.5-4B' })];
    expect(matchCatalog(all, '27b 4BIT').map((e) => e.repo)).toEqual(['mlx-community/Qwen3.5-27B-4bit']);
    expect(matchCatalog(all, '  ')).toHaveLength(3);
  });
});

describe('finding a model', () => {
  it('filters the catalogue, adds the Hub search, and previews the chosen repo before downloading', async () => {
    const preview: PreviewView = {
      repo: 'mlx-community/Qwen3.5-4B-4bit',
      revision: 'main',
      commit: 'abcdefabcdefabcdefabcdefabcdefabcdefabcd',
      files: [],
      total_bytes: 2.6e9,
      weight_bytes: 2.5e9,
      quantized: true,
      format: 'mlx',
      vision: false,
      mtp_declared: 1,
      mtp_tensors: 0,
      head_files: [],
      base_model: 'Qwen/Qwen3.5-4B',
      fit: { need: 3.2e9, fits: true, recommended_bits: null, state_bytes: 0.4e9, context_tokens: 32768 },
      memory_total: 16e9,
      advice: 'It runs on this machine as it is. It has no MTP head (its converter dropped it): after the download, get it from Qwen/Qwen3.5-4B.',
    };
    const mock = mockFetch({
      'GET /api/pull': () => json({ downloads: [] }),
      'GET /api/models': () => json({ models: [] }),
      'GET /api/catalog': () =>
        json({
          entries: [entry(), entry({ repo: 'Qwen/Qwen3.5-4B', params_b: 4, fit: { ...entry().fit, fits: true }, model: 'Qwen3.5-4B' })],
          memory_total: 16e9,
        }),
      'GET /api/hub/search?q=qwen3.5-4b': () => json({ models: [{ id: 'Qwen/Qwen3.5-4B', downloads: 9, likes: 1, tags: [] }, { id: 'mlx-community/Qwen3.5-4B-4bit', downloads: 5, likes: 0, tags: [] }] }),
      'GET /api/hub/preview?repo=mlx-community%2FQwen3.5-4B-4bit': () => json(preview),
    });
    root = document.createElement('div');
    document.body.appendChild(root);
    act(() => render(<DownloadPage client={new Api('', mock.fetch, null)} onFinished={() => {}} onShowModels={() => {}} />, root!));
    await until(root, '[data-testid="catalog-row"]');
    expect(root.querySelectorAll('[data-testid="catalog-row"]')).toHaveLength(2);
    const big = root.querySelector('[data-repo="Qwen/Qwen3.5-27B"]') as HTMLElement;
    expect(big.dataset.fits).toBe('false');
    expect(big.textContent).toContain('convert it to 5 bits or fewer');
    expect(root.querySelector('[data-repo="Qwen/Qwen3.5-4B"] [data-testid="catalog-downloaded"]')?.textContent).toContain('Qwen3.5-4B');

    const search = root.querySelector('[data-testid="catalog-search"]') as HTMLInputElement;
    await act(async () => {
      search.value = 'qwen3.5-4b';
      search.dispatchEvent(new Event('input', { bubbles: true }));
    });
    expect(root.querySelectorAll('[data-testid="catalog-row"]')).toHaveLength(1);
    // The Hub's results, without the repos the catalogue already shows.
    const hit = await until(root, '[data-testid="hub-result"]');
    expect([...root.querySelectorAll('[data-testid="hub-result"]')].map((b) => (b as HTMLElement).dataset.repo)).toEqual([
      'mlx-community/Qwen3.5-4B-4bit',
    ]);
    await act(async () => hit!.click());
    const panel = await until(root, '[data-testid="download-preview"]');
    expect((root.querySelector('[data-testid="download-repo"]') as HTMLInputElement).value).toBe('mlx-community/Qwen3.5-4B-4bit');
    expect(panel!.dataset.mtp).toBe('false');
    expect(panel!.textContent).toContain('with a 32,768-token context');
    expect(panel!.textContent).toContain('get it from Qwen/Qwen3.5-4B');
  });

  it('offers the MTP head of its base for a finished head-less conversion and follows the graft', async () => {
    const done = view({ state: 'finished', done_bytes: 1000, model: 'tiny-mlx', path: '/m/models/tiny-mlx' });
    const grafting = view({ job: '2', repo: 'tandem/tiny', graft_onto: 'tiny-mlx', state: 'queued' });
    const mock = mockFetch({
      'GET /api/pull': () => json({ downloads: [done] }),
      'GET /api/catalog': () => json({ entries: [], memory_total: 0 }),
      'GET /api/models': () =>
        json({ models: [modelStatus({ name: 'tiny-mlx', id: 'tiny-mlx', base_model: 'tandem/tiny', mtp: { ...modelStatus().mtp, available: false } })] }),
      'POST /api/models/tiny-mlx/graft': () => json(grafting, 202),
      'GET /api/pull/2/events': () => sse([]),
      'GET /api/pull/2': () => json({ ...grafting, state: 'running' }),
    });
    root = document.createElement('div');
    document.body.appendChild(root);
    act(() => render(<DownloadPage client={new Api('', mock.fetch, null)} onFinished={() => {}} onShowModels={() => {}} />, root!));
    const button = await until(root, '[data-testid="download-graft"]');
    expect(button!.textContent).toContain('Get its MTP head from tandem/tiny');
    await act(async () => button!.click());
    await until(root, '[data-testid="download-row"][data-state="running"]');
    const rows = [...root.querySelectorAll('[data-testid="download-row"]')] as HTMLElement[];
    expect(rows[0]!.textContent).toContain('MTP head for tiny-mlx from tandem/tiny');
    expect(rows[0]!.querySelector('[data-testid="download-fit"]')).toBeNull();
    expect(mock.calls.find((c) => c.method === 'POST')?.body).toEqual({});
  });
});
