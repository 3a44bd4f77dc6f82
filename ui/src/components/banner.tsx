// Errors shown to the person at the top of the window: the engine's own message, never a bare status.
// A message already shown is not shown again (its time restarts); each leaves by itself after a while
// (the place it came from, a chat message or the Convert form, keeps it) or with its close button.

import { useEffect, useState } from 'preact/hooks';
import { ApiError, errorMessage, isAbort } from '../api';

export interface Notice {
  id: number;
  message: string;
  /** The engine could not be reached: the window's offline notice says so already while it shows. */
  connection?: boolean;
}

let notices: Notice[] = [];
let nextId = 1;
/** How long a notice stays. */
export const NOTICE_MS = 12_000;
/** Most notices shown at once (the oldest leave first). */
const MAX_NOTICES = 3;
const timers = new Map<number, ReturnType<typeof setTimeout>>();

function expireLater(id: number): void {
  clearTimeout(timers.get(id));
  timers.set(
    id,
    setTimeout(() => dismiss(id), NOTICE_MS),
  );
}
const listeners = new Set<(n: Notice[]) => void>();

function publish(): void {
  for (const fn of listeners) fn(notices);
}

/** Shows an error (an Error, an ApiError or text). Aborts are not errors and are ignored. */
export function showError(e: unknown): void {
  if (isAbort(e)) return;
  const message = errorMessage(e);
  const shown = notices.find((n) => n.message === message);
  if (shown) {
    expireLater(shown.id);
    return;
  }
  const notice: Notice = { id: nextId++, message, connection: e instanceof ApiError && e.type === 'connection_error' };
  for (const old of notices.slice(0, Math.max(0, notices.length - (MAX_NOTICES - 1)))) clearTimeout(timers.get(old.id));
  notices = [...notices.slice(-(MAX_NOTICES - 1)), notice];
  expireLater(notice.id);
  publish();
}

/** Drops the notices that said the engine could not be reached (it is back). */
export function dismissConnection(): void {
  for (const n of notices) if (n.connection) dismiss(n.id);
}

export function dismiss(id?: number): void {
  for (const n of notices) if (id == null || n.id === id) {
    clearTimeout(timers.get(n.id));
    timers.delete(n.id);
  }
  notices = id == null ? [] : notices.filter((n) => n.id !== id);
  publish();
}

/** `offline`: the window shows that the engine cannot be reached, so notices saying it again are not shown. */
export function ErrorBanner({ offline = false }: { offline?: boolean }) {
  const [all, setList] = useState(notices);
  const list = offline ? all.filter((n) => !n.connection) : all;
  useEffect(() => {
    listeners.add(setList);
    setList(notices);
    return () => {
      listeners.delete(setList);
    };
  }, []);
  if (list.length === 0) return null;
  return (
    <div class="error-banner" role="alert" data-testid="error-banner">
      {list.map((n) => (
        <div class="error-item" key={n.id}>
          <span class="error-text" data-testid="error-message">
            {n.message}
          </span>
          <button class="icon-button" aria-label="Dismiss" data-testid="error-dismiss" onClick={() => dismiss(n.id)}>
            ×
          </button>
        </div>
      ))}
    </div>
  );
}
