// A conversation as the UI keeps it: the engine stores it as sent (one JSON file each), relying only on
// the fields of `ConversationCore` (generated from Rust); the rest is the UI's own.

import type { ChatCompletionRequest, ConversationCore, MessageCore, Stats, Usage } from './generated';

/** This chat's sampling: the request fields the UI lets a person set; one left out takes the model's default. */
export type Sampling = Pick<
  ChatCompletionRequest,
  'temperature' | 'top_p' | 'top_k' | 'min_p' | 'repetition_penalty' | 'max_tokens' | 'seed'
>;

export interface StoredMessage extends MessageCore {
  id: string;
  /** The text (for an assistant, the reply as streamed, `<think>` block included). */
  content: string;
  /** Reasoning sent separately (`delta.reasoning_content`), if the server does that. */
  reasoning?: string;
  /** The model that wrote an assistant message. */
  model?: string;
  /** Statistics of the generation that wrote it. */
  stats?: Stats | null;
  /** The token counts the server reported at the end of the generation (`stream_options.include_usage`). */
  usage?: Usage;
  /** Set when generation stopped early: "stopped" by the user, or the error's message. */
  stopped?: boolean;
  error?: string;
  finish_reason?: string | null;
  created: number;
  /** Turns of the conversation left out of the request for this reply, to fit the model's context. */
  leftOut?: number;
  /** An assistant reply's other versions (earlier regenerations), each without versions of its own. */
  versions?: StoredMessage[];
}

/** All versions of a reply, oldest first, and where the shown one is among them. */
export function versionsOf(m: StoredMessage): { all: StoredMessage[]; at: number } {
  const { versions, ...shown } = m;
  const all = [...(versions ?? []), shown].sort((a, b) => a.created - b.created);
  return { all, at: all.indexOf(shown) };
}

/** The reply showing version `k` of `m`'s versions (as `versionsOf` orders them). */
export function showVersion(m: StoredMessage, k: number): StoredMessage {
  const { all } = versionsOf(m);
  const chosen = all[k];
  if (!chosen) return m;
  const others = all.filter((v) => v !== chosen);
  return others.length ? { ...chosen, versions: others } : chosen;
}

export type ContextPolicy = 'rolling' | 'middle' | 'stop';

export interface Conversation extends ConversationCore {
  created: number;
  model: string | null;
  /** This chat's sampling; a field left out takes the model's default (models.toml). */
  sampling: Sampling;
  /** An optional system prompt. */
  system?: string;
  /**
   * What happens when the chat outgrows the model's context: `rolling` (the default) leaves the oldest
   * turns out of the request, `middle` keeps the first turn and leaves out the ones after it, `stop` fails.
   * The conversation itself keeps every message.
   */
  contextPolicy?: ContextPolicy;
  /** Renamed by the person: the first message does not title it. */
  named?: boolean;
  /** Thinking on or off (the chat template's `enable_thinking`); absent: the template's default. */
  thinking?: boolean;
  messages: StoredMessage[];
}

export function newId(): string {
  const c = globalThis.crypto as Crypto | undefined;
  if (c && typeof c.randomUUID === 'function') return c.randomUUID();
  return Date.now().toString(36) + Math.random().toString(36).slice(2, 10);
}

export function newConversation(model: string | null, sampling: Sampling = {}): Conversation {
  const now = Date.now();
  return { id: newId(), title: 'New chat', created: now, updated: now, model, sampling: { ...sampling }, messages: [] };
}

/** A title from the first user message: its first line, shortened. */
export function titleFrom(text: string, images = 0): string {
  const line = text.trim().split('\n')[0]?.trim() ?? '';
  if (!line) return images > 0 ? 'Image' : 'New chat';
  return line.length > 60 ? line.slice(0, 57).trimEnd() + '…' : line;
}

/**
 * `history` with `k` turns (a user message and the replies after it) left out as `policy` says: the oldest
 * (`rolling`), or the oldest after the first (`middle`). The last turn always stays. Null when `k` turns
 * cannot be left out.
 */
export function leaveOut(history: StoredMessage[], policy: ContextPolicy, k: number): StoredMessage[] | null {
  if (policy === 'stop' || k <= 0) return k <= 0 ? history : null;
  const starts = history.flatMap((m, i) => (m.role === 'user' ? [i] : []));
  const first = policy === 'middle' ? 1 : 0;
  // Turns first .. first+k-1 go; the last turn (starts.length - 1) must stay.
  if (first + k > starts.length - 1) return null;
  const from = starts[first]!;
  const to = starts[first + k]!;
  return [...history.slice(0, from), ...history.slice(to)];
}
