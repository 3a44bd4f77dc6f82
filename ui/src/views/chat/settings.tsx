// The sampling settings of one chat (and its system prompt); empty fields take the model's defaults.

import type { ContextPolicy, Conversation, Sampling } from '../../conversation';
import * as fmt from '../../format';
import type { SamplingSettings as ModelSampling } from '../../generated';

function numberOrUndefined(v: string, integer = false): number | undefined {
  if (v.trim() === '') return undefined;
  const n = integer ? parseInt(v, 10) : parseFloat(v);
  return Number.isFinite(n) ? n : undefined;
}

export function SamplingSettings(props: {
  conversation: Conversation;
  defaults: ModelSampling | undefined;
  onChange: (sampling: Sampling, system: string, thinking?: boolean) => void;
  onPolicy: (policy: ContextPolicy) => void;
  onClose: () => void;
}) {
  const s = props.conversation.sampling;
  const d: Partial<Record<keyof Sampling, number>> = props.defaults ?? {};
  const set = (patch: Partial<Sampling>) => {
    const next: Sampling = { ...s, ...patch };
    for (const k of Object.keys(next) as (keyof Sampling)[]) if (next[k] === undefined) delete next[k];
    props.onChange(next, props.conversation.system ?? '', props.conversation.thinking);
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
        placeholder={d[key] != null ? `default ${fmt.num(d[key])}` : 'model default'}
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
      {field('top_k', 'Top k', { step: '1', min: '0', integer: true, hint: '0 = off' })}
      {field('min_p', 'Min p', { step: '0.01', min: '0', max: '1', hint: '0 = off' })}
      {field('repetition_penalty', 'Repetition penalty', { step: '0.05', min: '0.5', max: '2', hint: '1 = off' })}
      {field('max_tokens', 'Max tokens', { step: '1', min: '1', integer: true, hint: 'reply length limit' })}
      {field('seed', 'Seed', { step: '1', min: '0', integer: true, hint: 'repeatable sampling' })}
      <label class="field">
        <span class="field-label">Thinking</span>
        <select
          data-testid="setting-thinking"
          value={props.conversation.thinking == null ? '' : props.conversation.thinking ? 'on' : 'off'}
          onChange={(e) => {
            const v = (e.target as HTMLSelectElement).value;
            props.onChange(s, props.conversation.system ?? '', v === '' ? undefined : v === 'on');
          }}
        >
          <option value="">model default</option>
          <option value="on">on</option>
          <option value="off">off</option>
        </select>
        <span class="field-hint">the chat template’s enable_thinking</span>
      </label>
      <label class="field field-wide">
        <span class="field-label">When the chat outgrows the context</span>
        <select
          data-testid="setting-context-policy"
          value={props.conversation.contextPolicy ?? 'rolling'}
          onChange={(e) => props.onPolicy((e.target as HTMLSelectElement).value as ContextPolicy)}
        >
          <option value="rolling">leave out the oldest turns</option>
          <option value="middle">keep the first turn, leave out the ones after it</option>
          <option value="stop">stop with an error</option>
        </select>
        <span class="field-hint">the chat keeps every message; only the request is shortened</span>
      </label>
      <label class="field field-wide">
        <span class="field-label">System prompt</span>
        <textarea
          data-testid="setting-system"
          rows={3}
          value={props.conversation.system ?? ''}
          placeholder="Optional"
          onInput={(e) => props.onChange(s, (e.target as HTMLTextAreaElement).value, props.conversation.thinking)}
        />
      </label>
      <button class="link-button" onClick={() => props.onChange({}, props.conversation.system ?? '', undefined)}>
        Reset to model defaults
      </button>
    </div>
  );
}
