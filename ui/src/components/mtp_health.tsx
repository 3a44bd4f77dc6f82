// The MTP head's health as the engine measured it: probed acceptance and convention, whether the
// loader repaired the head, and why MTP is off when it is. Shown on the Models page and in the chat
// header.

import type { MtpStatusView as MtpStatus } from '../generated';

/** MTP does not run: no head, or a head that failed its probe. */
export function mtpOff(mtp: MtpStatus): boolean {
  return !mtp.available || (mtp.probe != null && mtp.probe.acceptance == null);
}

/**
 * One line: "MTP off: <why>", or "head 83% · zero_centred (repaired)", or "head not probed". Without
 * `withReason` an off head reads "MTP off" alone, for a place that shows the reason beside it.
 */
export function mtpHealthLabel(mtp: MtpStatus, withReason = true): string {
  if (!mtp.available) return withReason ? `MTP off: ${mtp.reason ?? 'this model has no MTP head'}` : 'MTP off';
  const p = mtp.probe;
  if (p == null) return 'head not probed yet';
  if (p.acceptance == null) return withReason ? `MTP off: ${mtp.reason ?? 'the head failed its probe'}` : 'MTP off';
  const parts = [`head ${Math.round(p.acceptance * 100)}% on the probe`];
  if (p.chosen) parts.push(p.chosen.replace('_', '-'));
  if (p.inconclusive) parts.push('unjudged');
  if (mtp.repaired) parts.push('repaired');
  return parts.join(' · ');
}

/** `reasonShown`: the place shows the reason (and the repair) itself, so they are not said again here. */
export function MtpHealth({ mtp, compact = false, reasonShown = false }: { mtp: MtpStatus; compact?: boolean; reasonShown?: boolean }) {
  const off = mtpOff(mtp);
  const detail = reasonShown ? '' : [mtp.reason, mtp.repaired].filter(Boolean).join('\n');
  return (
    <span
      class={`mtp-health ${off ? 'warn' : ''} ${compact ? 'small dim' : 'small'}`}
      data-testid="mtp-health"
      data-mtp-off={off ? 'true' : 'false'}
      title={detail || undefined}
    >
      {mtpHealthLabel(mtp, !reasonShown || !mtp.reason)}
    </span>
  );
}
