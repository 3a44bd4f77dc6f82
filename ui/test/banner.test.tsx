import { render } from 'preact';
import { act } from 'preact/test-utils';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { dismiss, ErrorBanner, NOTICE_MS, showError } from '../src/components/banner';

let root: HTMLElement;
beforeEach(() => {
  vi.useFakeTimers();
  root = document.createElement('div');
  document.body.appendChild(root);
  act(() => render(<ErrorBanner />, root));
});
afterEach(() => {
  act(() => dismiss());
  act(() => render(null, root));
  root.remove();
  vi.useRealTimers();
});
const messages = () => [...root.querySelectorAll('[data-testid="error-message"]')].map((e) => e.textContent);

describe('ErrorBanner', () => {
  it('shows a message once even when it comes again after another one', () => {
    act(() => {
      showError('model failed to load');
      showError('disk full');
      showError(new Error('model failed to load'));
    });
    expect(messages()).toEqual(['model failed to load', 'disk full']);
  });

  it('lets notices leave by themselves, and with their close button', () => {
    act(() => showError('first'));
    act(() => {
      vi.advanceTimersByTime(NOTICE_MS / 2);
    });
    act(() => showError('second'));
    expect(messages()).toEqual(['first', 'second']);
    act(() => {
      vi.advanceTimersByTime(NOTICE_MS / 2 + 1);
    });
    expect(messages()).toEqual(['second']);
    act(() => (root.querySelector('[data-testid="error-dismiss"]') as HTMLElement).click());
    expect(root.querySelector('[data-testid="error-banner"]')).toBeNull();
  });

  it('keeps at most three at once', () => {
    act(() => ['a', 'b', 'c', 'd', 'e'].forEach((m) => showError(m)));
    expect(messages()).toEqual(['c', 'd', 'e']);
    act(() => {
      vi.advanceTimersByTime(NOTICE_MS + 1);
    });
    expect(messages()).toEqual([]);
  });
});

describe('connection errors', () => {
  it('are not repeated under the offline notice, and go when the engine is back', async () => {
    const { ApiError } = await import('../src/api');
    const { dismissConnection } = await import('../src/components/banner');
    act(() => render(<ErrorBanner offline />, root));
    act(() => {
      showError(new ApiError('Cannot reach the Tandem engine at http://127.0.0.1:11435: Failed to fetch', 0, 'connection_error'));
      showError('model failed to load');
    });
    expect(messages()).toEqual(['model failed to load']);
    act(() => render(<ErrorBanner />, root));
    expect(messages()).toHaveLength(2);
    act(() => dismissConnection());
    expect(messages()).toEqual(['model failed to load']);
  });
});
