import { render } from 'preact';
import { act } from 'preact/test-utils';
import { afterEach, describe, expect, it } from 'vitest';
import { Api } from '../src/api';
import { dismiss, ErrorBanner } from '../src/components/banner';
import { ConvertView, requestOf, startError } from '../src/views/convert';
import { quantizationLabel } from '../src/views/models';
import { ApiError } from '../src/api';
import { json, mockFetch, sse, waitFor } from './helpers';

let root: HTMLElement | null = null;
afterEach(() => {
  if (root) {
    act(() => render(null, root!));
    root.remove();
    root = null;
  }
  dismiss();
});
const byId = (id: string) => root!.querySelector(`[data-testid="${id}"]`) as HTMLElement | null;
async function setValue(id: string, v: string, event = 'input') {
  const el = byId(id) as HTMLInputElement | HTMLSelectElement;
  await act(async () => {
    el.value = v;
    el.dispatchEvent(new Event(event, { bubbles: true }));
  });
}

const EXISTS = '/m/models/tiny-4bit already exists; pick another name, or pass "force": true to replace it';

describe('mixed recipes', () => {
  const form = { src: '/m/tiny', name: '', recipe: 'mixed_4_6' as const, bits: 5, groupSize: 64, targetBpw: '4.5', mtp: 'keep' as const, mtpBits: '' };
  it('send no bits of their own (the recipe sets them)', () => {
    expect(requestOf(form)).not.toHaveProperty('bits');
    expect(requestOf({ ...form, recipe: 'uniform' })).toMatchObject({ bits: 5 });
  });
  it('are labelled as mixed, never as one width', () => {
    expect(quantizationLabel({ dtype: null, quantization: { bits: 5, group_size: 64, mixed: true } })).toBe('mixed precision (mostly 5-bit), group 64');
    // With the range of widths from /api/models, the label gives it.
    expect(quantizationLabel({ dtype: null, quantization: { bits: 4, group_size: 64, mixed: true, bits_range: [4, 6] } })).toBe('mixed precision (4–6-bit), group 64');
    expect(quantizationLabel({ dtype: null, quantization: { bits: 4, group_size: 64, mixed: false } })).toBe('4-bit, group 64');
  });
});

describe('a destination that exists', () => {
  it('is a choice, not advice to pass "force": true', () => {
    expect(startError(new ApiError(EXISTS, 409, 'invalid_request_error', 'already_exists'))).toEqual({
      error: '/m/models/tiny-4bit already exists.',
      exists: true,
    });
  });

  it('offers Replace it, which sends force, and the mixed bits show their range', async () => {
    let n = 0;
    const mock = mockFetch({
      'POST /api/convert': (call) => {
        n++;
        if (!(call.body as { force?: boolean }).force) return json({ error: { message: EXISTS, type: 'invalid_request_error', code: 'already_exists' } }, 409);
        return json({ job: 'j1', state: 'running' });
      },
      'GET /api/convert/j1/events': () => sse([`data: ${JSON.stringify({ event: 'cancelled' })}\n\n`]),
    });
    root = document.createElement('div');
    document.body.appendChild(root);
    act(() =>
      render(
        <>
          <ErrorBanner />
          <ConvertView client={new Api('', mock.fetch, null)} onFinished={() => {}} onShowModels={() => {}} />
        </>,
        root!,
      ),
    );
    await setValue('convert-bits', '5', 'change');
    await setValue('convert-recipe', 'mixed_4_6', 'change');
    expect(byId('convert-bits')!.textContent).toBe('4–6-bit (mixed)');
    await setValue('convert-recipe', 'uniform', 'change');
    await setValue('convert-src', '/m/tiny');
    await act(async () => {
      byId('convert-start')!.click();
    });
    await waitFor(() => !!byId('convert-replace'), 'the choice');
    expect(byId('convert-error')!.textContent).toBe('/m/models/tiny-4bit already exists.');
    expect(root.textContent).not.toContain('force');
    expect(byId('error-banner')).toBeNull();
    await act(async () => {
      byId('convert-replace')!.click();
    });
    await waitFor(() => n === 2, 'the second request');
    expect(mock.calls.filter((c) => c.method === 'POST').map((c) => (c.body as { force?: boolean }).force)).toEqual([undefined, true]);
  });
});

describe('the Convert icon', () => {
  it('is not drawn as a download arrow', async () => {
    const { ICONS } = await import('../src/app');
    // A download arrow: a vertical stroke with a downward head over a baseline.
    expect(ICONS.convert).not.toMatch(/^M12 3v12M7 10l5 5 5-5/);
    // Each view its own icon.
    expect(new Set(Object.values(ICONS)).size).toBe(Object.keys(ICONS).length);
  });
});

describe('the Models page', () => {
  it('says where MTP is chosen when the last generation of a model was mostly parked', async () => {
    const { live } = await import('../src/live');
    const { ModelsView } = await import('../src/views/models');
    const { modelStatus, SAMPLE_STATS, statsSnapshot } = await import('./helpers');
    const stats = { ...SAMPLE_STATS, spec: { ...SAMPLE_STATS.spec!, cycles: 10, parked_cycles: 21 } };
    act(() => live.snapshot(statsSnapshot({ model: 'tandem-tiny', stats })));
    root = document.createElement('div');
    document.body.appendChild(root);
    const models = [modelStatus(), modelStatus({ id: 'other', name: 'other' })];
    act(() => render(<ModelsView models={models} loading={false} reload={async () => {}} onConvert={() => {}} />, root!));
    expect(root.querySelectorAll('[data-testid="model-mtp-slow"]')).toHaveLength(1);
    expect(root.querySelector('[data-model-id="tandem-tiny"] [data-testid="model-mtp-slow"]')).not.toBeNull();
    act(() => live.snapshot(statsSnapshot({ model: 'tandem-tiny', stats: SAMPLE_STATS })));
    expect(root.querySelector('[data-testid="model-mtp-slow"]')).toBeNull();
  });

  it("says why MTP is off once in a model's row, not again beside the head's health", async () => {
    const { ModelsView } = await import('../src/views/models');
    const { modelStatus } = await import('./helpers');
    const why = 'the checkpoint lacks 15 of its 15 tensors (mtp.*)';
    const models = [
      modelStatus({ id: 'nohead', name: 'nohead', mtp: { available: false, enabled: false, depth: 0, reason: why, repaired: null, adaptive: true, probe: null } }),
    ];
    root = document.createElement('div');
    document.body.appendChild(root);
    act(() => render(<ModelsView models={models} loading={false} reload={async () => {}} onConvert={() => {}} />, root!));
    const times = (text: string, id: string) => root!.querySelector(`[data-model-id="${id}"]`)!.textContent!.split(text).length - 1;
    expect(times(why, 'nohead')).toBe(1);
    expect(root.querySelector('[data-model-id="nohead"] [data-testid="model-mtp-reason"]')!.textContent).toBe(why);
    expect(root.querySelector('[data-model-id="nohead"] [data-testid="mtp-health"]')!.getAttribute('data-mtp-off')).toBe('true');
  });
});

describe('calibration progress', () => {
  it('follows the modules measured, with the module and an ETA', async () => {
    const { applyConvertEvent, eta, IDLE } = await import('../src/views/convert');
    let s: import('../src/views/convert').JobState = { ...IDLE, phase: 'running', job: 'j' };
    s = applyConvertEvent(s, { event: 'calibrating', module: 'model.layers.0.mlp', done: 0, total: 12, tokens: 256 }, 1000);
    s = applyConvertEvent(s, { event: 'calibrating', module: 'model.layers.3.mlp', done: 3, total: 12, tokens: 256 }, 7000);
    expect(s.calibration).toEqual({ done: 3, total: 12, module: 'model.layers.3.mlp', tokens: 256, since: 1000 });
    expect(eta(3, 12, 1000, 7000)).toBe('about 18 s left');
    expect(eta(1, 100, 0, 120_000)).toBe('about 3.3 h left');
    expect(eta(0, 12, 1000, 7000)).toBeNull();

    const mock = mockFetch({
      'POST /api/convert': () => json({ job: 'j2', state: 'running' }),
      'GET /api/convert/j2/events': () =>
        sse([`data: ${JSON.stringify({ event: 'calibrating', module: 'model.layers.3.mlp', done: 3, total: 12, tokens: 256 })}\n\n`], { hang: true }),
    });
    root = document.createElement('div');
    document.body.appendChild(root);
    act(() => render(<ConvertView client={new Api('', mock.fetch, null)} onFinished={() => {}} onShowModels={() => {}} />, root!));
    await setValue('convert-recipe', 'auto', 'change');
    await setValue('convert-src', '/m/tiny');
    await act(async () => {
      byId('convert-start')!.click();
    });
    await waitFor(() => !!byId('convert-calibrating'), 'the calibration');
    expect(root.querySelector('.progress-text')!.textContent).toContain('Calibrating: 3 / 12 modules measured over 256 tokens');
    expect(byId('convert-calibrating')!.textContent!.trim()).toBe('model.layers.3.mlp');
    expect((root.querySelector('.progress-fill') as HTMLElement).style.width).toBe('25%');
  });
});

const NOT_CHOSEN = 'src `/elsewhere/ckpt` is outside the models folder (/m/models), the registry\'s models and the folders chosen in this run';

describe('a source folder nobody chose', () => {
  it('is a question naming the folder, and Allow chooses it, then converts', async () => {
    let converts = 0;
    let chosen = false;
    const mock = mockFetch({
      'POST /api/convert': () => {
        converts++;
        if (!chosen) return json({ error: { message: NOT_CHOSEN, type: 'permission_error', code: 'folder_not_chosen' } }, 403);
        return json({ job: 'j2', state: 'running' });
      },
      'POST /api/folders': (call) => {
        chosen = (call.body as { path: string }).path === '/elsewhere/ckpt';
        return json({ path: '/elsewhere/ckpt', model_folder: true });
      },
      'GET /api/convert/j2/events': () => sse([`data: ${JSON.stringify({ event: 'cancelled' })}\n\n`]),
    });
    root = document.createElement('div');
    document.body.appendChild(root);
    act(() =>
      render(
        <>
          <ErrorBanner />
          <ConvertView client={new Api('', mock.fetch, null)} onFinished={() => {}} onShowModels={() => {}} />
        </>,
        root!,
      ),
    );
    expect(byId('convert-browse')).toBeNull(); // a browser has no folder dialog
    await setValue('convert-src', '/elsewhere/ckpt');
    await act(async () => {
      byId('convert-start')!.click();
    });
    await waitFor(() => !!byId('convert-allow-folder'), 'the question');
    expect(byId('convert-question')!.textContent).toContain('/elsewhere/ckpt');
    expect(byId('convert-error')).toBeNull();
    expect(byId('error-banner')).toBeNull();
    await act(async () => {
      byId('convert-allow-folder')!.click();
    });
    await waitFor(() => converts === 2, 'the conversion started again');
    expect(chosen).toBe(true);
    expect(mock.calls.map((c) => `${c.method} ${c.url}`).slice(0, 3)).toEqual(['POST /api/convert', 'POST /api/folders', 'POST /api/convert']);
  });

  it("in the desktop app, Browse… asks the shell's dialog with the window's token", async () => {
    (globalThis as { __TANDEM_SHELL__?: unknown }).__TANDEM_SHELL__ = { folderDialog: { header: 'x-tandem-shell', token: 't0k' } };
    try {
      const mock = mockFetch({ 'POST /api/folders/pick': () => json({ path: '/picked/model', model_folder: true }) });
      root = document.createElement('div');
      document.body.appendChild(root);
      act(() => render(<ConvertView client={new Api('', mock.fetch, null)} onFinished={() => {}} onShowModels={() => {}} />, root!));
      await act(async () => {
        byId('convert-browse')!.click();
      });
      await waitFor(() => (byId('convert-src') as HTMLInputElement).value === '/picked/model', 'the picked folder');
      expect(mock.calls[0]!.headers['x-tandem-shell']).toBe('t0k');
    } finally {
      delete (globalThis as { __TANDEM_SHELL__?: unknown }).__TANDEM_SHELL__;
    }
  });
});

describe('Add model folder', () => {
  it('asks before reading a folder nobody chose, then registers it and reloads', async () => {
    const { AddFolder } = await import('../src/views/models');
    let chosen = false;
    let reloaded = 0;
    const mock = mockFetch({
      'POST /api/models': (call) =>
        chosen
          ? json({ id: 'ckpt', name: 'ckpt', path: (call.body as { path: string }).path }, 201)
          : json({ error: { message: NOT_CHOSEN, type: 'permission_error', code: 'folder_not_chosen' } }, 403),
      'POST /api/folders': () => {
        chosen = true;
        return json({ path: '/elsewhere/ckpt', model_folder: true });
      },
    });
    root = document.createElement('div');
    document.body.appendChild(root);
    act(() => render(<AddFolder client={new Api('', mock.fetch, null)} reload={async () => void reloaded++} />, root!));
    await act(async () => {
      byId('models-add-folder')!.click();
    });
    await setValue('add-folder-path', '/elsewhere/ckpt');
    await act(async () => {
      byId('add-folder-submit')!.click();
    });
    await waitFor(() => !!byId('add-folder-allow'), 'the question');
    expect(byId('add-folder-confirm')!.textContent).toContain('/elsewhere/ckpt');
    await act(async () => {
      byId('add-folder-allow')!.click();
    });
    await waitFor(() => reloaded === 1, 'the reload');
    expect(byId('add-folder-form')).toBeNull();
    expect(mock.calls.map((c) => `${c.method} ${c.url}`)).toEqual(['POST /api/models', 'POST /api/folders', 'POST /api/models']);
  });
});
