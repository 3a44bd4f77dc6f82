// Chat: the conversation list, the messages, the composer (text and images) and the live panel. The state
// lives in a ChatStore (chats.ts); this view renders it and turns clicks into its actions.

import { useEffect, useMemo, useRef, useState } from 'preact/hooks';
import { api as defaultApi, type Api } from '../../api';
import { attach, type Attachment } from '../../attachments';
import { ChatStore, type ChatState, contextUsed } from '../../chats';
import { showError } from '../../components/banner';
import { ContextMenu, type Menu, type MenuItem } from '../../components/menu';
import { MtpHealth, mtpOff } from '../../components/mtp_health';
import type { ContextPolicy } from '../../conversation';
import * as fmt from '../../format';
import type { ModelStatus, OpenAIModel } from '../../generated';
import { shortcutOf, titled } from '../../keys';
import { live as defaultLive, type LiveFeed } from '../../live';
import { splitThinking } from '../../markdown';
import type { ConversationStore } from '../../storage';
import { fileName, fromJson, readText, toJson, toMarkdown } from '../../transfer';
import { LivePanel } from '../panel';
import { AssistantMessage, COPIED_MS, copyWithFeedback, UserMessage } from './message';
import { SamplingSettings } from './settings';
import { ShortcutsHelp } from './shortcuts';

export interface ChatProps {
  store: ConversationStore;
  models: OpenAIModel[];
  adminModels: ModelStatus[];
  client?: Api;
  feed?: LiveFeed;
  showPanel?: boolean;
  /** Settings' policy for new chats; undefined until the settings are read. */
  contextPolicy?: ContextPolicy;
  /** Where the engine keeps the chats (Settings): a new folder lists other chats. */
  conversationsDir?: string;
}

/** The model a conversation on `model` uses: its own while listed, else the first listed (the default). */
function modelFor(model: string | null | undefined, ids: string[]): string | null {
  return model && (ids.length === 0 || ids.includes(model)) ? model : (ids[0] ?? model ?? null);
}

/** Hands `text` to the browser as a file download. */
function download(name: string, type: string, text: string): void {
  const url = URL.createObjectURL(new Blob([text], { type }));
  const a = document.createElement('a');
  a.href = url;
  a.download = name;
  document.body.appendChild(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}

/** How long a delete can be undone. */
export const UNDO_MS = 10_000;

/** The store's state, re-rendering on each change. */
function useChats(chats: ChatStore): ChatState {
  const [state, setState] = useState<ChatState>(chats.state);
  useEffect(() => {
    setState(chats.state);
    return chats.subscribe(setState);
  }, [chats]);
  return state;
}

export function ChatView({
  store,
  models,
  adminModels,
  client = defaultApi,
  feed = defaultLive,
  showPanel = true,
  contextPolicy,
  conversationsDir,
}: ChatProps) {
  const chats = useMemo(() => new ChatStore(store, client, feed, showError), [store, client, feed]);
  const { summaries, conversation, streaming, deleted } = useChats(chats);
  const [search, setSearch] = useState('');
  const [renaming, setRenaming] = useState<string | null>(null);
  const importRef = useRef<HTMLInputElement>(null);
  const [input, setInput] = useState('');
  const [attachments, setAttachments] = useState<Attachment[]>([]);
  const [dragging, setDragging] = useState(false);
  const [settingsOpen, setSettingsOpen] = useState(false);
  const [menu, setMenu] = useState<Menu | null>(null);
  const [helpOpen, setHelpOpen] = useState(false);
  /** The user message being edited (its Edit button or the context menu). */
  const [editingId, setEditingId] = useState<string | null>(null);
  /** "Copied" where the context menu was, for a moment. */
  const [flash, setFlash] = useState<{ x: number; y: number; label: string } | null>(null);
  const flashTimer = useRef<ReturnType<typeof setTimeout>>();
  const helpRef = useRef<HTMLButtonElement>(null);
  const listRef = useRef<HTMLDivElement>(null);
  const inputRef = useRef<HTMLTextAreaElement>(null);
  const fileRef = useRef<HTMLInputElement>(null);
  const pickerRef = useRef<HTMLSelectElement>(null);
  const stick = useRef(true);

  // Keys (keys.ts). Escape closes the settings, else stops a reply; a menu or popover open takes it first
  // (components/dismiss.ts), and so does a field that uses it itself (rename, edit, search).
  const keys = useRef({ settingsOpen, busy: false, startNew: () => {}, stop: () => {} });
  useEffect(() => {
    const onKey = (e: KeyboardEvent) => {
      // Only while the chat is the view shown (the app keeps every view mounted).
      if (!listRef.current || listRef.current.closest('[hidden]')) return;
      const shortcut = shortcutOf(e);
      if (!shortcut) return;
      const k = keys.current;
      if (shortcut.action === 'escape') {
        if (e.defaultPrevented) return;
        if (k.settingsOpen) setSettingsOpen(false);
        else if (k.busy) k.stop();
        return;
      }
      e.preventDefault();
      switch (shortcut.action) {
        case 'new-chat':
          k.startNew();
          break;
        case 'settings':
          setHelpOpen(false);
          setSettingsOpen((o) => !o);
          break;
        case 'model': {
          const picker = pickerRef.current as (HTMLSelectElement & { showPicker?: () => void }) | null;
          picker?.focus();
          // Opens the list where the browser allows it (a key press is a user gesture); focus is enough else.
          try {
            picker?.showPicker?.();
          } catch {
            /* not allowed here */
          }
          break;
        }
        case 'focus-input':
          inputRef.current?.focus();
          break;
        case 'help':
          setSettingsOpen(false);
          setHelpOpen((o) => !o);
          break;
      }
    };
    document.addEventListener('keydown', onKey);
    return () => document.removeEventListener('keydown', onKey);
  }, []);

  useEffect(() => () => clearTimeout(flashTimer.current), []);

  // A delete can be undone for a while.
  useEffect(() => {
    if (!deleted) return;
    const t = setTimeout(() => chats.forgetRemoved(), UNDO_MS);
    return () => clearTimeout(t);
  }, [chats, deleted]);

  // Open the most recent conversation (or a new one) at start.
  useEffect(() => {
    void chats.start();
  }, [chats]);

  // A conversation without a model (or with one that no longer exists) takes the first listed.
  const modelIds = models.map((m) => m.id);
  const currentModel = modelFor(conversation?.model, modelIds);
  const infoOf = (model: string | null) => adminModels.find((m) => m.id === model || m.name === model);
  const modelInfo = infoOf(currentModel);

  // A new chat starts with its model's system prompt (Models) and Settings' context policy.
  useEffect(() => {
    chats.setNewChatDefaults((model) => ({
      system: infoOf(modelFor(model, modelIds))?.system_prompt ?? undefined,
      contextPolicy,
    }));
  }, [chats, models, adminModels, contextPolicy]);

  // The engine lists the chats of a new conversations folder from now on.
  const shownDir = useRef(conversationsDir);
  useEffect(() => {
    if (shownDir.current !== undefined && conversationsDir !== shownDir.current) void chats.refreshList();
    shownDir.current = conversationsDir;
  }, [chats, conversationsDir]);

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
  const busy = streaming != null;
  const generating = busy && streaming?.conversationId === conversation?.id;

  async function send() {
    if (!conversation || busy || blocked) return;
    const text = input.trim();
    if (!text && attachments.length === 0) return;
    const images = attachments.map((a) => a.url);
    setInput('');
    setAttachments([]);
    if (inputRef.current) inputRef.current.style.height = '';
    stick.current = true;
    await chats.send(text, images, currentModel);
  }

  function edit(id: string, text: string) {
    stick.current = true;
    void chats.editAndRegenerate(id, text, currentModel);
  }

  function regenerate() {
    stick.current = true;
    void chats.regenerate(currentModel);
  }

  function open(id: string) {
    void chats.open(id);
    setSettingsOpen(false);
    setEditingId(null);
  }

  function startNew() {
    chats.startNew(currentModel);
    setInput('');
    setAttachments([]);
    setSettingsOpen(false);
    setEditingId(null);
    inputRef.current?.focus();
  }

  async function addFiles(files: Iterable<File>) {
    const { attachments: added, rejected } = await attach(files);
    if (added.length) setAttachments((a) => [...a, ...added]);
    if (rejected.length) showError(`Not attached: ${rejected.join('; ')}`);
  }

  async function importFile(file: File) {
    try {
      const c = fromJson(await readText(file), (id) => summaries.some((s) => s.id === id));
      await chats.importConversation(c);
    } catch (e) {
      showError(`Could not import ${file.name}: ${e instanceof Error ? e.message : String(e)}`);
    }
  }

  const needle = search.trim().toLowerCase();
  // Titles match at once; the messages' text is searched (each chat read once) a moment after typing stops.
  const [textMatches, setTextMatches] = useState<{ needle: string; ids: Set<string> } | null>(null);
  useEffect(() => {
    if (!needle) return;
    let live = true;
    const t = setTimeout(() => {
      void chats.search(needle).then((ids) => live && setTextMatches({ needle, ids }));
    }, 200);
    return () => {
      live = false;
      clearTimeout(t);
    };
  }, [chats, needle, summaries]);
  const matched = textMatches?.needle === needle ? textMatches.ids : null;
  const shownSummaries = needle
    ? summaries.filter((s) => s.title.toLowerCase().includes(needle) || matched?.has(s.id))
    : summaries;

  // A message's own context menu; text fields keep the browser's (spelling, paste). A copy from it says
  // "Copied" where the menu was.
  function onContextMenu(e: MouseEvent) {
    const target = e.target as HTMLElement;
    if (target.closest('input, textarea, [contenteditable]')) return;
    const id = target.closest('[data-message-id]')?.getAttribute('data-message-id');
    const m = conversation?.messages.find((x) => x.id === id);
    if (!m) return;
    e.preventDefault();
    const { clientX: x, clientY: y } = e;
    const copy = (text: string) => () =>
      copyWithFeedback(text, (label) => {
        setFlash({ x, y, label });
        clearTimeout(flashTimer.current);
        flashTimer.current = setTimeout(() => setFlash(null), COPIED_MS);
      });
    const items: MenuItem[] = [];
    const selected = globalThis.getSelection?.()?.toString() ?? '';
    if (selected) items.push({ label: 'Copy selection', run: copy(selected) });
    const code = target.closest('pre')?.querySelector('code')?.textContent;
    if (code) items.push({ label: 'Copy code', run: copy(code) });
    const text = m.role === 'assistant' ? splitThinking(m.content).answer : m.content;
    if (text) items.push({ label: m.role === 'assistant' ? 'Copy reply' : 'Copy message', run: copy(text) });
    if (canAsk && m.role === 'user') items.push({ label: 'Edit message', run: () => setEditingId(m.id) });
    if (canAsk && m.role === 'assistant' && m === messages[lastIndex]) items.push({ label: 'Regenerate', run: regenerate });
    if (!generating) items.push({ label: 'Delete message', run: () => chats.deleteMessage(m.id) });
    if (items.length) setMenu({ x, y, items });
  }

  const closeMenu = useMemo(() => () => setMenu(null), []);

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

  keys.current = { settingsOpen, busy, startNew, stop: () => chats.stop() };

  const messages = conversation?.messages ?? [];
  const lastIndex = messages.length - 1;
  // A text-only model refuses every request that holds an image: Send is blocked until they are gone.
  const textOnly = modelInfo?.vision === false;
  const heldImages = messages.reduce((n, m) => n + (m.images?.length ?? 0), 0);
  const blocked = textOnly && (attachments.length > 0 || heldImages > 0);
  // Asking again sends the images held too: not while the model cannot take them.
  const canAsk = !busy && !(textOnly && heldImages > 0);
  const used = contextUsed(conversation);
  const contextLength = modelInfo?.context_length ?? null;

  return (
    <div class={`chat-layout ${showPanel ? 'with-panel' : ''}`}>
      <nav class="conversations" aria-label="Conversations">
        <button class="button button-primary new-chat" data-testid="new-chat" onClick={startNew} title={titled('New chat', 'new-chat')}>
          New chat
        </button>
        <input
          type="search"
          class="conversation-search"
          data-testid="conversation-search"
          placeholder="Search chats"
          aria-label="Search chats (titles and messages)"
          value={search}
          onInput={(e) => setSearch((e.target as HTMLInputElement).value)}
          onKeyDown={(e) => {
            if (e.key === 'Escape' && search) {
              e.preventDefault();
              setSearch('');
            }
          }}
        />
        <ul data-testid="conversation-list">
          {shownSummaries.map((s) => (
            <li
              key={s.id}
              class={`conversation-item ${s.id === conversation?.id ? 'active' : ''}`}
              data-testid="conversation-item"
              data-conversation-id={s.id}
            >
              {renaming === s.id ? (
                <input
                  class="conversation-rename-input"
                  data-testid="conversation-rename-input"
                  aria-label="New title"
                  value={s.title}
                  ref={(el) => el?.focus()}
                  onKeyDown={(e) => {
                    const el = e.target as HTMLInputElement;
                    if (e.key === 'Enter') {
                      setRenaming(null);
                      void chats.rename(s.id, el.value);
                    } else if (e.key === 'Escape') {
                      e.preventDefault();
                      setRenaming(null);
                    }
                  }}
                  onBlur={(e) => {
                    if (renaming !== s.id) return;
                    setRenaming(null);
                    void chats.rename(s.id, (e.target as HTMLInputElement).value);
                  }}
                />
              ) : (
                <button class="conversation-open" onClick={() => open(s.id)} onDblClick={() => setRenaming(s.id)} title={s.title}>
                  {s.title}
                </button>
              )}
              <button
                class="icon-button conversation-rename"
                data-testid="conversation-rename"
                aria-label={`Rename ${s.title}`}
                title="Rename"
                onClick={() => setRenaming(s.id)}
              >
                ✎
              </button>
              <button
                class="icon-button conversation-delete"
                data-testid="conversation-delete"
                aria-label={`Delete ${s.title}`}
                title="Delete"
                onClick={() => void chats.remove(s.id, currentModel)}
              >
                ×
              </button>
            </li>
          ))}
          {needle && shownSummaries.length === 0 && <li class="dim small conversation-none">{matched ? 'No chat matches.' : 'Searching…'}</li>}
        </ul>
        {deleted && (
          <div class="notice small undo-bar" data-testid="conversation-undo-bar">
            Deleted “{deleted.title}”.{' '}
            <button class="link-button" data-testid="conversation-undo" onClick={() => void chats.undoRemove()}>
              Undo
            </button>
          </div>
        )}
        <div class="conversation-tools">
          <span class="dim small">Export</span>
          <button
            class="link-button"
            data-testid="chat-export-md"
            disabled={!conversation?.messages.length}
            onClick={() => conversation && download(fileName(conversation, 'md'), 'text/markdown', toMarkdown(conversation))}
          >
            Markdown
          </button>
          <button
            class="link-button"
            data-testid="chat-export-json"
            disabled={!conversation?.messages.length}
            onClick={() => conversation && download(fileName(conversation, 'json'), 'application/json', toJson(conversation))}
          >
            JSON
          </button>
          <span class="spacer" />
          <button class="link-button" data-testid="chat-import" onClick={() => importRef.current?.click()} title="Import a chat exported as JSON">
            Import…
          </button>
          <input
            ref={importRef}
            type="file"
            accept="application/json,.json"
            hidden
            data-testid="chat-import-input"
            onChange={(e) => {
              const el = e.target as HTMLInputElement;
              const file = el.files?.[0];
              if (file) void importFile(file);
              el.value = '';
            }}
          />
        </div>
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
              ref={pickerRef}
              title={titled('Model', 'model')}
              data-testid="chat-model-picker"
              value={currentModel ?? ''}
              onChange={(e) => chats.changeModel((e.target as HTMLSelectElement).value)}
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
              {mtpOff(modelInfo.mtp) ? '' : modelInfo.mtp.enabled ? ` · MTP depth ${modelInfo.mtp.depth}` : ' · MTP off'}
            </span>
          )}
          {/* "MTP off: <why>" when the head cannot run; the status beside it then does not say "MTP off" too. */}
          {modelInfo && (!modelInfo.mtp.available || modelInfo.mtp.probe != null) && <MtpHealth mtp={modelInfo.mtp} compact />}
          <span class="spacer" />
          {(used != null || contextLength != null) && (
            <span
              class={`dim small context-meter ${used != null && contextLength != null && used > 0.9 * contextLength ? 'warn' : ''}`}
              data-testid="chat-context"
              title="Tokens this conversation holds / the model's context length"
            >
              {used != null ? fmt.integer(used) : '0'}
              {contextLength != null && ` / ${fmt.integer(contextLength)}`} tokens
            </span>
          )}
          {conversation?.system && (
            <button
              class="tag system-tag"
              data-testid="chat-system-indicator"
              title={`System prompt: ${conversation.system}`}
              onClick={() => setSettingsOpen(true)}
            >
              system prompt
            </button>
          )}
          <button
            class={`button ${settingsOpen ? 'active' : ''}`}
            data-testid="chat-settings-toggle"
            onClick={() => {
              setHelpOpen(false);
              setSettingsOpen((o) => !o);
            }}
            aria-expanded={settingsOpen}
            title={titled('This chat’s sampling and system prompt', 'settings')}
          >
            Sampling
          </button>
          <button
            ref={helpRef}
            class={`icon-button shortcuts-toggle ${helpOpen ? 'active' : ''}`}
            data-testid="shortcuts-toggle"
            aria-label="Keyboard shortcuts"
            aria-expanded={helpOpen}
            title={titled('Keyboard shortcuts', 'help')}
            onClick={() => {
              setSettingsOpen(false);
              setHelpOpen((o) => !o);
            }}
          >
            ?
          </button>
          {helpOpen && <ShortcutsHelp toggle={helpRef} onClose={() => setHelpOpen(false)} />}
          {settingsOpen && conversation && (
            <SamplingSettings
              conversation={conversation}
              defaults={modelInfo?.sampling}
              onChange={(sampling, system, thinking) => chats.changeSettings(sampling, system, thinking)}
              onPolicy={(policy) => chats.changeContextPolicy(policy)}
              onClose={() => setSettingsOpen(false)}
            />
          )}
        </header>

        <div class="message-list" data-testid="message-list" ref={listRef} onScroll={onScroll} onContextMenu={onContextMenu}>
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
                streaming={generating && streaming?.messageId === m.id}
                last={i === lastIndex}
                canRegenerate={canAsk}
                onRegenerate={regenerate}
                onDelete={generating ? undefined : () => chats.deleteMessage(m.id)}
                onVersion={generating ? undefined : (k) => chats.chooseVersion(m.id, k)}
              />
            ) : m.role === 'user' ? (
              <UserMessage
                key={m.id}
                m={m}
                onDelete={generating ? undefined : () => chats.deleteMessage(m.id)}
                onEdit={canAsk ? (text) => edit(m.id, text) : undefined}
                editing={editingId === m.id}
                onEditing={(on) => setEditingId(on ? m.id : null)}
              />
            ) : null,
          )}
          {canAsk && lastIndex >= 0 && messages[lastIndex]!.role === 'user' && (
            <div class="message-meta retry">
              <button class="link-button" data-testid="chat-regenerate" onClick={regenerate}>
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
          {blocked && (
            <div class="notice notice-warn small vision-warning" data-testid="vision-warning">
              {currentModel} has no vision tower and cannot take images.{' '}
              {attachments.length > 0 && 'Remove the attached image' + (attachments.length > 1 ? 's' : '') + ' to send. '}
              {heldImages > 0 && (
                <>
                  This chat already holds {heldImages} image{heldImages > 1 ? 's' : ''}.{' '}
                  <button class="link-button" data-testid="chat-drop-images" onClick={() => chats.dropImages()} disabled={generating}>
                    Remove {heldImages > 1 ? 'them' : 'it'} from this chat
                  </button>
                </>
              )}
            </div>
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
                onClick={() => chats.stop()}
                title={titled(generating ? 'Stop the reply' : 'Stop the reply streaming in another chat', 'escape')}
              >
                Stop
              </button>
            ) : (
              <button
                class="button button-primary"
                data-testid="chat-send"
                onClick={() => void send()}
                disabled={blocked || (!input.trim() && attachments.length === 0)}
                title={blocked ? 'This model cannot take images' : undefined}
              >
                Send
              </button>
            )}
          </div>
        </div>
        {dragging && <div class="drop-overlay">Drop images to attach them</div>}
        {menu && <ContextMenu menu={menu} onClose={closeMenu} />}
        {flash && (
          <div class="copy-flash" role="status" data-testid="copy-flash" style={{ left: `${flash.x}px`, top: `${flash.y}px` }}>
            {flash.label}
          </div>
        )}
      </section>

      {showPanel && <LivePanel />}
    </div>
  );
}
