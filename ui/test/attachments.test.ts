import { describe, expect, it } from 'vitest';
import { attach, toApiMessages, userContent } from '../src/attachments';
import type { StoredMessage } from '../src/conversation';

// A 1x1 PNG.
const PNG = Uint8Array.from(atob('iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=='), (c) => c.charCodeAt(0));

describe('attach', () => {
  it('turns image files into base64 data URLs and refuses other files', async () => {
    const { attachments, rejected } = await attach([
      new File([PNG], 'dot.png', { type: 'image/png' }),
      new File(['hello'], 'notes.txt', { type: 'text/plain' }),
    ]);
    expect(attachments).toHaveLength(1);
    expect(attachments[0]!.name).toBe('dot.png');
    expect(attachments[0]!.url).toMatch(/^data:image\/png;base64,iVBORw0KGgo/);
    const decoded = atob(attachments[0]!.url.split(',')[1]!);
    expect(Uint8Array.from(decoded, (c) => c.charCodeAt(0))).toEqual(PNG);
    expect(rejected).toEqual(['notes.txt: not an image (PNG, JPEG, GIF or WebP)']);
  });
});

describe('userContent', () => {
  it('is plain text without images', () => {
    expect(userContent('hi')).toBe('hi');
  });
  it('is image_url parts then a text part with images', () => {
    expect(userContent('What is in these?', ['data:image/png;base64,AAA', 'data:image/jpeg;base64,BBB'])).toEqual([
      { type: 'image_url', image_url: { url: 'data:image/png;base64,AAA' } },
      { type: 'image_url', image_url: { url: 'data:image/jpeg;base64,BBB' } },
      { type: 'text', text: 'What is in these?' },
    ]);
  });
  it('has no empty text part for an image alone', () => {
    expect(userContent('', ['data:image/png;base64,AAA'])).toEqual([{ type: 'image_url', image_url: { url: 'data:image/png;base64,AAA' } }]);
  });
});

describe('toApiMessages', () => {
  it('puts the system prompt first, sends images as parts, strips reasoning and skips failed replies', () => {
    const messages: StoredMessage[] = [
      { id: '1', role: 'user', content: 'Look', images: ['data:image/png;base64,AAA'], created: 1 },
      { id: '2', role: 'assistant', content: '<think>it is a dot</think>\n\nA dot.', created: 2 },
      { id: '3', role: 'user', content: 'Again', created: 3 },
      { id: '4', role: 'assistant', content: '', error: 'boom', created: 4 },
      { id: '5', role: 'user', content: 'Once more', created: 5 },
    ];
    expect(toApiMessages(messages, ' Be brief. ')).toEqual([
      { role: 'system', content: 'Be brief.' },
      { role: 'user', content: [{ type: 'image_url', image_url: { url: 'data:image/png;base64,AAA' } }, { type: 'text', text: 'Look' }] },
      { role: 'assistant', content: 'A dot.' },
      { role: 'user', content: 'Again' },
      { role: 'user', content: 'Once more' },
    ]);
  });
});
