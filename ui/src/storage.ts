// Conversations on disk. In a browser they live in localStorage; the Tauri shell may provide file storage
// by setting `window.__TANDEM_STORAGE__` to an object with the ConversationStore methods before the UI
// starts.

import type { Sampling, Stats } from './types';

export interface StoredMessage {
  id: string;
  role: 'user' | 'assistant' | 'system';
  /** The text (for an assistant, the reply as streamed, `<think>` block included). */
  content: string;
  /** Images attached to a user message, as data URLs. */
  images?: string[];
  /** Reasoning sent separately (`delta.reasoning_content`), if the server does that. */
  reasoning?: string;
  /** The model that wrote an assistant message. */
  model?: string;
  /** Statistics of the generation that wrote it. */
  stats?: Stats | null;
  /** Set when generation stopped early: "stopped" by the user, or the error's message. */
  stopped?: boolean;
  error?: string;
  finish_reason?: string | null;
  created: number;
}

export interface Conversation {
  id: string;
  title: string;
  created: number;
  updated: number;
  model: string | null;
  /** This chat's sampling; a field left out takes the model's default (models.toml). */
  sampling: Sampling;
  /** An optional system prompt. */
  system?: string;
  messages: StoredMessage[];
}

export interface ConversationSummary {
  id: string;
  title: string;
  updated: number;
}

export interface ConversationStore {
  list(): Promise<ConversationSummary[]>;
  load(id: string): Promise<Conversation | null>;
  save(conversation: Conversation): Promise<void>;
  remove(id: string): Promise<void>;
}

const INDEX_KEY = 'tandem.conversations.v1';
const ITEM_PREFIX = 'tandem.conversation.v1.';

/** localStorage (or any Web Storage): an index of summaries plus one item per conversation. */
export class WebStorageStore implements ConversationStore {
  constructor(private readonly storage: Storage) {}

  private readIndex(): ConversationSummary[] {
    try {
      const raw = this.storage.getItem(INDEX_KEY);
      const parsed: unknown = raw ? JSON.parse(raw) : [];
      return Array.isArray(parsed) ? (parsed as ConversationSummary[]) : [];
    } catch {
      return [];
    }
  }

  private writeIndex(index: ConversationSummary[]): void {
    this.storage.setItem(INDEX_KEY, JSON.stringify(index));
  }

  async list(): Promise<ConversationSummary[]> {
    return this.readIndex().sort((a, b) => b.updated - a.updated);
  }

  async load(id: string): Promise<Conversation | null> {
    const raw = this.storage.getItem(ITEM_PREFIX + id);
    if (!raw) return null;
    try {
      return JSON.parse(raw) as Conversation;
    } catch {
      return null;
    }
  }

  async save(c: Conversation): Promise<void> {
    try {
      this.storage.setItem(ITEM_PREFIX + c.id, JSON.stringify(c));
    } catch (e) {
      // A DOMException from another realm is not `instanceof Error`: look at its fields.
      const { name = '', message = String(e) } = (e ?? {}) as { name?: string; message?: string };
      const full = name === 'QuotaExceededError' || /quota/i.test(message);
      throw new Error(
        full
          ? `Could not save the conversation "${c.title}": the browser's storage is full (images take much room). Delete old conversations to make space.`
          : `Could not save the conversation "${c.title}": ${message}`,
      );
    }
    const index = this.readIndex().filter((s) => s.id !== c.id);
    index.push({ id: c.id, title: c.title, updated: c.updated });
    this.writeIndex(index);
  }

  async remove(id: string): Promise<void> {
    this.storage.removeItem(ITEM_PREFIX + id);
    this.writeIndex(this.readIndex().filter((s) => s.id !== id));
  }
}

/** Kept in memory only: where no storage is available. */
export class MemoryStore implements ConversationStore {
  private items = new Map<string, string>();

  async list(): Promise<ConversationSummary[]> {
    return [...this.items.values()]
      .map((raw) => JSON.parse(raw) as Conversation)
      .map(({ id, title, updated }) => ({ id, title, updated }))
      .sort((a, b) => b.updated - a.updated);
  }

  async load(id: string): Promise<Conversation | null> {
    const raw = this.items.get(id);
    return raw ? (JSON.parse(raw) as Conversation) : null;
  }

  async save(c: Conversation): Promise<void> {
    this.items.set(c.id, JSON.stringify(c));
  }

  async remove(id: string): Promise<void> {
    this.items.delete(id);
  }
}

function isStore(x: unknown): x is ConversationStore {
  if (!x || typeof x !== 'object') return false;
  const s = x as Record<string, unknown>;
  return ['list', 'load', 'save', 'remove'].every((k) => typeof s[k] === 'function');
}

/** The shell's store if it gave one, else localStorage, else memory. */
export function defaultStore(): ConversationStore {
  const injected = (globalThis as { __TANDEM_STORAGE__?: unknown }).__TANDEM_STORAGE__;
  if (isStore(injected)) return injected;
  try {
    const ls = globalThis.localStorage;
    if (ls) {
      const probe = 'tandem.probe';
      ls.setItem(probe, '1');
      ls.removeItem(probe);
      return new WebStorageStore(ls);
    }
  } catch {
    // storage disabled (private mode, sandboxed frame)
  }
  return new MemoryStore();
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
