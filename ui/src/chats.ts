// The chat's state: the conversation list, the conversation shown and the reply streaming in, kept like
// live.ts keeps the panel's: one state object, replaced (never mutated) on every change, and listeners
// told of each new one. Views render it and call the actions; nothing else changes it.

import { type Api, ApiError, type ChatRequest, errorMessage, isAbort } from './api';
import { toApiMessages } from './attachments';
import { type ContextPolicy, type Conversation, leaveOut, newConversation, newId, type Sampling, showVersion, type StoredMessage, titleFrom } from './conversation';
import type { ChatCompletionChunk, ConversationSummary, Stats } from './generated';
import type { LiveFeed } from './live';
import type { ConversationStore } from './storage';

export interface ChatState {
  summaries: ConversationSummary[];
  /** The conversation shown; null until the first list has been read. */
  conversation: Conversation | null;
  /** The reply streaming in, if any (one at a time, in this or another conversation). */
  streaming: { conversationId: string; messageId: string } | null;
  /** The conversation deleted last, as it was, while its delete can be undone. */
  deleted: Conversation | null;
}

export const EMPTY: ChatState = { summaries: [], conversation: null, streaming: null, deleted: null };

/** What a new chat starts with besides its model: the model's system prompt and Settings' context policy. */
export type NewChatDefaults = Pick<Conversation, 'system' | 'contextPolicy'>;

/** `c` with `d` in place of its system prompt and context policy (one `d` lacks is removed). */
function withDefaults(c: Conversation, d: NewChatDefaults): Conversation {
  const next: Conversation = { ...c, system: d.system || undefined, contextPolicy: d.contextPolicy };
  if (next.system === undefined) delete next.system;
  if (next.contextPolicy === undefined) delete next.contextPolicy;
  return next;
}

/** `c` with message `id` replaced by `f(message)`. */
function withMessage(c: Conversation, id: string, f: (m: StoredMessage) => StoredMessage): Conversation {
  return { ...c, messages: c.messages.map((m) => (m.id === id ? f(m) : m)) };
}

/** The message after one chunk: its text, reasoning, finish reason and statistics. */
export function applyChunk(m: StoredMessage, chunk: ChatCompletionChunk): { message: StoredMessage; tokens: number } {
  let { content, reasoning, finish_reason, stats } = m;
  let tokens = 0;
  for (const choice of chunk.choices) {
    if (choice.index !== 0 && chunk.choices.length > 1) continue;
    const delta = choice.delta as ChatCompletionChunk['choices'][number]['delta'] & { reasoning_content?: string | null };
    if (delta.content) {
      content += delta.content;
      tokens++;
    }
    if (delta.reasoning_content) {
      reasoning = (reasoning ?? '') + delta.reasoning_content;
      tokens++;
    }
    if (choice.finish_reason) finish_reason = choice.finish_reason;
  }
  if (chunk.stats) stats = chunk.stats;
  const usage = chunk.usage ?? m.usage;
  return { message: { ...m, content, reasoning, finish_reason, stats, ...(usage ? { usage } : {}) }, tokens };
}

const tooLong = (e: unknown) => e instanceof ApiError && e.code === 'context_length_exceeded';

/** What a person can do when the conversation no longer fits the model's context. */
export function contextHint(e: unknown, c: Conversation): string {
  if (!tooLong(e)) return '';
  return c.sampling.max_tokens != null
    ? ' Lower or clear Max tokens under Sampling, or delete earlier messages.'
    : ' Delete earlier messages, or start a new chat.';
}

/** The request for a reply to `history` in `c`: its messages, its sampling, and thinking when set. */
export function requestOf(c: Conversation, model: string, history: StoredMessage[]): ChatRequest {
  const req: ChatRequest = { model, messages: toApiMessages(history, c.system), ...c.sampling };
  if (c.thinking != null) req.chat_template_kwargs = { enable_thinking: c.thinking };
  return req;
}

/**
 * The tokens the conversation holds in the model's context: the prompt and reply of its newest answer
 * (the `usage` the server sent, else the statistics). Null before any answer says.
 */
export function contextUsed(c: Conversation | null): number | null {
  for (let i = (c?.messages.length ?? 0) - 1; i >= 0; i--) {
    const m = c!.messages[i]!;
    if (m.role !== 'assistant') continue;
    if (m.usage) return m.usage.prompt_tokens + m.usage.completion_tokens;
    if (m.stats && m.stats.prompt_tokens + m.stats.completion_tokens > 0) return m.stats.prompt_tokens + m.stats.completion_tokens;
  }
  return null;
}

export class ChatStore {
  state: ChatState = EMPTY;
  private listeners = new Set<(s: ChatState) => void>();
  /** The conversation whose reply is streaming, as it is now, and how to stop it. */
  private running: { conversation: Conversation; controller: AbortController } | null = null;
  /** Conversations deleted in this window: a reply stopped by the delete must not save them again. */
  private deleted = new Set<string>();
  /** The defaults of a new chat on a model (null: the model the view shows for it); see `setNewChatDefaults`. */
  private defaults: (model: string | null) => NewChatDefaults = () => ({});
  /** The id of the new chat that follows the defaults of its model until the person changes or sends something. */
  private untouched: string | null = null;

  constructor(
    private readonly store: ConversationStore,
    private readonly client: Api,
    private readonly feed: LiveFeed,
    private readonly onError: (e: unknown) => void,
  ) {}

  subscribe(fn: (s: ChatState) => void): () => void {
    this.listeners.add(fn);
    return () => this.listeners.delete(fn);
  }

  private set(patch: Partial<ChatState>): void {
    this.state = { ...this.state, ...patch };
    for (const fn of this.listeners) fn(this.state);
  }

  /** Replaces a conversation: the running one, the shown one, or both. */
  private put(c: Conversation): void {
    if (this.running?.conversation.id === c.id) this.running = { ...this.running, conversation: c };
    if (this.state.conversation?.id === c.id) this.set({ conversation: c });
  }

  get busy(): boolean {
    return this.running != null;
  }

  /** A new chat on `model`, with its defaults. */
  private fresh(model: string | null): Conversation {
    const c = withDefaults(newConversation(model), this.defaults(model));
    this.untouched = c.id;
    return c;
  }

  /** The shown chat, while it is a new one the person has not changed: it takes its model's defaults. */
  private shownUntouched(): Conversation | null {
    const c = this.state.conversation;
    return c && c.id === this.untouched && c.messages.length === 0 ? c : null;
  }

  /**
   * How new chats start. The model list and the settings are read after the window opens, so the first
   * chat may be shown before they are known: a new chat still untouched takes them when they come.
   */
  setNewChatDefaults(defaults: (model: string | null) => NewChatDefaults): void {
    this.defaults = defaults;
    const c = this.shownUntouched();
    if (!c) return;
    const next = withDefaults(c, defaults(c.model));
    if (next.system !== c.system || next.contextPolicy !== c.contextPolicy) this.put(next);
  }

  /** Reads the list and opens the most recent conversation (or a new one). */
  async start(): Promise<void> {
    const list = await this.store.list().catch(() => [] as ConversationSummary[]);
    const first = list[0] ? await this.store.load(list[0].id).catch(() => null) : null;
    this.set({ summaries: list, conversation: this.state.conversation ?? first ?? this.fresh(null) });
  }

  async refreshList(): Promise<void> {
    try {
      this.set({ summaries: await this.store.list() });
    } catch (e) {
      this.onError(e);
    }
  }

  private async persist(c: Conversation): Promise<void> {
    try {
      await this.store.save(c);
    } catch (e) {
      this.onError(e);
    }
    await this.refreshList();
  }

  async open(id: string): Promise<void> {
    if (this.state.conversation?.id === id) return;
    if (this.running?.conversation.id === id) {
      this.set({ conversation: this.running.conversation });
      return;
    }
    try {
      const c = await this.store.load(id);
      if (c) this.set({ conversation: c });
      else this.onError('That conversation could not be read.');
    } catch (e) {
      this.onError(e);
    }
  }

  /**
   * A new chat takes the model's defaults (empty sampling, its system prompt) and Settings' context policy,
   * never the previous chat's settings.
   */
  startNew(model: string | null): void {
    this.set({ conversation: this.fresh(model) });
  }

  async remove(id: string, model: string | null): Promise<void> {
    // Kept as it is now, for an undo: the streaming one, the shown one, or as saved.
    const streamingId = this.state.streaming?.conversationId === id ? this.state.streaming.messageId : null;
    const kept =
      this.running?.conversation.id === id
        ? withMessage(this.running.conversation, streamingId ?? '', (m) => ({ ...m, stopped: true }))
        : this.state.conversation?.id === id
          ? this.state.conversation
          : await this.store.load(id).catch(() => null);
    // Marked first: the stopped reply's save (in run's `finally`) must not bring it back.
    this.deleted.add(id);
    if (this.running?.conversation.id === id) this.running.controller.abort();
    try {
      await this.store.remove(id);
    } catch (e) {
      this.onError(e);
    }
    await this.refreshList();
    if (this.state.conversation?.id === id) this.set({ conversation: this.fresh(model) });
    this.set({ deleted: kept && kept.messages.length ? kept : null });
  }

  /** Brings back the conversation deleted last (a stopped reply stays as far as it came). */
  async undoRemove(): Promise<void> {
    const c = this.state.deleted;
    if (!c) return;
    this.deleted.delete(c.id);
    const back = { ...c, messages: c.messages.filter((m) => m.role !== 'assistant' || m.content || m.error) };
    this.set({ deleted: null });
    await this.persist(back);
    if (!this.running || this.running.conversation.id !== this.state.conversation?.id) this.set({ conversation: back });
  }

  /** The undo is no longer offered. */
  forgetRemoved(): void {
    if (this.state.deleted) this.set({ deleted: null });
  }

  /** Renames a conversation (shown, streaming or saved); an empty title is ignored. */
  async rename(id: string, title: string): Promise<void> {
    const t = title.trim();
    if (!t) return;
    const base =
      this.running?.conversation.id === id
        ? this.running.conversation
        : this.state.conversation?.id === id
          ? this.state.conversation
          : await this.store.load(id).catch(() => null);
    if (!base) return;
    const next = { ...base, title: t, named: true };
    this.put(next);
    // A streaming conversation is saved when its reply ends (with the new title, kept by `put`).
    if (this.running?.conversation.id !== id && next.messages.length) await this.persist(next);
  }

  /** Saves an imported conversation and shows it. */
  async importConversation(c: Conversation): Promise<void> {
    this.deleted.delete(c.id);
    await this.persist(c);
    if (!this.running || this.running.conversation.id !== this.state.conversation?.id) this.set({ conversation: c });
  }

  /** Replaces the text of user message `id`, drops everything after it, and asks again. */
  async editAndRegenerate(id: string, text: string, model: string | null): Promise<void> {
    const c = this.state.conversation;
    if (!c || this.busy) return;
    const i = c.messages.findIndex((m) => m.id === id && m.role === 'user');
    if (i < 0) return;
    const edited = { ...c.messages[i]!, content: text };
    if (!edited.content.trim() && !edited.images?.length) return;
    const next: Conversation = { ...c, model, messages: [...c.messages.slice(0, i), edited] };
    this.put(next);
    await this.run(next);
  }

  /** Removes one message (user or assistant) from the shown conversation, e.g. an image a model cannot take. */
  deleteMessage(id: string): void {
    const c = this.state.conversation;
    if (!c || this.running?.conversation.id === c.id) return;
    const next: Conversation = { ...c, messages: c.messages.filter((m) => m.id !== id), updated: Date.now() };
    this.put(next);
    void this.persist(next);
  }

  /** Removes every image from the shown conversation (a message left empty goes too), so a text-only model can go on. */
  dropImages(): void {
    const c = this.state.conversation;
    if (!c || this.running?.conversation.id === c.id) return;
    const messages = c.messages
      .map((m) => (m.images?.length ? { ...m, images: undefined } : m))
      .filter((m) => m.role !== 'user' || m.content.trim() !== '' || m.images?.length);
    const next: Conversation = { ...c, messages, updated: Date.now() };
    this.put(next);
    void this.persist(next);
  }

  /** The model of the shown conversation changes (an untouched new chat takes its defaults); one with messages is saved. */
  changeModel(model: string): void {
    const c = this.state.conversation;
    if (!c) return;
    const next = this.shownUntouched() ? withDefaults({ ...c, model }, this.defaults(model)) : { ...c, model };
    this.put(next);
    if (next.messages.length) void this.persist(next);
  }

  changeSettings(sampling: Sampling, system: string, thinking: boolean | undefined = this.state.conversation?.thinking): void {
    const c = this.state.conversation;
    if (!c) return;
    const next: Conversation = { ...c, sampling, system: system || undefined, thinking };
    if (thinking === undefined) delete next.thinking;
    this.untouched = null;
    this.put(next);
    if (next.messages.length) void this.persist(next);
  }

  /** Each saved conversation's text in lower case, by id, as of its `updated`: read once for searches. */
  private texts = new Map<string, { updated: number; text: string }>();

  /** The ids of the listed conversations whose title or messages contain `needle` (any case). */
  async search(needle: string): Promise<Set<string>> {
    const n = needle.trim().toLowerCase();
    const found = new Set<string>();
    if (!n) return found;
    for (const s of this.state.summaries) {
      let entry = this.texts.get(s.id);
      if (!entry || entry.updated !== s.updated) {
        const c = await this.store.load(s.id).catch(() => null);
        const text = [s.title, c?.system ?? '', ...(c?.messages ?? []).map((m) => m.content)].join('\n').toLowerCase();
        entry = { updated: s.updated, text };
        this.texts.set(s.id, entry);
      }
      if (entry.text.includes(n) || s.title.toLowerCase().includes(n)) found.add(s.id);
    }
    return found;
  }

  /** What the shown chat does when it outgrows the model's context. */
  changeContextPolicy(policy: ContextPolicy): void {
    const c = this.state.conversation;
    if (!c) return;
    const next: Conversation = { ...c, contextPolicy: policy };
    this.untouched = null;
    this.put(next);
    if (next.messages.length) void this.persist(next);
  }

  /** Sends a user message (text and images as data URLs) to `model`, then streams the reply. */
  async send(text: string, images: string[], model: string | null): Promise<void> {
    const c = this.state.conversation;
    if (!c || this.busy) return;
    const message: StoredMessage = {
      id: newId(),
      role: 'user',
      content: text,
      images: images.length ? images : undefined,
      created: Date.now(),
    };
    const first = !c.messages.some((m) => m.role === 'user');
    const next: Conversation = {
      ...c,
      title: first && !c.named ? titleFrom(text, images.length) : c.title,
      model,
      messages: [...c.messages, message],
    };
    this.put(next);
    await this.persist(next);
    await this.run(next);
  }

  /** Asks again for the trailing reply; the reply it replaces stays as an earlier version (an empty or failed one does not). */
  async regenerate(model: string | null): Promise<void> {
    const c = this.state.conversation;
    if (!c || this.busy) return;
    let end = c.messages.length;
    while (end > 0 && c.messages[end - 1]!.role === 'assistant') end--;
    if (end === 0) return;
    const last = c.messages[c.messages.length - 1]!;
    let earlier: StoredMessage[] = [];
    if (last.role === 'assistant') {
      const { versions, ...shown } = last;
      earlier = [...(versions ?? []), ...(shown.content.trim() && !shown.error ? [shown] : [])];
    }
    const next: Conversation = { ...c, model, messages: c.messages.slice(0, end) };
    this.put(next);
    await this.run(next, earlier);
  }

  /** Shows version `k` of reply `id` (see `versionsOf`). */
  chooseVersion(id: string, k: number): void {
    const c = this.state.conversation;
    if (!c || this.running?.conversation.id === c.id) return;
    const next = withMessage(c, id, (m) => showVersion(m, k));
    this.put(next);
    void this.persist(next);
  }

  stop(): void {
    this.running?.controller.abort();
  }

  /** Streams one request's reply into the message `update` changes. */
  private async stream(
    req: ChatRequest,
    signal: AbortSignal,
    update: (f: (m: StoredMessage) => StoredMessage) => void,
    onStats: (s: Stats) => void,
  ): Promise<void> {
    for await (const chunk of this.client.chat(req, signal)) {
      let tokens = 0;
      update((m) => {
        const applied = applyChunk(m, chunk);
        tokens = applied.tokens;
        return applied.message;
      });
      if (chunk.stats) onStats(chunk.stats);
      this.feed.chunk(chunk.stats, tokens);
    }
  }

  private async run(c: Conversation, earlier: StoredMessage[] = []): Promise<void> {
    const model = c.model;
    if (!model) {
      this.onError('No model to chat with: load or convert one under Models.');
      return;
    }
    const history = c.messages;
    // Versions are ordered by `created`: a reply is always later than the ones it replaces.
    const created = Math.max(Date.now(), ...earlier.map((v) => v.created + 1));
    const reply: StoredMessage = { id: newId(), role: 'assistant', content: '', model, created };
    if (earlier.length) reply.versions = earlier;
    const controller = new AbortController();
    this.running = { conversation: c, controller };
    this.put({ ...c, messages: [...history, reply], updated: Date.now() });
    this.set({ streaming: { conversationId: c.id, messageId: reply.id } });
    this.feed.generationStarted(model);
    const update = (f: (m: StoredMessage) => StoredMessage) => {
      if (this.running) this.put(withMessage(this.running.conversation, reply.id, f));
    };
    let finalStats: Stats | null = null;
    try {
      // Past the context, the policy leaves out one more turn per refusal, until the request fits; the
      // engine refuses before generating, so each try is cheap.
      let sent = history;
      for (let left = 0; ; left++) {
        try {
          await this.stream(requestOf(c, model, sent), controller.signal, update, (s) => (finalStats = s));
          break;
        } catch (e) {
          const fewer = tooLong(e) && !controller.signal.aborted ? leaveOut(history, c.contextPolicy ?? 'rolling', left + 1) : null;
          if (!fewer) throw e;
          sent = fewer;
          update((m) => ({ ...m, leftOut: left + 1 }));
        }
      }
      // An abort may end the stream quietly rather than by throwing.
      if (controller.signal.aborted) update((m) => ({ ...m, stopped: true }));
    } catch (e) {
      if (isAbort(e) || controller.signal.aborted) {
        update((m) => ({ ...m, stopped: true }));
      } else {
        update((m) => ({ ...m, error: errorMessage(e) + contextHint(e, c) }));
        this.onError(e instanceof ApiError ? e : new Error(`The generation failed: ${errorMessage(e)}`));
      }
    } finally {
      const done = { ...this.running!.conversation, updated: Date.now() };
      this.running = null;
      const gone = this.deleted.has(done.id);
      if (!gone) this.put(done);
      this.set({ streaming: null });
      this.feed.generationEnded(finalStats);
      if (!gone) await this.persist(done);
    }
  }
}
