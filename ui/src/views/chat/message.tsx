// One message of a chat: the user's (text and images) or the assistant's (markdown, thinking, statistics).

import { useEffect, useMemo, useRef, useState } from 'preact/hooks';
import { type StoredMessage, versionsOf } from '../../conversation';
import * as fmt from '../../format';
import type { Stats } from '../../generated';
import { renderMarkdown, splitThinking } from '../../markdown';

/** Puts text on the clipboard: the Clipboard API, else the older copy command (an insecure origin). */
export async function copyText(text: string): Promise<void> {
  if (navigator.clipboard?.writeText) return navigator.clipboard.writeText(text);
  const area = document.createElement('textarea');
  area.value = text;
  area.style.position = 'fixed';
  area.style.opacity = '0';
  document.body.appendChild(area);
  area.select();
  const ok = document.execCommand?.('copy');
  area.remove();
  if (!ok) throw new Error('copy is not available here');
}

/** How long "Copied" (or "Copy failed") shows after a copy. */
export const COPIED_MS = 1500;

/** Copies `text`, then hands "Copied" or "Copy failed" to `show`. */
export function copyWithFeedback(text: string, show: (label: string) => void): void {
  copyText(text).then(
    () => show('Copied'),
    () => show('Copy failed'),
  );
}

/** "Copy" that reads "Copied" (or "Copy failed") for a moment after a click. */
export function useCopied(): [string | null, (text: string) => void] {
  const [state, setState] = useState<string | null>(null);
  const timer = useRef<ReturnType<typeof setTimeout>>();
  useEffect(() => () => clearTimeout(timer.current), []);
  const copy = (text: string) =>
    copyWithFeedback(text, (label) => {
      setState(label);
      clearTimeout(timer.current);
      timer.current = setTimeout(() => setState(null), COPIED_MS);
    });
  return [state, copy];
}

/** Each code block's button keeps its own timer: a second click restarts it. */
const codeTimers = new WeakMap<HTMLElement, ReturnType<typeof setTimeout>>();

/**
 * Rendered markdown; each code block gets a Copy button. The sanitiser forbids buttons in model output,
 * so they are added to the DOM after it is rendered, and one handler serves them all.
 */
function Markdown({ text }: { text: string }) {
  const html = useMemo(() => renderMarkdown(text), [text]);
  const ref = useRef<HTMLDivElement>(null);
  useEffect(() => {
    for (const pre of ref.current?.querySelectorAll('pre') ?? []) {
      if (pre.querySelector(':scope > .code-copy')) continue;
      const button = document.createElement('button');
      button.type = 'button';
      button.className = 'code-copy';
      button.textContent = 'Copy';
      button.title = 'Copy the code';
      button.setAttribute('data-testid', 'code-copy');
      pre.appendChild(button);
    }
  }, [html]);
  const onClick = (e: MouseEvent) => {
    const button = (e.target as HTMLElement).closest?.('.code-copy') as HTMLButtonElement | null;
    if (!button) return;
    const code = button.parentElement?.querySelector('code')?.textContent ?? '';
    copyWithFeedback(code, (label) => {
      button.textContent = label;
      clearTimeout(codeTimers.get(button));
      codeTimers.set(
        button,
        setTimeout(() => (button.textContent = 'Copy'), COPIED_MS),
      );
    });
  };
  return <div class="markdown" ref={ref} onClick={onClick} dangerouslySetInnerHTML={{ __html: html }} />;
}

export function statsLine(stats: Stats | null | undefined): string | null {
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

export function AssistantMessage(props: {
  m: StoredMessage;
  streaming: boolean;
  last: boolean;
  canRegenerate: boolean;
  onRegenerate: () => void;
  /** Absent while a reply streams in this chat. */
  onDelete?: () => void;
  /** Shows another version of this reply; absent while a reply streams in this chat. */
  onVersion?: (k: number) => void;
}) {
  const { m, streaming } = props;
  const split = splitThinking(m.content);
  const thinking = m.reasoning ? m.reasoning : split.thinking;
  const thinkingDone = m.reasoning ? !!split.answer || !streaming : split.thinkingDone;
  const line = statsLine(m.stats);
  const [copied, copy] = useCopied();
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
          {m.versions?.length && props.onVersion ? <Versions m={m} onVersion={props.onVersion} /> : null}
          {m.stopped && <span class="tag">stopped</span>}
          {m.finish_reason === 'length' && <span class="tag">max tokens reached</span>}
          {m.leftOut ? (
            <span class="tag" data-testid="message-left-out" title="Left out of the request to fit the model's context; the chat keeps them">
              {m.leftOut} earlier turn{m.leftOut > 1 ? 's' : ''} left out
            </span>
          ) : null}
          {line && (
            <span class="dim" data-testid="message-stats">
              {line}
            </span>
          )}
          <span class="spacer" />
          {split.answer && (
            <button class="link-button" data-testid="message-copy" onClick={() => copy(split.answer)} title="Copy the reply">
              {copied ?? 'Copy'}
            </button>
          )}
          {props.last && props.canRegenerate && (
            <button class="link-button" data-testid="chat-regenerate" onClick={props.onRegenerate}>
              Regenerate
            </button>
          )}
          {props.onDelete && <DeleteButton onDelete={props.onDelete} />}
        </div>
      )}
    </div>
  );
}

/** "‹ 2 / 3 ›": the versions of a regenerated reply. */
function Versions({ m, onVersion }: { m: StoredMessage; onVersion: (k: number) => void }) {
  const { all, at } = versionsOf(m);
  return (
    <span class="versions" data-testid="message-versions">
      <button class="link-button" data-testid="message-version-prev" aria-label="Earlier version" disabled={at <= 0} onClick={() => onVersion(at - 1)}>
        ‹
      </button>
      <span class="dim" data-testid="message-version">
        {at + 1} / {all.length}
      </span>
      <button
        class="link-button"
        data-testid="message-version-next"
        aria-label="Later version"
        disabled={at >= all.length - 1}
        onClick={() => onVersion(at + 1)}
      >
        ›
      </button>
    </span>
  );
}

function DeleteButton({ onDelete }: { onDelete: () => void }) {
  return (
    <button class="link-button message-delete" data-testid="message-delete" onClick={onDelete} title="Delete this message from the conversation">
      Delete
    </button>
  );
}

/** A user's message as a text field (each edit starts from the message as it is). */
function MessageEditor({ m, onSave, onCancel }: { m: StoredMessage; onSave: (text: string) => void; onCancel: () => void }) {
  const [draft, setDraft] = useState(m.content);
  return (
    <div class="message message-user editing" data-testid="message-user" data-role="user" data-message-id={m.id}>
      <textarea
        class="message-edit-input"
        data-testid="message-edit-input"
        rows={3}
        value={draft}
        ref={(el) => el?.focus()}
        onInput={(e) => setDraft((e.target as HTMLTextAreaElement).value)}
        onKeyDown={(e) => {
          if (e.key === 'Escape') {
            e.preventDefault();
            onCancel();
          }
          if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
            e.preventDefault();
            onSave(draft.trim());
          }
        }}
      />
      <div class="message-edit-actions">
        <button class="link-button" data-testid="message-edit-cancel" onClick={onCancel}>
          Cancel
        </button>
        <button class="button button-primary" data-testid="message-edit-save" onClick={() => onSave(draft.trim())}>
          Save and regenerate
        </button>
      </div>
    </div>
  );
}

/**
 * A user's message; Edit turns it into a text field whose Save asks again from there. The chat holds
 * whether it is being edited, so that its context menu can start the edit too.
 */
export function UserMessage(props: {
  m: StoredMessage;
  onDelete?: () => void;
  onEdit?: (text: string) => void;
  editing: boolean;
  onEditing: (editing: boolean) => void;
}) {
  const { m, onDelete, onEdit, editing, onEditing: setEditing } = props;
  if (editing && onEdit) {
    return (
      <MessageEditor
        m={m}
        onCancel={() => setEditing(false)}
        onSave={(text) => {
          setEditing(false);
          if (text || m.images?.length) onEdit(text);
        }}
      />
    );
  }
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
      {(onDelete || onEdit) && (
        <div class="message-actions">
          {onEdit && (
            <button
              class="link-button"
              data-testid="message-edit"
              title="Edit this message and regenerate the reply from it"
              onClick={() => setEditing(true)}
            >
              Edit
            </button>
          )}
          {onDelete && <DeleteButton onDelete={onDelete} />}
        </div>
      )}
    </div>
  );
}
