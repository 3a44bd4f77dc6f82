import { render } from 'preact';
import { act } from 'preact/test-utils';
import { afterEach, describe, expect, it } from 'vitest';
import { MtpHealth, mtpHealthLabel } from '../src/components/mtp_health';
import type { MtpStatusView, ProbeReport } from '../src/generated';

const base: MtpStatusView = { available: true, enabled: true, depth: 3, reason: null, repaired: null, adaptive: true, probe: null };
const probe = (over: Partial<ProbeReport> = {}): ProbeReport => ({
  acceptance: 0.62,
  tried: [{ convention: 'zero_centred', acceptance: 0.62 }],
  chosen: 'zero_centred',
  seconds: 1.2,
  tokens: 256,
  body_agreement: 0.2,
  inconclusive: false,
  ...over,
});

let root: HTMLElement | null = null;
afterEach(() => {
  if (root) {
    act(() => render(null, root!));
    root.remove();
    root = null;
  }
});
function show(mtp: MtpStatusView): HTMLElement {
  root = document.createElement('div');
  document.body.appendChild(root);
  act(() => render(<MtpHealth mtp={mtp} />, root!));
  return root.querySelector('[data-testid="mtp-health"]') as HTMLElement;
}

describe("the MTP head's health", () => {
  it('gives the probed acceptance and the convention it runs with', () => {
    expect(mtpHealthLabel({ ...base, probe: probe() })).toBe('head 62% on the probe · zero-centred');
    const el = show({ ...base, probe: probe() });
    expect(el.dataset.mtpOff).toBe('false');
    expect(el.title).toBe('');
  });

  it('says MTP is off and why, with the reason on hover, when the files hold no head', () => {
    const why = 'the checkpoint lacks 15 of its 15 tensors (mtp.*)';
    const el = show({ ...base, available: false, reason: why });
    expect(el.textContent).toBe(`MTP off: ${why}`);
    expect(el.dataset.mtpOff).toBe('true');
    expect(el.title).toBe(why);
  });

  it('says MTP is off when the head failed its probe, never a silent near-0%', () => {
    const why = 'the MTP head probes at best 0.004 top-1 agreement';
    const mtp = { ...base, reason: why, probe: probe({ acceptance: null, chosen: null }) };
    expect(mtpHealthLabel(mtp)).toBe(`MTP off: ${why}`);
    expect(show(mtp).dataset.mtpOff).toBe('true');
  });

  it('marks a head the probe repaired, and one it could not judge', () => {
    const repaired = 'MTP norm convention chosen by the probe: shifted';
    const el = show({ ...base, repaired, probe: probe({ chosen: 'shifted' }) });
    expect(el.textContent).toBe('head 62% on the probe · shifted · repaired');
    expect(el.title).toBe(repaired);
    expect(mtpHealthLabel({ ...base, probe: probe({ inconclusive: true }) })).toContain('unjudged');
  });

  it('leaves the reason out where the place shows it beside, and only then', () => {
    const why = 'the checkpoint lacks 15 of its 15 tensors (mtp.*)';
    const off = { ...base, available: false, reason: why };
    expect(mtpHealthLabel(off, false)).not.toContain(why);
    expect(mtpHealthLabel(off, false)).toMatch(/^MTP off/);
    root = document.createElement('div');
    document.body.appendChild(root);
    act(() => render(<MtpHealth mtp={off} reasonShown />, root!));
    const el = root.querySelector('[data-testid="mtp-health"]') as HTMLElement;
    expect(el.textContent).not.toContain(why);
    expect(el.title).toBe('');
    // No reason to show beside: the label keeps its own.
    act(() => render(<MtpHealth mtp={{ ...base, available: false }} reasonShown />, root!));
    expect(root.querySelector('[data-testid="mtp-health"]')!.textContent).toBe(mtpHealthLabel({ ...base, available: false }));
  });

  it('says when a head was not probed yet', () => {
    expect(mtpHealthLabel(base)).toBe('head not probed yet');
  });
});
