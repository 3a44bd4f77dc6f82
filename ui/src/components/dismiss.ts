// How a popover or menu closes: Escape, or a press outside it (and outside the button that opened it,
// whose own click toggles it). Escape is caught on the window before anything else sees it, and marked
// used, so the key closes only the topmost thing (not also the chat's reply or the panel drawer).

import { type RefObject } from 'preact';
import { useLayoutEffect, useRef } from 'preact/hooks';

export function useDismiss(inside: RefObject<HTMLElement>[], onClose: () => void, opts: { scroll?: boolean } = {}): void {
  // The latest callback and elements, without re-subscribing on every render.
  const latest = useRef({ inside, onClose });
  latest.current = { inside, onClose };
  // A layout effect: the listeners are in place when the menu is in the document, so an Escape or a click
  // that comes at once (a fast user, a test) is not lost to a plain effect that runs a frame later.
  useLayoutEffect(() => {
    const away = (e: Event) => {
      const target = e.target as Node;
      if (!latest.current.inside.some((r) => r.current?.contains(target))) latest.current.onClose();
    };
    const key = (e: KeyboardEvent) => {
      if (e.key !== 'Escape' || e.defaultPrevented) return;
      e.preventDefault();
      latest.current.onClose();
    };
    const scrolled = () => latest.current.onClose();
    window.addEventListener('keydown', key, true);
    document.addEventListener('mousedown', away, true);
    if (opts.scroll) document.addEventListener('scroll', scrolled, true);
    return () => {
      window.removeEventListener('keydown', key, true);
      document.removeEventListener('mousedown', away, true);
      document.removeEventListener('scroll', scrolled, true);
    };
  }, [opts.scroll]);
}
