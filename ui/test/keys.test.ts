import { describe, expect, it } from 'vitest';
import { isMac, keyLabel, SHORTCUTS, shortcutOf, titled } from '../src/keys';

const press = (init: KeyboardEventInit, target: EventTarget = document.body) => {
  const e = new KeyboardEvent('keydown', { bubbles: true, cancelable: true, ...init });
  Object.defineProperty(e, 'target', { value: target });
  return e;
};
const action = (init: KeyboardEventInit, mac: boolean, target?: EventTarget) => shortcutOf(press(init, target), mac)?.action ?? null;

describe('keyboard shortcuts', () => {
  it('take Cmd on macOS and Ctrl elsewhere, with Shift', () => {
    expect(action({ key: 'O', metaKey: true, shiftKey: true }, true)).toBe('new-chat');
    expect(action({ key: 'O', ctrlKey: true, shiftKey: true }, true)).toBeNull();
    expect(action({ key: 'O', ctrlKey: true, shiftKey: true }, false)).toBe('new-chat');
    expect(action({ key: 'O', metaKey: true, shiftKey: true }, false)).toBeNull();
    // Without Shift the browser's own Ctrl/Cmd+O (open a file) stays the browser's.
    expect(action({ key: 'o', ctrlKey: true }, false)).toBeNull();
    expect(action({ key: 'M', ctrlKey: true, shiftKey: true, altKey: true }, false)).toBeNull();
    expect(action({ key: 'M', ctrlKey: true, shiftKey: true }, false)).toBe('model');
    expect(action({ key: 'S', metaKey: true, shiftKey: true }, true)).toBe('settings');
  });

  it('find a letter by its place on another layout', () => {
    expect(action({ key: 'Щ', code: 'KeyO', ctrlKey: true, shiftKey: true }, false)).toBe('new-chat');
  });

  it('leave / and ? to text fields, but not Escape', () => {
    const field = document.createElement('textarea');
    document.body.appendChild(field);
    try {
      expect(action({ key: '/' }, false)).toBe('focus-input');
      expect(action({ key: '?', shiftKey: true }, false)).toBe('help');
      expect(action({ key: '/' }, false, field)).toBeNull();
      expect(action({ key: '?', shiftKey: true }, false, field)).toBeNull();
      expect(action({ key: 'Escape' }, false, field)).toBe('escape');
      expect(action({ key: '/', ctrlKey: true }, false)).toBeNull();
    } finally {
      field.remove();
    }
  });

  it('are written as the platform writes them', () => {
    const newChat = SHORTCUTS.find((s) => s.action === 'new-chat')!;
    expect(keyLabel(newChat, true)).toContain('⌘');
    expect(keyLabel(newChat, true)).not.toContain('Ctrl');
    expect(keyLabel(newChat, false)).toMatch(/^Ctrl\+Shift\+O$/);
    expect(titled('New chat', 'new-chat', false)).toBe(`New chat (${keyLabel(newChat, false)})`);
    const escape = SHORTCUTS.find((s) => s.action === 'escape')!;
    expect(keyLabel(escape, true)).toBe(keyLabel(escape, false));
  });

  it('know macOS from the platform the browser reports', () => {
    const nav = navigator as { platform: string };
    for (const [platform, mac] of [['MacIntel', true], ['Linux x86_64', false], ['Win32', false], ['iPad', true]] as const) {
      Object.defineProperty(navigator, 'platform', { value: platform, configurable: true });
      try {
        expect(isMac(), platform).toBe(mac);
      } finally {
        delete (nav as { platform?: string }).platform;
      }
    }
  });
});
