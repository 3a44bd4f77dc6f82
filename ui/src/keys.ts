// The chat's keyboard shortcuts: which key does what, and how to write a key for this platform (Cmd on
// macOS, Ctrl elsewhere). Combinations carry Shift because the browser keeps Ctrl/Cmd+N, T and W for itself.

export type Action = 'new-chat' | 'focus-input' | 'model' | 'settings' | 'escape' | 'help';

export interface Shortcut {
  action: Action;
  /** KeyboardEvent.key, lowercased. */
  key: string;
  /** Cmd on macOS, Ctrl elsewhere, with Shift. */
  mod: boolean;
  what: string;
}

export const SHORTCUTS: readonly Shortcut[] = [
  { action: 'new-chat', key: 'o', mod: true, what: 'New chat' },
  { action: 'focus-input', key: '/', mod: false, what: 'Go to the message field' },
  { action: 'model', key: 'm', mod: true, what: 'Choose the model' },
  { action: 'settings', key: 's', mod: true, what: 'This chat’s sampling and system prompt' },
  { action: 'escape', key: 'escape', mod: false, what: 'Stop the reply; close a menu or popover' },
  { action: 'help', key: '?', mod: false, what: 'These shortcuts' },
];

/** True on macOS (and iOS), where Cmd plays Ctrl's part. */
export function isMac(): boolean {
  const nav = globalThis.navigator as (Navigator & { userAgentData?: { platform?: string } }) | undefined;
  return /mac|iphone|ipad/i.test(nav?.userAgentData?.platform || nav?.platform || '');
}

/** The shortcut `e` presses, if any. Keys without a modifier count only outside text fields. */
export function shortcutOf(e: KeyboardEvent, mac = isMac()): Shortcut | null {
  const key = e.key.toLowerCase();
  // With another layout (Cyrillic, Greek) the key is still where O, M or S are: KeyboardEvent.code says so.
  const letter = /^Key[A-Z]$/.test(e.code ?? '') ? e.code.slice(3).toLowerCase() : key;
  const primary = mac ? e.metaKey : e.ctrlKey;
  const other = mac ? e.ctrlKey : e.metaKey;
  for (const s of SHORTCUTS) {
    if (s.mod) {
      if ((s.key === key || s.key === letter) && primary && e.shiftKey && !other && !e.altKey) return s;
    } else if (s.key !== key) {
      continue;
    } else if (s.action === 'escape') {
      return s;
    } else if (!e.ctrlKey && !e.metaKey && !e.altKey && !inTextField(e.target)) {
      return s;
    }
  }
  return null;
}

function inTextField(target: EventTarget | null): boolean {
  return !!(target as HTMLElement | null)?.closest?.('input, textarea, select, [contenteditable]');
}

/** A shortcut as written on this platform: "⇧⌘O" on macOS, "Ctrl+Shift+O" elsewhere; "Esc", "/". */
export function keyLabel(s: Shortcut, mac = isMac()): string {
  const key = s.key === 'escape' ? 'Esc' : s.key.toUpperCase();
  if (!s.mod) return key;
  return mac ? `⇧⌘${key}` : `Ctrl+Shift+${key}`;
}

/** "New chat (Ctrl+Shift+O)": a control's title naming its shortcut. */
export function titled(text: string, action: Action, mac = isMac()): string {
  const s = SHORTCUTS.find((x) => x.action === action);
  return s ? `${text} (${keyLabel(s, mac)})` : text;
}
