// The window's colours: light or dark as Settings chose, or the system's (`system`, following it when it
// changes). style.css keys the dark palette on `<html data-theme="dark">`, so the choice is one attribute.

import type { Theme } from './generated';

const SYSTEM_DARK = '(prefers-color-scheme: dark)';
/** Stops following the system's appearance (set while the choice is `system`). */
let unfollow: (() => void) | null = null;

const REMEMBERED = 'tandem.theme';

/** The theme last applied in this browser, shown before the engine answers (no flash of the other one). */
export function rememberedTheme(): Theme {
  try {
    const t = globalThis.localStorage?.getItem(REMEMBERED);
    return t === 'light' || t === 'dark' ? t : 'system';
  } catch {
    return 'system';
  }
}

/** Applies `theme` to the whole window at once: `data-theme` on `<html>` becomes "light" or "dark". */
export function applyTheme(theme: Theme, root: HTMLElement = document.documentElement): void {
  try {
    globalThis.localStorage?.setItem(REMEMBERED, theme);
  } catch {
    // Storage may be off (a private window): the engine's setting still applies once read.
  }
  unfollow?.();
  unfollow = null;
  if (theme !== 'system') {
    root.dataset.theme = theme;
    return;
  }
  const query = globalThis.matchMedia?.(SYSTEM_DARK);
  const follow = () => (root.dataset.theme = query?.matches ? 'dark' : 'light');
  follow();
  query?.addEventListener?.('change', follow);
  unfollow = () => query?.removeEventListener?.('change', follow);
}
