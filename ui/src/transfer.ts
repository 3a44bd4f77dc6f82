// A conversation as a file: exported as Markdown (to read) or JSON (to import again), and imported from
// JSON. The JSON is the conversation as stored (conversation.ts), so nothing is lost on the way round.

import { type Conversation, newId, type StoredMessage } from './conversation';
import { splitThinking } from './markdown';

/** Markdown for reading: the title, then each turn under its speaker; images are noted, not embedded. */
export function toMarkdown(c: Conversation): string {
  const out = [`# ${c.title}`, ''];
  if (c.model) out.push(`Model: ${c.model}`, '');
  if (c.system) out.push('## System', '', c.system, '');
  for (const m of c.messages) {
    const who = m.role === 'user' ? 'You' : m.role === 'assistant' ? `Assistant${m.model ? ` (${m.model})` : ''}` : 'System';
    out.push(`## ${who}`, '');
    if (m.images?.length) out.push(`_${m.images.length} image${m.images.length > 1 ? 's' : ''} attached_`, '');
    const text = m.role === 'assistant' ? splitThinking(m.content).answer : m.content;
    if (text.trim()) out.push(text.trim(), '');
    if (m.error) out.push(`> Error: ${m.error}`, '');
  }
  return out.join('\n');
}

export function toJson(c: Conversation): string {
  return JSON.stringify(c, null, 2);
}

/** A file name from the title: letters, digits and dashes. */
export function fileName(c: Conversation, ext: 'md' | 'json'): string {
  const base = c.title.replace(/[^\p{L}\p{N}]+/gu, '-').replace(/^-+|-+$/g, '').slice(0, 60) || 'conversation';
  return `${base}.${ext}`;
}

const ROLES = new Set(['user', 'assistant', 'system']);

/**
 * A conversation from an exported JSON file, checked field by field; throws with the reason when it is
 * not one. It gets a new id when `taken` already holds its own, so an import never replaces a chat.
 */
export function fromJson(text: string, taken: (id: string) => boolean = () => false): Conversation {
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch {
    throw new Error('the file is not JSON');
  }
  if (!raw || typeof raw !== 'object' || !Array.isArray((raw as { messages?: unknown }).messages)) {
    throw new Error('the file is not a Tandem conversation (no messages)');
  }
  const r = raw as Partial<Conversation> & { messages: unknown[] };
  const now = Date.now();
  const messages: StoredMessage[] = r.messages.map((m, i) => {
    const x = m as Partial<StoredMessage>;
    if (!x || typeof x !== 'object' || !ROLES.has(String(x.role)) || typeof x.content !== 'string') {
      throw new Error(`message ${i + 1} has no role or text`);
    }
    return { ...x, id: typeof x.id === 'string' && x.id ? x.id : newId(), role: x.role!, content: x.content, created: Number(x.created) || now };
  });
  const id = typeof r.id === 'string' && r.id && !taken(r.id) ? r.id : newId();
  return {
    ...r,
    id,
    title: typeof r.title === 'string' && r.title.trim() ? r.title : 'Imported chat',
    created: Number(r.created) || now,
    updated: now,
    model: typeof r.model === 'string' ? r.model : null,
    sampling: r.sampling && typeof r.sampling === 'object' ? r.sampling : {},
    messages,
  };
}

/** A file's text (FileReader: `Blob.text` is missing from some webviews and from jsdom). */
export function readText(file: Blob): Promise<string> {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(String(reader.result));
    reader.onerror = () => reject(reader.error ?? new Error('the file cannot be read'));
    reader.readAsText(file);
  });
}
