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
