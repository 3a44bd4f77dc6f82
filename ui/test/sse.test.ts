import { describe, expect, it } from 'vitest';
import { readSse, SseParser, type SseEvent } from '../src/sse';

function parseAll(pieces: string[]): SseEvent[] {
  const p = new SseParser();
  const out: SseEvent[] = [];
  for (const piece of pieces) out.push(...p.push(piece));
  out.push(...p.end());
  return out;
}

function bodyOf(parts: Uint8Array[]): ReadableStream<Uint8Array> {
  return new ReadableStream({
    start(c) {
      for (const p of parts) c.enqueue(p);
      c.close();
    },
  });
}

const STREAM =
  ': keep-alive\n\n' +
  'data: {"choices":[{"index":0,"delta":{"content":"Hel"}}]}\n\n' +
  'event: stats\r\ndata: {"a":1}\r\n\r\n' +
  'data: line one\ndata: line two\ndata:\n\n' +
  'id: 7\rretry: 1500\rdata: {"choices":[{"index":0,"delta":{"content":"lo ✓"}}]}\r\r' +
  'event: error\ndata: {"error":{"message":"model crashed"}}\n\n' +
  'data: [DONE]\n\n';

const EXPECTED: SseEvent[] = [
  { event: 'message', data: '{"choices":[{"index":0,"delta":{"content":"Hel"}}]}' },
  { event: 'stats', data: '{"a":1}' },
  { event: 'message', data: 'line one\nline two\n' },
  { event: 'message', data: '{"choices":[{"index":0,"delta":{"content":"lo ✓"}}]}', id: '7', retry: 1500 },
  { event: 'error', data: '{"error":{"message":"model crashed"}}', id: '7' },
  { event: 'message', data: '[DONE]', id: '7' },
];

describe('SseParser', () => {
  it('parses a whole stream: comments, event names, multi-line data, CRLF and CR line ends, id and retry', () => {
    expect(parseAll([STREAM])).toEqual(EXPECTED);
  });

  it('gives the same events however the stream is split in two', () => {
    for (let i = 0; i <= STREAM.length; i++) {
      expect(parseAll([STREAM.slice(0, i), STREAM.slice(i)]), `split at ${i}`).toEqual(EXPECTED);
    }
  });

  it('gives the same events fed one character at a time', () => {
    expect(parseAll([...STREAM])).toEqual(EXPECTED);
  });

  it('treats a CR at the end of one piece and an LF at the start of the next as one line break', () => {
    expect(parseAll(['data: a\r', '\n\r', '\ndata: b\n\n'])).toEqual([
      { event: 'message', data: 'a' },
      { event: 'message', data: 'b' },
    ]);
  });

  it('drops an event whose closing blank line never came, and events without data', () => {
    expect(parseAll(['event: ping\n\n', 'data: partial'])).toEqual([]);
  });

  it('keeps a field without a colon and a value without the leading space', () => {
    expect(parseAll(['data\n\ndata:x\n\n'])).toEqual([
      { event: 'message', data: '' },
      { event: 'message', data: 'x' },
    ]);
  });
});

describe('readSse', () => {
  it('decodes UTF-8 split inside a multi-byte character across network chunks', async () => {
    const bytes = new TextEncoder().encode('data: héllo ✓ 漢字\n\n');
    const parts: Uint8Array[] = [];
    for (let i = 0; i < bytes.length; i += 3) parts.push(bytes.slice(i, i + 3));
    const events: SseEvent[] = [];
    for await (const ev of readSse(bodyOf(parts))) events.push(ev);
    expect(events).toEqual([{ event: 'message', data: 'héllo ✓ 漢字' }]);
  });

  it('stops when its signal aborts', async () => {
    const c = new AbortController();
    const body = new ReadableStream<Uint8Array>({
      start(ctrl) {
        ctrl.enqueue(new TextEncoder().encode('data: 1\n\n'));
        // never closes
      },
    });
    const seen: string[] = [];
    for await (const ev of readSse(body, c.signal)) {
      seen.push(ev.data);
      c.abort();
    }
    expect(seen).toEqual(['1']);
  });
});
