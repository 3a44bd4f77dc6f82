// The chat's keyboard shortcuts, listed in a popover (the header's "?" button, or the ? key).

import { type RefObject } from 'preact';
import { useRef } from 'preact/hooks';
import { useDismiss } from '../../components/dismiss';
import { keyLabel, SHORTCUTS } from '../../keys';

export function ShortcutsHelp({ toggle, onClose }: { toggle: RefObject<HTMLElement>; onClose: () => void }) {
  const ref = useRef<HTMLDivElement>(null);
  useDismiss([ref, toggle], onClose);
  return (
    <div class="settings-popover shortcuts-popover" role="dialog" aria-label="Keyboard shortcuts" data-testid="shortcuts-help" ref={ref}>
      <div class="settings-head">
        <h3>Keyboard shortcuts</h3>
        <button class="icon-button" aria-label="Close" onClick={onClose}>
          ×
        </button>
      </div>
      <dl class="shortcut-list">
        {SHORTCUTS.map((s) => (
          <div class="shortcut" key={s.action} data-testid="shortcut">
            <dt>
              <kbd>{keyLabel(s)}</kbd>
            </dt>
            <dd>{s.what}</dd>
          </div>
        ))}
      </dl>
    </div>
  );
}
