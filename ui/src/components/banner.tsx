// Errors shown to the person at the top of the window: the engine's own message, never a bare status.

import { useEffect, useState } from 'preact/hooks';
import { errorMessage, isAbort } from '../api';

export interface Notice {
  id: number;
  message: string;
}

let notices: Notice[] = [];
let nextId = 1;
const listeners = new Set<(n: Notice[]) => void>();

function publish(): void {
  for (const fn of listeners) fn(notices);
}

/** Shows an error (an Error, an ApiError or text). Aborts are not errors and are ignored. */
export function showError(e: unknown): void {
  if (isAbort(e)) return;
  const message = errorMessage(e);
  // The same message twice in a row is shown once.
  if (notices.length && notices[notices.length - 1]!.message === message) return;
  notices = [...notices.slice(-3), { id: nextId++, message }];
  publish();
}

export function dismiss(id?: number): void {
  notices = id == null ? [] : notices.filter((n) => n.id !== id);
  publish();
}

export function ErrorBanner() {
  const [list, setList] = useState(notices);
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
