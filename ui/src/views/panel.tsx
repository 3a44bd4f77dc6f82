// The live panel beside the chat: throughput (each batched stream's too), MTP acceptance, where each cycle's
// time goes, and the loaded models' prefix caches.

import { TokChart } from '../components/chart';
import {
  cachedPrompt,
  figures,
  type Figures,
  mtpMostlyParked,
  type PrefixCacheFigures,
  prefixCaches,
  type StreamFigure,
  streamFigures,
} from '../figures';
import * as fmt from '../format';
import { useLive, type LiveState } from '../live';

/** A CSS length in percent for a 0..1 share, rounded to a tenth. */
const pct = (share: number) => `${Math.round(share * 1000) / 10}%`;

function Figure(props: { label: string; value: string; unit?: string; testid: string; hint?: string }) {
  return (
    <div class="figure" title={props.hint}>
      <div class="figure-value" data-testid={props.testid}>
        {props.value}
        {props.unit && <span class="figure-unit">{props.unit}</span>}
      </div>
      <div class="figure-label">{props.label}</div>
    </div>
  );
}

function Ladder({ f }: { f: NonNullable<Figures['spec']> }) {
  return (
    <section class="panel-section" data-testid="panel-ladder">
      <h3>Acceptance by depth</h3>
      {f.ladder.length === 0 && <p class="dim">No drafts yet.</p>}
      {f.ladder.map((step) => (
        <div class="ladder-row" key={step.depth} data-testid={`panel-ladder-depth-${step.depth}`} data-rate={step.rate ?? ''}>
          <span class="ladder-depth">d{step.depth}</span>
          <div class="bar">
            <div class="bar-fill" style={{ width: pct(step.rate ?? 0) }} />
          </div>
          <span class="ladder-value">{fmt.percent(step.rate)}</span>
          <span class="ladder-count dim">
            {fmt.integer(step.accepted)}/{fmt.integer(step.drafted)}
          </span>
        </div>
      ))}
    </section>
  );
}

function Histogram({ f }: { f: NonNullable<Figures['spec']> }) {
  const max = Math.max(0, ...f.hist.map((b) => b.share));
  return (
    <section class="panel-section" data-testid="panel-hist">
      <h3>Drafts accepted per cycle</h3>
      <div class="hist">
        {f.hist.map((bin) => (
          <div
            class="hist-bin"
            key={bin.accepted}
            data-testid={`panel-hist-bin-${bin.accepted}`}
            data-cycles={bin.cycles}
            title={`${fmt.integer(bin.cycles)} cycles accepted ${bin.accepted} (${fmt.percent(bin.share, 1)})`}
          >
            <div class="hist-track">
              <div class="hist-fill" style={{ height: pct(max > 0 ? bin.share / max : 0) }} />
            </div>
            <div class="hist-share">{fmt.percent(bin.share)}</div>
            <div class="hist-label dim">{bin.accepted}</div>
          </div>
        ))}
      </div>
    </section>
  );
}

function Phases({ f }: { f: NonNullable<Figures['spec']> }) {
  return (
    <section class="panel-section" data-testid="panel-phases">
      <h3>
        Time per cycle <span class="dim">{fmt.ms(f.msPerCycle)}</span>
      </h3>
      <div class="stack">
        {f.phases.map((p) => (
          <div key={p.phase} class={`stack-part phase-${p.phase}`} style={{ width: pct(p.share) }} />
        ))}
      </div>
      <div class="phase-legend">
        {f.phases.map((p) => (
          <div class="phase-item" key={p.phase}>
            <span class={`swatch phase-${p.phase}`} />
            <span class="phase-name">{p.phase}</span>
            <span class="phase-ms" data-testid={`panel-phase-${p.phase}`}>
              {fmt.ms(p.perCycleMs)}
            </span>
          </div>
        ))}
      </div>
    </section>
  );
}

/** The generations decoded together, one row each, under the aggregate tok/s. */
function Streams({ streams }: { streams: StreamFigure[] }) {
  return (
    <div class="streams" data-testid="panel-streams">
      {streams.map((s) => (
        <div
          class="stream-row"
          key={`${s.model ?? ''}#${s.request}`}
          data-testid="panel-stream"
          data-request={s.request}
          title={`Request ${s.request}${s.model ? ` on ${s.model}` : ''}: its own decode rate, tokens so far and MTP acceptance`}
        >
          <span class="stream-label dim">
            #{s.request}
            {s.model && ` ${s.model}`}
          </span>
          <span class="stream-tok-s">
            <b>{fmt.fixed(s.decodeTokS, 1)}</b> tok/s
          </span>
          <span class="stream-tokens dim">{fmt.integer(s.completionTokens)} tok</span>
          <span class="stream-acceptance dim">{s.acceptance != null ? `MTP ${fmt.percent(s.acceptance)}` : ''}</span>
        </div>
      ))}
    </div>
  );
}

function PrefixCache({ c, named }: { c: PrefixCacheFigures; named: boolean }) {
  const d = c.disk;
  return (
    <section class="panel-section" data-testid="panel-prefix-cache" data-model={c.model}>
      <h3>
        <span class="cache-title">
          Prefix cache
          {named && <span class="dim" title={c.model}> · {c.model}</span>}
        </span>
        <span class="dim cache-size" data-testid="panel-cache-size" title={c.off ? 'The cap is 0: the prefix cache is off' : 'Memory used by cached prompts, of the cap'}>
          {c.off ? 'off' : `${fmt.bytes(c.bytes)} / ${fmt.bytes(c.capBytes)}`}
        </span>
      </h3>
      {!c.off && (
        <div class="facts">
          <span>
            <b data-testid="panel-cache-entries">{fmt.integer(c.entries)}</b> entries
          </span>
          <span data-testid="panel-cache-hit-rate" title="Lookups that found a cached prefix">
            {c.hitRate == null ? (
              'no lookups yet'
            ) : (
              <>
                hit rate <b>{fmt.percent(c.hitRate)}</b>
              </>
            )}
          </span>
          <span title="Prompt tokens restored instead of prefilled, over all hits">
            <b data-testid="panel-cache-restored">{fmt.integer(c.cachedTokens)}</b> tokens restored
          </span>
        </div>
      )}
      {!c.off && d && (
        <div class="facts cache-disk" data-testid="panel-cache-disk">
          <span title="The SSD tier: bytes in its folder (every model's files), of its cap">
            SSD <b data-testid="panel-cache-disk-size">{fmt.bytes(d.bytes)}</b> / {fmt.bytes(d.capBytes)}
          </span>
          <span>
            <b data-testid="panel-cache-disk-entries">{fmt.integer(d.entries)}</b> entries
          </span>
          <span title="Lookups served from the disk">
            <b data-testid="panel-cache-disk-hits">{fmt.integer(d.hits)}</b> hits
          </span>
          <span data-testid="panel-cache-disk-written" title="Bytes written in all, and by the last stored snapshot">
            <b>{fmt.bytes(d.bytesWritten)}</b> written
            {d.lastWriteBytes > 0 && <span> (last {fmt.bytes(d.lastWriteBytes)})</span>}
          </span>
        </div>
      )}
      {!c.off &&
        d?.warnings.map((w) => (
          <div class="notice notice-warn small cache-warning" key={w} data-testid="panel-cache-warning">
            {w}
          </div>
        ))}
    </section>
  );
}

export function LivePanelView({ state }: { state: LiveState }) {
  const f = state.stats ? figures(state.stats) : null;
  const spec = f?.spec ?? null;
  const streams = streamFigures(state.running);
  // With several streams the headline is their sum, as the engine's `tok_s` is (this window's chunks carry
  // only its own stream's rate).
  const tokS = streams ? streams.reduce((a, s) => a + (s.decodeTokS ?? 0), 0) : (state.tokS ?? f?.decodeTokS ?? null);
  const cached = cachedPrompt(state.stats);
  const caches = prefixCaches(state.models);
  const mtpRunning = !!spec && !spec.fallback;
  return (
    <aside class="live-panel" data-testid="live-panel" aria-label="Live statistics">
      <header class="panel-header">
        <span class={`dot ${state.generating ? 'dot-busy' : state.connected ? 'dot-ok' : 'dot-off'}`} />
        <span data-testid="panel-status">
          {state.generating ? 'Generating' : 'Idle'}
          {state.generating && state.streams > 1 ? ` · ${state.streams} streams` : ''}
        </span>
        {state.model && <span class="panel-model dim" title={state.model}>{state.model}</span>}
      </header>

      <div class="figures">
        <Figure label="tok / s" value={fmt.fixed(tokS, 1)} testid="panel-tok-s" hint={state.streams > 1 ? 'Decode throughput, all streams together' : 'Decode throughput'} />
        <Figure
          label="acceptance"
          value={mtpRunning ? fmt.percent(spec.acceptance) : '—'}
          testid="panel-acceptance"
          hint="Drafted tokens the model accepted"
        />
        <Figure
          label="tok / cycle"
          value={mtpRunning ? fmt.fixed(spec.tokPerCycle, 2) : '—'}
          testid="panel-tok-per-cycle"
          hint="Tokens emitted per verify pass"
        />
      </div>

      {streams && <Streams streams={streams} />}

      <TokChart series={state.series} />

      {f && (
        <div class="facts">
          <span>
            TTFT <b data-testid="panel-ttft">{fmt.ms(f.ttftMs)}</b>
          </span>
          <span>
            prefill <b data-testid="panel-prefill">{fmt.fixed(f.prefillTokS, 0)}</b> tok/s
          </span>
          <span>
            <b data-testid="panel-tokens">{fmt.integer(f.promptTokens)}</b> in ·{' '}
            <b>{fmt.integer(f.completionTokens)}</b> out
          </span>
          {cached && (
            <span data-testid="panel-cached">
              <b>{fmt.integer(cached.cached)}</b> of <b>{fmt.integer(cached.prompt)}</b> prompt tokens from the prefix
              cache
            </span>
          )}
        </div>
      )}

      {f && !spec && (
        <div class="notice" data-testid="panel-no-spec">
          Speculative decoding was not used for this generation.
        </div>
      )}
      {spec?.fallback && (
        <div class="notice notice-warn" data-testid="panel-fallback">
          <b>MTP is not running.</b> {spec.fallback}
        </div>
      )}

      {mtpRunning && mtpMostlyParked(state.stats) && (
        <div class="notice notice-warn small" data-testid="panel-mtp-slow">
          Drafting was parked for most steps: MTP does not pay for this model on this machine. Turning it off under
          Models may be as fast or faster.
        </div>
      )}
      {mtpRunning && (
        <>
          <div class="facts">
            <span>
              depth <b data-testid="panel-depth">{spec.depth}</b>
            </span>
            <span>
              <b data-testid="panel-cycles">{fmt.integer(spec.cycles)}</b> cycles
            </span>
            <span title="Plain decode steps while the adaptive controller parked drafting, and their share of all steps">
              parked <b data-testid="panel-parked">{fmt.integer(spec.parkedCycles)}</b>
              {spec.parkedShare != null && spec.parkedCycles > 0 && <span class="dim"> ({fmt.percent(spec.parkedShare)})</span>}
            </span>
          </div>
          <Ladder f={spec} />
          <Histogram f={spec} />
          <Phases f={spec} />
        </>
      )}

      {!f && <p class="dim panel-empty">Statistics appear here while a model generates.</p>}

      {caches.map((c) => (
        <PrefixCache key={c.model} c={c} named={caches.length > 1} />
      ))}

      <footer class="panel-footer">
        {/* The process's resident memory first, as the tray says it; MLX's own counters after it. */}
        <div data-testid="panel-memory" title="Resident memory of the engine; models: MLX's allocator (active, peak)">
          memory{' '}
          <b>{fmt.bytes(state.memory?.rss_bytes ?? null)}</b>
          {state.memory && state.memory.active_bytes > 0 && (
            <span class="dim">
              {' '}
              · models {fmt.bytes(state.memory.active_bytes)}, peak {fmt.bytes(state.memory.peak_bytes)}
            </span>
          )}
        </div>
        <div class="dim" data-testid="panel-loaded">
          {!state.connected
            ? 'not following the engine’s stats stream'
            : state.loadedModels.length
              ? `loaded: ${state.loadedModels.join(', ')}`
              : 'no model loaded'}
        </div>
      </footer>
    </aside>
  );
}

export function LivePanel() {
  return <LivePanelView state={useLive()} />;
}
