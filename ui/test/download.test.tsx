import { render } from 'preact';
import { act } from 'preact/test-utils';
import { afterEach, describe, expect, it } from 'vitest';
import { Api } from '../src/api';
import { dismiss } from '../src/components/banner';
import { DownloadPage, downloadEta, includeOf } from '../src/views/download';
import type { DownloadView } from '../src/generated';
import { json, mockFetch, sse } from './helpers';

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
    const big = view({ state: 'running', memory_total: 32e9, fit: { need: 60e9, fits: false, recommended_bits: 5 } });
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
