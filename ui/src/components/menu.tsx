// The app's own context menu (instead of the browser's "Reload / Inspect"): a list of actions at the
// pointer. It closes on a choice, Escape, a click elsewhere or a scroll; the arrow keys move between items.

import { useEffect, useRef } from 'preact/hooks';
import { useDismiss } from './dismiss';

export interface MenuItem {
  label: string;
  run: () => void;
}

export interface Menu {
  x: number;
  y: number;
  items: MenuItem[];
}

export function ContextMenu({ menu, onClose }: { menu: Menu; onClose: () => void }) {
  const ref = useRef<HTMLDivElement>(null);
  useDismiss([ref], onClose, { scroll: true });
  useEffect(() => {
    ref.current?.querySelector('button')?.focus();
  }, [menu]);
  const onKeyDown = (e: KeyboardEvent) => {
    if (e.key !== 'ArrowDown' && e.key !== 'ArrowUp') return;
    e.preventDefault();
    const items = [...(ref.current?.querySelectorAll('button') ?? [])];
    const at = items.indexOf(document.activeElement as HTMLButtonElement);
    const next = e.key === 'ArrowDown' ? (at + 1) % items.length : (at - 1 + items.length) % items.length;
    items[next]?.focus();
  };
  // Kept inside the window.
  const x = Math.min(menu.x, (globalThis.innerWidth || 1e6) - 200);
  const y = Math.min(menu.y, (globalThis.innerHeight || 1e6) - 40 * menu.items.length);
  return (
    <div class="context-menu" role="menu" data-testid="context-menu" ref={ref} onKeyDown={onKeyDown} style={{ left: `${Math.max(0, x)}px`, top: `${Math.max(0, y)}px` }}>
      {menu.items.map((item) => (
        <button
          key={item.label}
          role="menuitem"
          class="context-menu-item"
          data-testid="context-menu-item"
          onClick={() => {
            onClose();
            item.run();
          }}
        >
          {item.label}
        </button>
      ))}
    </div>
  );
}
