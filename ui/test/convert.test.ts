import { describe, expect, it, vi } from 'vitest';
import { DROPPED_FOLDER_EVENT, installShellHooks, pathFromDroppedText, subscribeFolderDrops } from '../src/shell';
import { applyConvertEvent, IDLE, type JobState, requestOf, suggestName } from '../src/views/convert';

describe('conversion job state', () => {
  it('follows planned -> progress -> finished', () => {
    let s: JobState = { ...IDLE, phase: 'running', job: 'j' };
    s = applyConvertEvent(s, { event: 'planned', tensors: 10, shards: 1, params: 1e9, predicted_bytes: 2.4e9, predicted_bpw: 4.5, quantized_modules: 8, dense_modules: 2 });
    expect([s.predictedBytes, s.predictedBpw]).toEqual([2.4e9, 4.5]);
    s = applyConvertEvent(s, { event: 'progress', done: 5, total: 10, tensor: 'model.embed_tokens.weight', bytes_done: 1, bytes_total: 2 });
    expect([s.done, s.total, s.tensor]).toEqual([5, 10, 'model.embed_tokens.weight']);
    s = applyConvertEvent(s, { event: 'finished', bytes: 2.3e9, bpw: 4.4, path: '/m/out', report: {} });
    expect(s.phase).toBe('finished');
    expect(s.done).toBe(10);
    expect(s.result).toEqual({ path: '/m/out', bytes: 2.3e9, bpw: 4.4 });
    const error = { message: 'disk full', type: 'server_error', code: 'internal_error' };
    expect(applyConvertEvent(s, { event: 'error', message: 'disk full', error })).toMatchObject({ phase: 'error', error: 'disk full' });
  });
});

describe('requestOf', () => {
  const form = { src: ' /m/Qwen3.5-4B ', name: '', recipe: 'uniform' as const, bits: 4, groupSize: 64, targetBpw: '4.5', mtp: 'keep' as const, mtpBits: '' };
  it('sends the documented fields, naming the model from its folder, leaving mtp_bits to the server', () => {
    expect(requestOf(form)).toEqual({ src: '/m/Qwen3.5-4B', dst: 'Qwen3.5-4B-4bit', bits: 4, group_size: 64, recipe: 'uniform', mtp: 'keep' });
  });
  it('sends mtp_bits (null for unquantized), the name (as dst) and target_bpw when chosen', () => {
    expect(requestOf({ ...form, mtpBits: '8', name: 'q4' })).toMatchObject({ mtp_bits: 8, dst: 'q4' });
    expect(requestOf({ ...form, mtpBits: 'none' })).toMatchObject({ mtp_bits: null });
    expect(requestOf({ ...form, mtp: 'drop', mtpBits: '8' })).not.toHaveProperty('mtp_bits');
    expect(requestOf({ ...form, recipe: 'auto', targetBpw: '3.8' })).toMatchObject({ recipe: 'auto', target_bpw: 3.8 });
  });
  it('suggests a name from the folder', () => {
    expect(suggestName('/m/Qwen3.5-4B/', 'uniform', 4)).toBe('Qwen3.5-4B-4bit');
    expect(suggestName('/m/Qwen3.5-4B', 'mixed_4_6', 4)).toBe('Qwen3.5-4B-mixed-4-6');
  });
});

describe('dropped folders', () => {
  it('arrive through window.onFolderDropped and the tandem://dropped-folder event', () => {
    const uninstall = installShellHooks();
    const seen = vi.fn();
    const unsubscribe = subscribeFolderDrops(seen);
    (window as unknown as { onFolderDropped: (p: string) => void }).onFolderDropped('/Users/me/Qwen3.5-4B');
    window.dispatchEvent(new CustomEvent(DROPPED_FOLDER_EVENT, { detail: { path: '/Users/me/other' } }));
    window.dispatchEvent(new CustomEvent(DROPPED_FOLDER_EVENT, { detail: '/Users/me/third' }));
    expect(seen.mock.calls.map((c) => c[0])).toEqual(['/Users/me/Qwen3.5-4B', '/Users/me/other', '/Users/me/third']);
    unsubscribe();
    uninstall();
  });

  it('dropped before the view listens are delivered when it does', () => {
    (window as unknown as { onFolderDropped?: (p: string) => void }).onFolderDropped?.('/early');
    const seen = vi.fn();
    const unsubscribe = subscribeFolderDrops(seen);
    expect(seen).toHaveBeenCalledWith('/early');
    unsubscribe();
  });

  it('read file:// URLs dragged as text', () => {
    expect(pathFromDroppedText('file:///Users/me/My%20Model\n')).toBe('/Users/me/My Model');
    expect(pathFromDroppedText('/opt/models/x')).toBe('/opt/models/x');
    expect(pathFromDroppedText('hello')).toBeNull();
  });
});
