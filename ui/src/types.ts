// The shapes the engine's HTTP API speaks (DESIGN.md, "HTTP API" and "Statistics").
//
// The Statistics types (`Stats`, `SpecStats`, `DepthStats`, `PhaseMs`) mirror `src/generate/stats.rs`
// field for field; they are meant to be replaced by types generated from Rust (ts-rs), so they live here,
// alone with the other wire types, and nothing UI-specific is added to them.

// ---------------------------------------------------------------------------------------------------
// Statistics (one JSON shape everywhere: CLI `--json`, HTTP, UI)

export interface DepthStats {
  depth: number;
  drafted: number;
  accepted: number;
}

export interface PhaseMs {
  draft: number;
  verify: number;
  sample: number;
  rollback: number;
}

export interface SpecStats {
  method: string; // "mtp"
  depth: number;
  cycles: number;
  drafted: number;
  accepted: number;
  /** accepted / drafted */
  acceptance: number;
  tok_per_cycle: number;
  by_depth: DepthStats[];
  /** `accepted_hist[i]`: cycles that accepted exactly `i` drafts (i = 0..=depth). */
  accepted_hist: number[];
  parked_cycles: number;
  /** Milliseconds spent in each phase, summed over all cycles. */
  ms: PhaseMs;
  /** Why MTP is not running (null while it runs). */
  fallback: string | null;
}

export interface Stats {
  prompt_tokens: number;
  completion_tokens: number;
  ttft_ms: number;
  prefill_tok_s: number;
  decode_tok_s: number;
  spec: SpecStats | null;
}

// ---------------------------------------------------------------------------------------------------
// Errors: every non-2xx answer is `{"error": {"message", "type", "code"}}`.

export interface ErrorBody {
  error: { message: string; type?: string; code?: string | number | null };
}

// ---------------------------------------------------------------------------------------------------
// OpenAI-compatible API

export interface OpenAIModel {
  id: string;
  object?: string;
  created?: number;
  owned_by?: string;
}

export interface OpenAIModelList {
  object?: string;
  data: OpenAIModel[];
}

export interface TextPart {
  type: 'text';
  text: string;
}

export interface ImagePart {
  type: 'image_url';
  image_url: { url: string };
}

export type ContentPart = TextPart | ImagePart;

export interface ChatMessage {
  role: 'system' | 'user' | 'assistant';
  content: string | ContentPart[];
}

export interface Sampling {
  temperature?: number;
  top_p?: number;
  max_tokens?: number;
  seed?: number;
}

export interface ChatCompletionRequest extends Sampling {
  model: string;
  messages: ChatMessage[];
  stream: true;
  stream_options?: { include_usage: boolean };
}

export interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
}

export interface ChatCompletionChunk {
  id?: string;
  object?: string; // "chat.completion.chunk"
  created?: number;
  model?: string;
  choices: Array<{
    index: number;
    delta: { role?: string; content?: string | null; reasoning_content?: string | null };
    finish_reason: string | null;
  }>;
  usage?: Usage | null;
  /** Tandem's extension: the generation's statistics (running on any chunk, final on the usage chunk). */
  stats?: Stats | null;
}

// ---------------------------------------------------------------------------------------------------
// Admin API

export interface Health {
  status: string; // "ok"
  version?: string;
  [key: string]: unknown;
}

export interface MtpStatus {
  /** The model's files hold a complete MTP head. */
  available: boolean;
  /** MTP is switched on for this model. */
  enabled: boolean;
  depth: number;
  /** Why MTP is unavailable or not running; null when it runs. */
  reason: string | null;
  /** Set when the loader (or its probe) repaired the head's norm convention. */
  repaired?: string | null;
  /** Whether the adaptive controller may park drafting (models.toml `mtp.adaptive`). */
  adaptive?: boolean;
  /** The head's health as measured: the load-time probe, or what the conversion recorded. */
  probe?: MtpProbe | null;
}

/** The MTP acceptance probe (src/model/mtp_head/probe.rs). */
export interface MtpProbe {
  /** The running head's teacher-forced top-1 agreement with its body; null when none runs. */
  acceptance: number | null;
  tried: { convention: string; acceptance: number }[];
  chosen: string | null;
  seconds: number;
  tokens: number;
  body_agreement: number;
  /** The body does not read the probe text well enough to judge a head. */
  inconclusive: boolean;
}

export interface Quantization {
  bits: number;
  group_size: number;
  mode?: string;
  [key: string]: unknown;
}

export interface ModelInfo {
  id: string;
  name: string;
  path: string;
  format: 'hf' | 'mlx';
  /** Bytes of weights on disk. */
  size: number;
  /** null for unquantized weights; a string such as "4bit" or "mixed_4_6" is shown as it is. */
  quantization: Quantization | string | null;
  /** Unquantized dtype, e.g. "bfloat16", when known. */
  dtype?: string | null;
  loaded: boolean;
  vision?: boolean;
  mtp: MtpStatus;
  sampling?: Sampling;
}

export interface ModelSettingsPatch {
  mtp?: { enabled?: boolean; depth?: number; adaptive?: boolean };
  sampling?: Sampling;
}

export type Recipe = 'uniform' | 'mixed_3_6' | 'mixed_4_6' | 'auto';

export interface ConvertRequest {
  src: string;
  /** Output folder; the server picks one under models_dir when absent. */
  out?: string;
  /** Name of the converted model (its folder under models_dir) when `out` is absent. */
  name?: string;
  bits: number;
  group_size: number;
  recipe: Recipe;
  target_bpw?: number;
  mtp: 'keep' | 'drop';
  /** Bits for the MTP head; null keeps it unquantized. Omitted with mtp = "drop". */
  mtp_bits?: number | null;
}

export interface ConvertStarted {
  job: string;
}

export type ConvertState = 'queued' | 'running' | 'finished' | 'error' | 'cancelled';

export interface ConvertStatus {
  job: string;
  state: ConvertState;
  src?: string;
  path?: string | null;
  done?: number;
  total?: number;
  predicted_bytes?: number | null;
  predicted_bpw?: number | null;
  bytes?: number | null;
  bpw?: number | null;
  error?: string | null;
}

export type ConvertEvent =
  | { type: 'planned'; predicted_bytes: number; predicted_bpw: number }
  | { type: 'progress'; done: number; total: number; tensor?: string }
  | { type: 'finished'; bytes: number; bpw: number; path: string }
  | { type: 'error'; message: string }
  | { type: 'cancelled'; message?: string };

// ---------------------------------------------------------------------------------------------------
// Live statistics (`GET /api/stats`, each event of `GET /api/stats/stream`)

export interface MemoryStats {
  /** Bytes held by MLX's allocator now. */
  active_bytes?: number;
  peak_bytes?: number;
  cache_bytes?: number;
  /** Resident set size of the process. */
  rss_bytes?: number;
}

export interface LiveStats {
  /** Unix time in milliseconds when the snapshot was taken. */
  time_ms?: number;
  /** A generation is running now. */
  generating?: boolean;
  /** The model of the running (or last) generation. */
  model?: string | null;
  /** Decode tokens per second now (the running generation's, 0 when idle). */
  tok_s?: number | null;
  /** Running acceptance of the running (or last) generation, 0..1. */
  acceptance?: number | null;
  tok_per_cycle?: number | null;
  /** The running (or last) generation's statistics, in the Statistics shape. */
  stats?: Stats | null;
  memory?: MemoryStats | null;
  /** Ids of the loaded models. */
  loaded_models?: string[];
}
