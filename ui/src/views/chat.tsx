// Chat: conversations, streaming replies with markdown, images, stop and regenerate, per-chat sampling.

import { useCallback, useEffect, useMemo, useRef, useState } from 'preact/hooks';
import { api as defaultApi, type Api, ApiError, errorMessage, isAbort } from '../api';
import { attach, toApiMessages, type Attachment } from '../attachments';
import { showError } from '../components/banner';
import { MtpHealth } from '../components/mtp_health';
import * as fmt from '../format';
import { live as defaultLive, type LiveFeed } from '../live';
import { renderMarkdown, splitThinking } from '../markdown';
import {
  type Conversation,
  type ConversationStore,
  type ConversationSummary,
  newConversation,
  newId,
  type StoredMessage,
  titleFrom,
} from '../storage';
import type { ModelInfo, OpenAIModel, Sampling, Stats } from '../types';
import { LivePanel } from './panel';

interface Generation {
  conversation: Conversation;
  message: StoredMessage;
  controller: AbortController;
}

export interface ChatProps {
  store: ConversationStore;
  models: OpenAIModel[];
  adminModels: ModelInfo[];
  client?: Api;
  feed?: LiveFeed;
  showPanel?: boolean;
}

// ---------------------------------------------------------------------------------------------------
// Messages

function Markdown({ text }: { text: string }) {
  const html = useMemo(() => renderMarkdown(text), [text]);
  return <div class="markdown" dangerouslySetInnerHTML={{ __html: html }} />;
}

function statsLine(stats: Stats | null | undefined): string | null {
  if (!stats) return null;
  const parts: string[] = [];
  if (stats.decode_tok_s > 0) parts.push(`${stats.decode_tok_s.toFixed(1)} tok/s`);
  if (stats.completion_tokens > 0) parts.push(`${stats.completion_tokens} tokens`);
  const s = stats.spec;
  if (s && !s.fallback && s.drafted > 0) parts.push(`${fmt.percent(s.accepted / s.drafted)} accepted`);
  if (s?.fallback) parts.push('MTP off');
  if (stats.ttft_ms > 0) parts.push(`TTFT ${fmt.ms(stats.ttft_ms)}`);
  return parts.join(' · ') || null;
}

function AssistantMessage(props: {
  m: StoredMessage;
  streaming: boolean;
  last: boolean;
  canRegenerate: boolean;
  onRegenerate: () => void;
}) {
  const { m, streaming } = props;
  const split = splitThinking(m.content);
  const thinking = m.reasoning ? m.reasoning : split.thinking;
  const thinkingDone = m.reasoning ? !!split.answer || !streaming : split.thinkingDone;
  const line = statsLine(m.stats);
  const copy = () => {
    navigator.clipboard?.writeText(split.answer).catch(() => {});
  };
  return (
    <div
      class="message message-assistant"
      data-testid="message-assistant"
      data-role="assistant"
      data-streaming={streaming ? 'true' : 'false'}
      data-message-id={m.id}
    >
      {thinking != null && thinking !== '' && (
        <details class="thinking" open={streaming && !thinkingDone}>
          <summary>{streaming && !thinkingDone ? 'Thinking…' : 'Thought'}</summary>
          <Markdown text={thinking} />
        </details>
      )}
      <div class="message-body" data-testid="message-content">
        {split.answer ? <Markdown text={split.answer} /> : null}
        {streaming && <span class="cursor" aria-hidden="true" />}
      </div>
      {m.error && (
        <div class="message-error" data-testid="message-error">
          {m.error}
        </div>
      )}
      {!streaming && (
        <div class="message-meta">
          {m.stopped && <span class="tag">stopped</span>}
          {m.finish_reason === 'length' && <span class="tag">max tokens reached</span>}
          {line && (
            <span class="dim" data-testid="message-stats">
              {line}
            </span>
          )}
          <span class="spacer" />
          {split.answer && (
            <button class="link-button" onClick={copy} title="Copy the reply">
              Copy
            </button>
          )}
          {props.last && props.canRegenerate && (
            <button class="link-button" data-testid="chat-regenerate" onClick={props.onRegenerate}>
              Regenerate
            </button>
          )}
        </div>
      )}
    </div>
  );
}

function UserMessage({ m }: { m: StoredMessage }) {
  return (
    <div class="message message-user" data-testid="message-user" data-role="user" data-message-id={m.id}>
      {m.images && m.images.length > 0 && (
        <div class="message-images">
          {m.images.map((url, i) => (
            <img key={i} src={url} alt={`attached image ${i + 1}`} data-testid="message-image" />
          ))}
        </div>
      )}
      {m.content && <div class="message-text">{m.content}</div>}
    </div>
  );
}

// ---------------------------------------------------------------------------------------------------
// Sampling settings

function numberOrUndefined(v: string, integer = false): number | undefined {
  if (v.trim() === '') return undefined;
  const n = integer ? parseInt(v, 10) : parseFloat(v);
  return Number.isFinite(n) ? n : undefined;
}

function SamplingSettings(props: {
  conversation: Conversation;
  defaults: Sampling | undefined;
  onChange: (sampling: Sampling, system: string) => void;
  onClose: () => void;
}) {
  const s = props.conversation.sampling;
  const d = props.defaults ?? {};
  const set = (patch: Partial<Sampling>) => {
    const next: Sampling = { ...s, ...patch };
    for (const k of Object.keys(next) as (keyof Sampling)[]) if (next[k] === undefined) delete next[k];
    props.onChange(next, props.conversation.system ?? '');
  };
  const field = (
    key: keyof Sampling,
    label: string,
    opts: { step: string; min: string; max?: string; integer?: boolean; hint: string },
  ) => (
    <label class="field">
      <span class="field-label">{label}</span>
      <input
        type="number"
        data-testid={`setting-${key.replace('_', '-')}`}
        step={opts.step}
        min={opts.min}
        max={opts.max}
        value={s[key] ?? ''}
        placeholder={d[key] != null ? `default ${d[key]}` : 'model default'}
        onInput={(e) => set({ [key]: numberOrUndefined((e.target as HTMLInputElement).value, opts.integer) })}
      />
      <span class="field-hint">{opts.hint}</span>
    </label>
  );
  return (
    <div class="settings-popover" data-testid="chat-settings">
      <div class="settings-head">
        <h3>This chat’s sampling</h3>
        <button class="icon-button" aria-label="Close" onClick={props.onClose}>
          ×
        </button>
      </div>
      <p class="dim small">Empty fields use the model’s defaults from models.toml.</p>
      {field('temperature', 'Temperature', { step: '0.05', min: '0', max: '2', hint: '0 = greedy' })}
      {field('top_p', 'Top p', { step: '0.01', min: '0', max: '1', hint: 'nucleus sampling' })}
      {field('max_tokens', 'Max tokens', { step: '1', min: '1', integer: true, hint: 'reply length limit' })}
      {field('seed', 'Seed', { step: '1', min: '0', integer: true, hint: 'repeatable sampling' })}
      <label class="field field-wide">
        <span class="field-label">System prompt</span>
        <textarea
          data-testid="setting-system"
          rows={3}
          value={props.conversation.system ?? ''}
          placeholder="Optional"
          onInput={(e) => props.onChange(s, (e.target as HTMLTextAreaElement).value)}
        />
      </label>
      <button class="link-button" onClick={() => props.onChange({}, props.conversation.system ?? '')}>
        Reset to model defaults
      </button>
    </div>
  );
}

// ---------------------------------------------------------------------------------------------------
// The view

export function ChatView({ store, models, adminModels, client = defaultApi, feed = defaultLive, showPanel = true }: ChatProps) {
  const [summaries, setSummaries] = useState<ConversationSummary[]>([]);
  const [conversation, setConversation] = useState<Conversation | null>(null);
  const [, setTick] = useState(0);
  const [input, setInput] = useState('');
  const [attachments, setAttachments] = useState<Attachment[]>([]);
  const [dragging, setDragging] = useState(false);
  const [settingsOpen, setSettingsOpen] = useState(false);
  const generation = useRef<Generation | null>(null);
  const listRef = useRef<HTMLDivElement>(null);
  const inputRef = useRef<HTMLTextAreaElement>(null);
  const fileRef = useRef<HTMLInputElement>(null);
  const stick = useRef(true);
  const frame = useRef<number | null>(null);

  const rerender = useCallback(() => setTick((t) => t + 1), []);
  const scheduleRender = useCallback(() => {
    if (frame.current != null) return;
    const run = () => {
      frame.current = null;
      rerender();
    };
    frame.current = typeof requestAnimationFrame === 'function' ? requestAnimationFrame(run) : (setTimeout(run, 16) as unknown as number);
  }, [rerender]);

  const refreshList = useCallback(async () => {
    try {
      setSummaries(await store.list());
    } catch (e) {
      showError(e);
    }
  }, [store]);

  const persist = useCallback(
    async (c: Conversation) => {
      try {
        await store.save(c);
      } catch (e) {
        showError(e);
      }
      await refreshList();
    },
    [store, refreshList],
  );

  // Open the most recent conversation (or a new one) at start.
  useEffect(() => {
    let cancelled = false;
    (async () => {
      const list = await store.list().catch(() => [] as ConversationSummary[]);
      if (cancelled) return;
      setSummaries(list);
      const first = list[0] ? await store.load(list[0].id).catch(() => null) : null;
      if (!cancelled) setConversation(first ?? newConversation(null));
    })();
    return () => {
      cancelled = true;
    };
  }, [store]);

  // A conversation without a model (or with one that no longer exists) takes the first listed.
  const modelIds = models.map((m) => m.id);
  const currentModel =
    conversation?.model && (modelIds.length === 0 || modelIds.includes(conversation.model))
      ? conversation.model
      : (modelIds[0] ?? conversation?.model ?? null);
  const modelInfo = adminModels.find((m) => m.id === currentModel || m.name === currentModel);

  // Keep the newest text in view while the reader is at the bottom.
  useEffect(() => {
    const el = listRef.current;
    if (el && stick.current) el.scrollTop = el.scrollHeight;
  });

  const onScroll = () => {
    const el = listRef.current;
    if (el) stick.current = el.scrollHeight - el.scrollTop - el.clientHeight < 80;
  };

  // One generation at a time: `busy` while any runs, `generating` while this conversation's runs.
  const busy = generation.current != null;
  const generating = busy && generation.current!.conversation.id === conversation?.id;

  async function run(c: Conversation) {
    const model = c.model ?? currentModel;
    if (!model) {
      showError('No model to chat with: load or convert one under Models.');
      return;
    }
    c.model = model;
    const history = c.messages.slice();
    const message: StoredMessage = { id: newId(), role: 'assistant', content: '', model, created: Date.now() };
    c.messages.push(message);
    c.updated = Date.now();
    const controller = new AbortController();
    generation.current = { conversation: c, message, controller };
    stick.current = true;
    rerender();
    feed.generationStarted(model);
    let finalStats: Stats | null = null;
    try {
      const stream = client.chat({ model, messages: toApiMessages(history, c.system), ...c.sampling }, controller.signal);
      for await (const chunk of stream) {
        let tokens = 0;
        for (const choice of chunk.choices) {
          if (choice.index !== 0 && chunk.choices.length > 1) continue;
          if (choice.delta?.content) {
            message.content += choice.delta.content;
            tokens++;
          }
          if (choice.delta?.reasoning_content) {
            message.reasoning = (message.reasoning ?? '') + choice.delta.reasoning_content;
            tokens++;
          }
          if (choice.finish_reason) message.finish_reason = choice.finish_reason;
        }
        if (chunk.stats) {
          message.stats = chunk.stats;
          finalStats = chunk.stats;
        }
        feed.chunk(chunk.stats, tokens);
        scheduleRender();
      }
      // An abort may end the stream quietly rather than by throwing.
      if (controller.signal.aborted) message.stopped = true;
    } catch (e) {
      if (isAbort(e) || controller.signal.aborted) {
        message.stopped = true;
      } else {
        message.error = errorMessage(e);
        showError(e instanceof ApiError ? e : new Error(`The generation failed: ${errorMessage(e)}`));
      }
    } finally {
      generation.current = null;
      feed.generationEnded(finalStats);
      c.updated = Date.now();
      rerender();
      await persist(c);
    }
  }

  async function send() {
    if (!conversation || busy) return;
    const text = input.trim();
    if (!text && attachments.length === 0) return;
    const c = conversation;
    const images = attachments.map((a) => a.url);
    c.messages.push({ id: newId(), role: 'user', content: text, images: images.length ? images : undefined, created: Date.now() });
    if (c.messages.filter((m) => m.role === 'user').length === 1) c.title = titleFrom(text, images.length);
    c.model = currentModel;
    setInput('');
    setAttachments([]);
    if (inputRef.current) inputRef.current.style.height = '';
    await persist(c);
    await run(c);
  }

  function stop() {
    generation.current?.controller.abort();
  }

  async function regenerate() {
    if (!conversation || busy) return;
    const c = conversation;
    while (c.messages.length && c.messages[c.messages.length - 1]!.role === 'assistant') c.messages.pop();
    if (!c.messages.length) return;
    c.model = currentModel;
    await run(c);
  }

  async function open(id: string) {
    if (conversation?.id === id) return;
    if (generation.current?.conversation.id === id) {
      setConversation(generation.current.conversation);
      return;
    }
    try {
      const c = await store.load(id);
      if (c) setConversation(c);
      else showError('That conversation could not be read.');
    } catch (e) {
      showError(e);
    }
    setSettingsOpen(false);
  }

  function startNew() {
    setConversation(newConversation(currentModel, conversation?.sampling ?? {}));
    setInput('');
    setAttachments([]);
    setSettingsOpen(false);
    inputRef.current?.focus();
  }

  async function remove(id: string) {
    if (generation.current?.conversation.id === id) generation.current.controller.abort();
    try {
      await store.remove(id);
    } catch (e) {
      showError(e);
    }
    await refreshList();
    if (conversation?.id === id) setConversation(newConversation(currentModel, conversation.sampling));
  }

  async function addFiles(files: Iterable<File>) {
    const { attachments: added, rejected } = await attach(files);
    if (added.length) setAttachments((a) => [...a, ...added]);
    if (rejected.length) showError(`Not attached: ${rejected.join('; ')}`);
  }

  function onPaste(e: ClipboardEvent) {
    const files = [...(e.clipboardData?.files ?? [])].filter((f) => f.type.startsWith('image/'));
    if (files.length) {
      e.preventDefault();
      void addFiles(files);
    }
  }

  function onDrop(e: DragEvent) {
    e.preventDefault();
    setDragging(false);
    const files = [...(e.dataTransfer?.files ?? [])];
    if (files.length) void addFiles(files);
  }

  function onKeyDown(e: KeyboardEvent) {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      void send();
    }
  }

  function autoGrow(el: HTMLTextAreaElement) {
    el.style.height = 'auto';
    el.style.height = `${Math.min(el.scrollHeight, 240)}px`;
  }

  function changeModel(id: string) {
    if (!conversation) return;
    conversation.model = id;
    rerender();
    if (conversation.messages.length) void persist(conversation);
  }

  function changeSampling(sampling: Sampling, system: string) {
    if (!conversation) return;
    conversation.sampling = sampling;
    conversation.system = system || undefined;
    rerender();
    if (conversation.messages.length) void persist(conversation);
  }

  const messages = conversation?.messages ?? [];
  const lastIndex = messages.length - 1;
  const hasImages = attachments.length > 0 || messages.some((m) => m.images?.length);

  return (
    <div class={`chat-layout ${showPanel ? 'with-panel' : ''}`}>
      <nav class="conversations" aria-label="Conversations">
        <button class="button button-primary new-chat" data-testid="new-chat" onClick={startNew}>
          New chat
        </button>
        <ul data-testid="conversation-list">
          {summaries.map((s) => (
            <li
              key={s.id}
              class={`conversation-item ${s.id === conversation?.id ? 'active' : ''}`}
              data-testid="conversation-item"
              data-conversation-id={s.id}
            >
              <button class="conversation-open" onClick={() => void open(s.id)} title={s.title}>
                {s.title}
              </button>
              <button
                class="icon-button conversation-delete"
                data-testid="conversation-delete"
                aria-label={`Delete ${s.title}`}
                onClick={() => void remove(s.id)}
              >
                ×
              </button>
            </li>
          ))}
        </ul>
      </nav>

      <section
        class={`chat ${dragging ? 'dragging' : ''}`}
        onDragOver={(e) => {
          if ([...(e.dataTransfer?.types ?? [])].includes('Files')) {
            e.preventDefault();
            setDragging(true);
          }
        }}
        onDragLeave={(e) => {
          if (e.currentTarget === e.target) setDragging(false);
        }}
        onDrop={onDrop}
      >
        <header class="chat-header">
          <label class="model-picker">
            <span class="sr-only">Model</span>
            <select
              data-testid="chat-model-picker"
              value={currentModel ?? ''}
              onChange={(e) => changeModel((e.target as HTMLSelectElement).value)}
              disabled={generating}
            >
              {modelIds.length === 0 && <option value="">{currentModel ?? 'No models'}</option>}
              {modelIds.map((id) => (
                <option key={id} value={id}>
                  {id}
                </option>
              ))}
            </select>
          </label>
          {modelInfo && (
            <span class="dim small" data-testid="chat-model-status">
              {modelInfo.loaded ? 'loaded' : 'loads on first message'}
              {modelInfo.mtp.enabled && modelInfo.mtp.available ? ` · MTP depth ${modelInfo.mtp.depth}` : ' · MTP off'}
            </span>
          )}
          {modelInfo && (!modelInfo.mtp.available || modelInfo.mtp.probe != null) && <MtpHealth mtp={modelInfo.mtp} compact />}
          <span class="spacer" />
          <button
            class={`button ${settingsOpen ? 'active' : ''}`}
            data-testid="chat-settings-toggle"
            onClick={() => setSettingsOpen((o) => !o)}
            aria-expanded={settingsOpen}
          >
            Sampling
          </button>
          {settingsOpen && conversation && (
            <SamplingSettings
              conversation={conversation}
              defaults={modelInfo?.sampling}
              onChange={changeSampling}
              onClose={() => setSettingsOpen(false)}
            />
          )}
        </header>

        <div class="message-list" data-testid="message-list" ref={listRef} onScroll={onScroll}>
          {messages.length === 0 && (
            <div class="empty-chat">
              <h2>What shall we work on?</h2>
              <p class="dim">
                Type a message, or drop an image here. Replies stream with the model’s multi-token prediction; the panel
                on the right shows how much of it is accepted.
              </p>
            </div>
          )}
          {messages.map((m, i) =>
            m.role === 'assistant' ? (
              <AssistantMessage
                key={m.id}
                m={m}
                streaming={generating && generation.current?.message === m}
                last={i === lastIndex}
                canRegenerate={!busy}
                onRegenerate={() => void regenerate()}
              />
            ) : m.role === 'user' ? (
              <UserMessage key={m.id} m={m} />
            ) : null,
          )}
          {!busy && lastIndex >= 0 && messages[lastIndex]!.role === 'user' && (
            <div class="message-meta retry">
              <button class="link-button" data-testid="chat-regenerate" onClick={() => void regenerate()}>
                Generate a reply
              </button>
            </div>
          )}
        </div>

        <div class="composer">
          {attachments.length > 0 && (
            <div class="attachments" data-testid="attachment-previews">
              {attachments.map((a, i) => (
                <div class="attachment" key={i} data-testid="attachment-preview">
                  <img src={a.url} alt={a.name} />
                  <button
                    class="attachment-remove"
                    aria-label={`Remove ${a.name}`}
                    data-testid="attachment-remove"
                    onClick={() => setAttachments((list) => list.filter((_, j) => j !== i))}
                  >
                    ×
                  </button>
                </div>
              ))}
            </div>
          )}
          {hasImages && modelInfo && modelInfo.vision === false && (
            <div class="notice notice-warn small">This model has no vision tower; it cannot see images.</div>
          )}
          <div class="composer-row">
            <button
              class="icon-button attach-button"
              data-testid="chat-attach"
              aria-label="Attach images"
              title="Attach images"
              onClick={() => fileRef.current?.click()}
            >
              <svg viewBox="0 0 24 24" width="18" height="18" aria-hidden="true">
                <path
                  fill="none"
                  stroke="currentColor"
                  stroke-width="1.8"
                  stroke-linecap="round"
                  stroke-linejoin="round"
                  d="M21 12.5l-8.4 8.4a5.5 5.5 0 01-7.8-7.8l8.9-8.9a3.7 3.7 0 015.2 5.2l-8.9 8.9a1.8 1.8 0 01-2.6-2.6L15.6 7.5"
                />
              </svg>
            </button>
            <input
              ref={fileRef}
              type="file"
              accept="image/png,image/jpeg,image/gif,image/webp"
              multiple
              hidden
              data-testid="chat-file-input"
              onChange={(e) => {
                const el = e.target as HTMLInputElement;
                if (el.files) void addFiles([...el.files]);
                el.value = '';
              }}
            />
            <textarea
              ref={inputRef}
              data-testid="chat-input"
              rows={1}
              placeholder="Message — Enter to send, Shift+Enter for a new line"
              value={input}
              onInput={(e) => {
                const el = e.target as HTMLTextAreaElement;
                setInput(el.value);
                autoGrow(el);
              }}
              onKeyDown={onKeyDown}
              onPaste={onPaste}
            />
            {busy ? (
              <button
                class="button button-stop"
                data-testid="chat-stop"
                onClick={stop}
                title={generating ? 'Stop the reply' : 'Stop the reply streaming in another chat'}
              >
                Stop
              </button>
            ) : (
              <button
                class="button button-primary"
                data-testid="chat-send"
                onClick={() => void send()}
                disabled={!input.trim() && attachments.length === 0}
              >
                Send
              </button>
            )}
          </div>
        </div>
        {dragging && <div class="drop-overlay">Drop images to attach them</div>}
      </section>

      {showPanel && <LivePanel />}
    </div>
  );
}
