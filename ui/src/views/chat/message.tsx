// One message of a chat: the user's (text and images) or the assistant's (markdown, thinking, statistics).

import { useMemo } from 'preact/hooks';
import type { StoredMessage } from '../../conversation';
import * as fmt from '../../format';
import type { Stats } from '../../generated';
import { renderMarkdown, splitThinking } from '../../markdown';

function Markdown({ text }: { text: string }) {
  const html = useMemo(() => renderMarkdown(text), [text]);
  return <div class="markdown" dangerouslySetInnerHTML={{ __html: html }} />;
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
          {props.onDelete && <DeleteButton onDelete={props.onDelete} />}
        </div>
      )}
    </div>
  );
}

function DeleteButton({ onDelete }: { onDelete: () => void }) {
  return (
    <button class="link-button message-delete" data-testid="message-delete" onClick={onDelete} title="Delete this message from the conversation">
      Delete
    </button>
  );
}

export function UserMessage({ m, onDelete }: { m: StoredMessage; onDelete?: () => void }) {
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
      {onDelete && (
        <div class="message-actions">
          <DeleteButton onDelete={onDelete} />
        </div>
      )}
    </div>
  );
}
