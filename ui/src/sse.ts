// Server-sent events, parsed as the HTML standard says (the "event stream interpretation"), fed in
// pieces that may split anywhere: inside a field, between "\r" and "\n", or inside a UTF-8 sequence.

export interface SseEvent {
  /** The `event:` field; "message" when the server gave none. */
  event: string;
  /** The `data:` lines, joined with "\n". */
  data: string;
  /** The last `id:` seen on the stream, if any. */
  id?: string;
  /** A `retry:` value in milliseconds, if this event carried one. */
  retry?: number;
}

export class SseParser {
  private buffer = '';
  private pendingCR = false;
  private data: string[] = [];
  private eventType = '';
  private lastId: string | undefined;
  private retry: number | undefined;
  private hasData = false;

  /** Feeds a piece of text; returns the events completed by it. */
  push(text: string): SseEvent[] {
    const out: SseEvent[] = [];
    let start = 0;
    let i = 0;
    if (this.pendingCR && text.startsWith('\n')) {
      // The "\r" that ended the previous piece and this "\n" are one line break.
      start = i = 1;
    }
    this.pendingCR = false;
    for (; i < text.length; i++) {
      const c = text.charCodeAt(i);
      if (c !== 10 && c !== 13) continue;
      this.buffer += text.slice(start, i);
      this.line(this.buffer, out);
      this.buffer = '';
      if (c === 13) {
        if (i + 1 < text.length) {
          if (text.charCodeAt(i + 1) === 10) i++;
        } else {
          this.pendingCR = true;
        }
      }
      start = i + 1;
    }
    this.buffer += text.slice(start);
    return out;
  }

  /** Ends the stream: an event without its closing blank line is dropped, as the standard says. */
  end(): SseEvent[] {
    this.buffer = '';
    this.reset();
    return [];
  }

  private reset(): void {
    this.data = [];
    this.hasData = false;
    this.eventType = '';
    this.retry = undefined;
  }

  private line(line: string, out: SseEvent[]): void {
    if (line === '') {
      if (this.hasData) {
        const ev: SseEvent = { event: this.eventType || 'message', data: this.data.join('\n') };
        if (this.lastId !== undefined) ev.id = this.lastId;
        if (this.retry !== undefined) ev.retry = this.retry;
        out.push(ev);
      }
      this.reset();
      return;
    }
    if (line.startsWith(':')) return; // a comment (keep-alive)
    const colon = line.indexOf(':');
    let field = line;
    let value = '';
    if (colon >= 0) {
      field = line.slice(0, colon);
      value = line.slice(colon + 1);
      if (value.startsWith(' ')) value = value.slice(1);
    }
    switch (field) {
      case 'data':
        this.data.push(value);
        this.hasData = true;
        break;
      case 'event':
        this.eventType = value;
        break;
      case 'id':
        if (!value.includes('\0')) this.lastId = value;
        break;
      case 'retry':
        if (/^\d+$/.test(value)) this.retry = Number(value);
        break;
      default:
        break; // unknown fields are ignored
    }
  }
}

/** Reads a response body as server-sent events. Stops quietly when `signal` aborts. */
export async function* readSse(
  body: ReadableStream<Uint8Array>,
  signal?: AbortSignal,
): AsyncGenerator<SseEvent, void, undefined> {
  const reader = body.getReader();
  const decoder = new TextDecoder('utf-8');
  const parser = new SseParser();
  const onAbort = () => {
    reader.cancel().catch(() => {});
  };
  signal?.addEventListener('abort', onAbort);
  try {
    for (;;) {
      if (signal?.aborted) return;
      let chunk: ReadableStreamReadResult<Uint8Array>;
      try {
        chunk = await reader.read();
      } catch (e) {
        if (signal?.aborted) return;
        throw e;
      }
      if (chunk.done) break;
      for (const ev of parser.push(decoder.decode(chunk.value, { stream: true }))) yield ev;
    }
    for (const ev of parser.push(decoder.decode())) yield ev;
    parser.end();
  } finally {
    signal?.removeEventListener('abort', onAbort);
    reader.releaseLock();
  }
}
