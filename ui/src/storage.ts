// Conversations on disk. The engine keeps them (`/api/conversations`: one JSON file each in its
// conversations folder), so they outlive the page's origin: the desktop window's origin changes with the
// engine's port, and a browser's localStorage belongs to one origin. On the first start against such an
// engine, conversations an earlier Tandem kept in this browser's localStorage move there. localStorage
// remains the store only when the engine has no conversation store. The Tauri shell may still provide
// its own storage by setting `window.__TANDEM_STORAGE__` to an object with the ConversationStore
// methods before the UI starts.

import { type Api, ApiError, errorMessage } from './api';
import type { Conversation } from './conversation';
import type { ConversationSummary } from './generated';

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

/** What the engine's store needs of the API client (api.ts). */
export type ConversationApi = Pick<Api, 'listConversations' | 'getConversation' | 'putConversation' | 'deleteConversation'>;

/** The engine's store: one JSON file per conversation in the engine's conversations folder. */
export class ServerStore implements ConversationStore {
  constructor(private readonly client: ConversationApi) {}

  async list(): Promise<ConversationSummary[]> {
    return (await this.client.listConversations()).sort((a, b) => b.updated - a.updated);
  }

  load(id: string): Promise<Conversation | null> {
    return this.client.getConversation(id);
  }

  async save(c: Conversation): Promise<void> {
    try {
      await this.client.putConversation(c);
    } catch (e) {
      const why =
        e instanceof ApiError && e.status === 413
          ? 'it is larger than the engine accepts (images take much room); remove some images or start a new chat'
          : errorMessage(e);
      throw new Error(`Could not save the conversation "${c.title}": ${why}`);
    }
  }

  remove(id: string): Promise<void> {
    return this.client.deleteConversation(id);
  }
}

export interface Migration {
  /** Ids now kept by the engine and removed from this browser. */
  moved: string[];
  /** Conversations that stay in this browser, to be tried again at the next start. */
  failed: { id: string; title: string; error: string }[];
}

/**
 * Moves the conversations in `from` (this browser's localStorage) to `to` (the engine), given what
 * `to` already holds (`present`): each one `to` lacks, or holds in an older version, is saved there, then
 * removed from `from`. One that cannot be moved stays in `from`: nothing is lost.
 */
export async function migrate(from: ConversationStore, to: ConversationStore, present: ConversationSummary[]): Promise<Migration> {
  const result: Migration = { moved: [], failed: [] };
  const there = new Map(present.map((s) => [s.id, s.updated]));
  for (const s of await from.list()) {
    try {
      const updated = there.get(s.id);
      if (updated === undefined || updated < s.updated) {
        const c = await from.load(s.id);
        if (!c) throw new Error('it cannot be read');
        await to.save(c);
      }
      await from.remove(s.id);
      result.moved.push(s.id);
    } catch (e) {
      result.failed.push({ id: s.id, title: s.title, error: errorMessage(e) });
    }
  }
  return result;
}

/**
 * The engine's store when the engine has one, else `local` (this browser's storage). The choice is made
 * at the first call, by listing the engine's conversations; conversations kept in `local` then move to
 * the engine (`migrate`). While the engine cannot be reached, calls fail and the choice waits for the
 * next call, so nothing is written where it would later be missed.
 */
export class EngineStore implements ConversationStore {
  private chosen: Promise<ConversationStore> | null = null;

  constructor(
    private readonly client: ConversationApi,
    private readonly local: ConversationStore,
    private readonly onProblem: (message: string) => void = (m) => console.warn(m),
  ) {}

  /** The store in use: resolves once the engine has answered. */
  store(): Promise<ConversationStore> {
    this.chosen ??= this.choose().catch((e: unknown) => {
      this.chosen = null;
      throw e;
    });
    return this.chosen;
  }

  private async choose(): Promise<ConversationStore> {
    let present: ConversationSummary[];
    try {
      present = await this.client.listConversations();
    } catch (e) {
      // An engine without a conversation store (an older one): this browser keeps them.
      if (e instanceof ApiError && (e.status === 404 || e.status === 405)) return this.local;
      throw e;
    }
    const server = new ServerStore(this.client);
    const { failed } = await migrate(this.local, server, present);
    if (failed.length) {
      const which = failed.map((f) => `"${f.title}" (${f.error})`).join('; ');
      this.onProblem(
        `${failed.length} conversation${failed.length > 1 ? 's' : ''} kept in this browser could not be moved to the engine and stay${failed.length > 1 ? '' : 's'} here for now: ${which}`,
      );
    }
    return server;
  }

  async list(): Promise<ConversationSummary[]> {
    return (await this.store()).list();
  }

  async load(id: string): Promise<Conversation | null> {
    return (await this.store()).load(id);
  }

  async save(c: Conversation): Promise<void> {
    return (await this.store()).save(c);
  }

  async remove(id: string): Promise<void> {
    return (await this.store()).remove(id);
  }
}

function isStore(x: unknown): x is ConversationStore {
  if (!x || typeof x !== 'object') return false;
  const s = x as Record<string, unknown>;
  return ['list', 'load', 'save', 'remove'].every((k) => typeof s[k] === 'function');
}

/** localStorage where it works, else memory. */
export function browserStore(): ConversationStore {
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

/**
 * The shell's store if it gave one; else, given the engine's client, the engine's store (moving this
 * browser's conversations there, and falling back to this browser's storage when the engine has no
 * store); else localStorage, else memory.
 */
export function defaultStore(client?: ConversationApi, onProblem?: (message: string) => void): ConversationStore {
  const injected = (globalThis as { __TANDEM_STORAGE__?: unknown }).__TANDEM_STORAGE__;
  if (isStore(injected)) return injected;
  const local = browserStore();
  return client ? new EngineStore(client, local, onProblem) : local;
}
