// The app's own context menu (instead of the browser's "Reload / Inspect"): a list of actions at the
// pointer. It closes on a choice, Escape, a click elsewhere or a scroll.

import { useEffect, useRef } from 'preact/hooks';

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
  useEffect(() => {
    const away = (e: Event) => {
      if (!ref.current?.contains(e.target as Node)) onClose();
    };
    const key = (e: KeyboardEvent) => {
      if (e.key === 'Escape') {
        e.preventDefault();
        onClose();
      }
    };
    document.addEventListener('mousedown', away, true);
    document.addEventListener('scroll', onClose, true);
    document.addEventListener('keydown', key, true);
    ref.current?.querySelector('button')?.focus();
    return () => {
      document.removeEventListener('mousedown', away, true);
      document.removeEventListener('scroll', onClose, true);
      document.removeEventListener('keydown', key, true);
    };
  }, [onClose]);
  // Kept inside the window.
  const x = Math.min(menu.x, (globalThis.innerWidth || 1e6) - 200);
  const y = Math.min(menu.y, (globalThis.innerHeight || 1e6) - 40 * menu.items.length);
  return (
    <div class="context-menu" role="menu" data-testid="context-menu" ref={ref} style={{ left: `${Math.max(0, x)}px`, top: `${Math.max(0, y)}px` }}>
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
