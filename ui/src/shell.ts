// What the desktop shell (Tauri) can hand the UI. In a browser none of it is used.
//
// - Native drag and drop of a folder: the shell calls `window.onFolderDropped(path)`, or dispatches
//   `window.dispatchEvent(new CustomEvent('tandem://dropped-folder', { detail: { path } }))`
//   (`detail` may also be the path string itself). The Convert view opens with that path as its source.
// - Conversation storage: `window.__TANDEM_STORAGE__` (see storage.ts); by default the engine keeps them.
// - The engine's address: `window.__TANDEM_API__` (see api.ts).
// - The native folder dialog: `window.__TANDEM_SHELL__ = { folderDialog: { header, token } }`; the UI sends
//   the token in that header to `POST /api/folders/pick` (see api.ts). No other page learns the token.

export const DROPPED_FOLDER_EVENT = 'tandem://dropped-folder';

type Listener = (path: string) => void;

const listeners = new Set<Listener>();
let pending: string | null = null;

/** Called by the shell (or the event below) with the absolute path of a folder dropped on the window. */
export function onFolderDropped(path: string): void {
  if (typeof path !== 'string' || !path.trim()) return;
  const clean = path.trim();
  if (listeners.size === 0) pending = clean;
  for (const fn of listeners) fn(clean);
}

/** Subscribes to dropped folders; a folder dropped before anyone listened is delivered at once. */
export function subscribeFolderDrops(fn: Listener): () => void {
  listeners.add(fn);
  if (pending != null) {
    const p = pending;
    pending = null;
    fn(p);
  }
  return () => listeners.delete(fn);
}

/** The path carried by a `tandem://dropped-folder` event's detail. */
export function pathOfDetail(detail: unknown): string | null {
  if (typeof detail === 'string') return detail;
  if (detail && typeof detail === 'object') {
    const d = detail as { path?: unknown; paths?: unknown };
    if (typeof d.path === 'string') return d.path;
    if (Array.isArray(d.paths) && typeof d.paths[0] === 'string') return d.paths[0];
  }
  return null;
}

/** A `file://` URL (as dragged from a file manager as text) -> a local path; other text as it is. */
export function pathFromDroppedText(text: string): string | null {
  const first = text
    .split(/\r?\n/)
    .map((l) => l.trim())
    .find((l) => l && !l.startsWith('#'));
  if (!first) return null;
  if (first.startsWith('file://')) {
    try {
      const u = new URL(first);
      return decodeURIComponent(u.pathname);
    } catch {
      return null;
    }
  }
  return first.startsWith('/') || /^[A-Za-z]:\\/.test(first) || first.startsWith('~') ? first : null;
}

/** Installs `window.onFolderDropped` and the event listener. */
export function installShellHooks(win: Window & { onFolderDropped?: (path: string) => void } = window): () => void {
  win.onFolderDropped = onFolderDropped;
  const onEvent = (e: Event) => {
    const p = pathOfDetail((e as CustomEvent).detail);
    if (p) onFolderDropped(p);
  };
  win.addEventListener(DROPPED_FOLDER_EVENT, onEvent);
  return () => win.removeEventListener(DROPPED_FOLDER_EVENT, onEvent);
}

/** The desktop app's folder dialog credentials, when this window is the app's. */
export function folderDialog(
  win: { __TANDEM_SHELL__?: unknown } = globalThis as unknown as { __TANDEM_SHELL__?: unknown },
): { header: string; token: string } | null {
  const shell = win.__TANDEM_SHELL__ as { folderDialog?: { header?: unknown; token?: unknown } } | undefined;
  const d = shell?.folderDialog;
  return d && typeof d.header === 'string' && typeof d.token === 'string' && d.token ? { header: d.header, token: d.token } : null;
}
