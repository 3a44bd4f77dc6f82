// The MTP head's health as the engine measured it: probed acceptance and convention, whether the
// loader repaired the head, and why MTP is off when it is. Shown on the Models page and in the chat
// header.

import type { MtpStatusView as MtpStatus } from '../generated';

/** One line: "MTP off: <why>", or "head 83% · zero_centred (repaired)", or "head not probed". */
export function mtpHealthLabel(mtp: MtpStatus): string {
  if (!mtp.available) return `MTP off: ${mtp.reason ?? 'this model has no MTP head'}`;
  const p = mtp.probe;
  if (p == null) return 'head not probed yet';
  if (p.acceptance == null) return `MTP off: ${mtp.reason ?? 'the head failed its probe'}`;
  const parts = [`head ${Math.round(p.acceptance * 100)}% on the probe`];
  if (p.chosen) parts.push(p.chosen.replace('_', '-'));
  if (p.inconclusive) parts.push('unjudged');
  if (mtp.repaired) parts.push('repaired');
  return parts.join(' · ');
}

export function MtpHealth({ mtp, compact = false }: { mtp: MtpStatus; compact?: boolean }) {
  const off = !mtp.available || (mtp.probe != null && mtp.probe.acceptance == null);
  const detail = [mtp.reason, mtp.repaired].filter(Boolean).join('\n');
  return (
    <span
      class={`mtp-health ${off ? 'warn' : ''} ${compact ? 'small dim' : 'small'}`}
      data-testid="mtp-health"
      data-mtp-off={off ? 'true' : 'false'}
      title={detail || undefined}
    >
      {mtpHealthLabel(mtp)}
    </span>
  );
}
