// How numbers are written for people.

export function bytes(n: number | null | undefined): string {
  if (n == null || !Number.isFinite(n)) return '—';
  const units = ['B', 'KB', 'MB', 'GB', 'TB'];
  let v = n;
  let u = 0;
  while (Math.abs(v) >= 1000 && u < units.length - 1) {
    v /= 1000;
    u++;
  }
  return `${v >= 100 || u === 0 ? v.toFixed(0) : v.toFixed(1)} ${units[u]}`;
}

export function percent(x: number | null | undefined, digits = 0): string {
  if (x == null || !Number.isFinite(x)) return '—';
  return `${(x * 100).toFixed(digits)}%`;
}

export function fixed(x: number | null | undefined, digits = 1): string {
  if (x == null || !Number.isFinite(x)) return '—';
  return x.toFixed(digits);
}

export function ms(x: number | null | undefined): string {
  if (x == null || !Number.isFinite(x)) return '—';
  if (x >= 1000) return `${(x / 1000).toFixed(2)} s`;
  if (x >= 100) return `${x.toFixed(0)} ms`;
  return `${x.toFixed(1)} ms`;
}

export function integer(n: number | null | undefined): string {
  if (n == null || !Number.isFinite(n)) return '—';
  return Math.round(n).toLocaleString('en-US');
}

/**
 * A setting's value as a person would write it: f32 noise from the server (0.699999988079071) reads 0.7.
 * Six significant digits are more than any setting needs.
 */
export function num(x: number | null | undefined): string {
  if (x == null || !Number.isFinite(x)) return '—';
  return String(Number(x.toPrecision(6)));
}

/** How long something has run: "42 s", "5 min 3 s", "2 h 5 min", "3 d 4 h". */
export function duration(seconds: number | null | undefined): string {
  if (seconds == null || !Number.isFinite(seconds) || seconds < 0) return '—';
  const s = Math.floor(seconds);
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
  return `${Math.floor(s / 86400)} d ${Math.floor((s % 86400) / 3600)} h`;
}

/** The local time of day of a Unix time in ms, "14:03:27". */
export function clock(unixMs: number): string {
  const d = new Date(unixMs);
  return [d.getHours(), d.getMinutes(), d.getSeconds()].map((n) => String(n).padStart(2, '0')).join(':');
}
