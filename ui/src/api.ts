// The one client of the engine's HTTP API (docs/ARCHITECTURE.md §4.2). Nothing else in the UI calls fetch.
// Every body's type is generated from the server's Rust types (ui/src/generated): no shape is guessed here.

import type { Conversation } from './conversation';
import type {
  AddModelRequest,
  AppPatch,
  CatalogList,
  ChatCompletionChunk,
  ChatCompletionRequest,
  ChosenFolder,
  ConversationList,
  ConversationSummary,
  ConvertRequest,
  DownloadEvent,
  DownloadList,
  DownloadView,
  GraftRequest,
  Health,
  HubModel,
  HubSearch,
  JobEvent,
  JobView,
  LoggedRequest,
  ModelList,
  ModelStatus,
  OpenAIModel,
  OpenAIModelList,
  PickedFolder,
  PreviewView,
  PullRequest,
  RequestLog,
  ServerInfo,
  SettingsPatch,
  SettingsView,
  StatsSnapshot,
} from './generated';
import { folderDialog } from './shell';
import { readSse } from './sse';

export const DEFAULT_ENGINE = 'http://127.0.0.1:11435';

/** An error the engine answered (its `error.message`), or a failure to reach it. */
export class ApiError extends Error {
  /** HTTP status; 0 when the engine could not be reached or the stream broke. */
  readonly status: number;
  readonly type: string | undefined;
  readonly code: string | number | null | undefined;

  constructor(message: string, status: number, type?: string, code?: string | number | null) {
    super(message);
    this.name = 'ApiError';
    this.status = status;
    this.type = type;
    this.code = code;
  }
}

/** The message to show a person for anything thrown. */
export function errorMessage(e: unknown): string {
  if (typeof e === 'string') return e;
  // Errors and DOMExceptions (which may come from another realm, so no instanceof).
  if (e && typeof e === 'object' && typeof (e as { message?: unknown }).message === 'string') {
    const { message, name } = e as { message: string; name?: string };
    return message || name || 'Error';
  }
  return 'Unknown error';
}

export function isAbort(e: unknown): boolean {
  return !!e && typeof e === 'object' && (e as { name?: unknown }).name === 'AbortError';
}

/**
 * Where the engine is. Same origin when the page is served over http(s) by `tandem serve` (or by Vite's dev
 * server, which proxies /v1 and /api); the default address inside the Tauri window (tauri:// or
 * http://tauri.localhost); `window.__TANDEM_API__` or `?api=` override both.
 */
export function resolveBase(loc: Pick<Location, 'protocol' | 'hostname' | 'search'> | undefined = globalThis.location): string {
  const injected = (globalThis as { __TANDEM_API__?: unknown }).__TANDEM_API__;
  if (typeof injected === 'string') return injected.replace(/\/+$/, '');
  if (!loc) return DEFAULT_ENGINE;
  const q = new URLSearchParams(loc.search).get('api');
  if (q) return q.replace(/\/+$/, '');
  if ((loc.protocol === 'http:' || loc.protocol === 'https:') && loc.hostname !== 'tauri.localhost') return '';
  return DEFAULT_ENGINE;
}

/** Builds an ApiError from a non-2xx response, using the server's `{"error": {"message"}}` when present. */
export async function errorFromResponse(res: Response): Promise<ApiError> {
  let text = '';
  try {
    text = await res.text();
  } catch {
    // the body could not be read; fall through to the status line
  }
  const parsed = parseErrorBody(text);
  if (parsed) return new ApiError(parsed.message, res.status, parsed.type, parsed.code);
  const status = `HTTP ${res.status}${res.statusText ? ' ' + res.statusText : ''}`;
  const snippet = text.trim().slice(0, 300);
  return new ApiError(snippet ? `${status}: ${snippet}` : status, res.status);
}

/** `{"error": {"message", "type", "code"}}` (or `{"error": "text"}` / `{"message"}`) -> its parts. */
export function parseErrorBody(
  text: string,
): { message: string; type?: string; code?: string | number | null } | null {
  let body: unknown;
  try {
    body = JSON.parse(text);
  } catch {
    return null;
  }
  return errorOf(body);
}

function errorOf(body: unknown): { message: string; type?: string; code?: string | number | null } | null {
  if (!body || typeof body !== 'object') return null;
  const b = body as Record<string, unknown>;
  const err = b.error;
  if (typeof err === 'string') return { message: err };
  if (err && typeof err === 'object') {
    const e = err as Record<string, unknown>;
    if (typeof e.message === 'string') {
      return {
        message: e.message,
        type: typeof e.type === 'string' ? e.type : undefined,
        code: typeof e.code === 'string' || typeof e.code === 'number' ? e.code : null,
      };
    }
  }
  return null;
}

type Fetch = typeof fetch;

/** The request `chat` sends: always streamed, with a usage chunk at the end. */
export type ChatRequest = Omit<ChatCompletionRequest, 'stream' | 'stream_options'> & { model: string };

/**
 * The API key, needed when the engine has one (always, when it is bound beyond loopback):
 * `window.__TANDEM_API_KEY__`, or localStorage `tandem.apiKey`. Sent as `Authorization: Bearer <key>`.
 */
export function resolveApiKey(): string | null {
  const injected = (globalThis as { __TANDEM_API_KEY__?: unknown }).__TANDEM_API_KEY__;
  if (typeof injected === 'string' && injected) return injected;
  try {
    return globalThis.localStorage?.getItem('tandem.apiKey') || null;
  } catch {
    return null;
  }
}

/**
 * Keeps `key` (null: forgets it) where `resolveApiKey` finds it, so that this browser sends it once the
 * engine requires it. The desktop app's window is handed its key at start and does not need this.
 */
export function rememberApiKey(key: string | null): void {
  try {
    if (key) globalThis.localStorage?.setItem('tandem.apiKey', key);
    else globalThis.localStorage?.removeItem('tandem.apiKey');
  } catch {
    // no storage here (a private window): the key must be given another way
  }
}

export class Api {
  constructor(
    /** "" for same origin, otherwise e.g. "http://127.0.0.1:11435" (no trailing slash). */
    readonly base: string = resolveBase(),
    private readonly fetchImpl: Fetch = (...args) => globalThis.fetch(...args),
    private readonly apiKey: string | null = resolveApiKey(),
  ) {}

  url(path: string): string {
    return this.base + path;
  }

  private async send(path: string, init: RequestInit = {}): Promise<Response> {
    let res: Response;
    if (this.apiKey) init = { ...init, headers: { ...(init.headers as Record<string, string>), Authorization: `Bearer ${this.apiKey}` } };
    try {
      res = await this.fetchImpl(this.url(path), init);
    } catch (e) {
      if (isAbort(e)) throw e;
      throw new ApiError(
        `Cannot reach the Tandem engine at ${this.base || location.origin}: ${errorMessage(e)}`,
        0,
        'connection_error',
      );
    }
    if (!res.ok) throw await errorFromResponse(res);
    return res;
  }

  private async json<T>(
    path: string,
    method = 'GET',
    body?: unknown,
    signal?: AbortSignal,
    headers: Record<string, string> = {},
  ): Promise<T> {
    const init: RequestInit = { method, signal, headers: { Accept: 'application/json', ...headers } };
    if (body !== undefined) {
      init.body = JSON.stringify(body);
      init.headers = { ...init.headers, 'Content-Type': 'application/json' };
    }
    const res = await this.send(path, init);
    const text = await res.text();
    if (!text) return undefined as T;
    try {
      return JSON.parse(text) as T;
    } catch {
      throw new ApiError(`${method} ${path}: the engine answered something that is not JSON`, res.status);
    }
  }

  private async *events(path: string, signal?: AbortSignal, init: RequestInit = {}) {
    const res = await this.send(path, {
      ...init,
      signal,
      headers: { Accept: 'text/event-stream', ...(init.headers as Record<string, string>) },
    });
    if (!res.body) throw new ApiError(`${path}: the response has no body`, res.status);
    yield* readSse(res.body, signal);
  }

  // -- OpenAI-compatible ------------------------------------------------------------------------

  async models(signal?: AbortSignal): Promise<OpenAIModel[]> {
    return (await this.json<OpenAIModelList>('/v1/models', 'GET', undefined, signal)).data;
  }

  /**
   * Streams a chat completion: yields each chunk until `data: [DONE]`. An error event, or a chunk that
   * is `{"error": {...}}`, throws an ApiError with the server's message. Abort `signal` to stop.
   */
  async *chat(req: ChatRequest, signal?: AbortSignal): AsyncGenerator<ChatCompletionChunk, void, undefined> {
    const body: ChatCompletionRequest = { ...req, stream: true, stream_options: { include_usage: true } };
    const res = await this.send('/v1/chat/completions', {
      method: 'POST',
      signal,
      headers: { 'Content-Type': 'application/json', Accept: 'text/event-stream' },
      body: JSON.stringify(body),
    });
    if (!res.body) throw new ApiError('The completion response has no body', res.status);
    for await (const ev of readSse(res.body, signal)) {
      const data = ev.data.trim();
      if (data === '[DONE]') return;
      if (ev.event === 'error') {
        throw new ApiError(parseErrorBody(data)?.message ?? (data || 'The generation failed'), 0, 'stream_error');
      }
      if (!data) continue;
      let chunk: unknown;
      try {
        chunk = JSON.parse(data);
      } catch {
        throw new ApiError(`The engine sent a chunk that is not JSON: ${data.slice(0, 120)}`, 0, 'stream_error');
      }
      const e = errorOf(chunk);
      if (e) throw new ApiError(e.message, 0, e.type ?? 'stream_error', e.code);
      yield chunk as ChatCompletionChunk;
    }
  }

  // -- Admin ------------------------------------------------------------------------------------

  health(signal?: AbortSignal): Promise<Health> {
    return this.json<Health>('/api/health', 'GET', undefined, signal);
  }

  async adminModels(signal?: AbortSignal): Promise<ModelStatus[]> {
    return (await this.json<ModelList>('/api/models', 'GET', undefined, signal)).models;
  }

  loadModel(id: string): Promise<ModelStatus> {
    return this.json<ModelStatus>(`/api/models/${encodeURIComponent(id)}/load`, 'POST');
  }

  unloadModel(id: string): Promise<ModelStatus> {
    return this.json<ModelStatus>(`/api/models/${encodeURIComponent(id)}/unload`, 'POST');
  }

  updateModelSettings(id: string, patch: SettingsPatch): Promise<ModelStatus> {
    return this.json<ModelStatus>(`/api/models/${encodeURIComponent(id)}/settings`, 'PATCH', patch);
  }

  /** Starts a conversion; resolves to the job's id. */
  async startConvert(req: ConvertRequest): Promise<string> {
    const job = await this.json<JobView>('/api/convert', 'POST', req);
    if (!job?.job) throw new ApiError('The engine did not return a conversion job id', 0);
    return job.job;
  }

  convertStatus(job: string, signal?: AbortSignal): Promise<JobView> {
    return this.json<JobView>(`/api/convert/${encodeURIComponent(job)}`, 'GET', undefined, signal);
  }

  /** The job's events, until the stream closes (after `finished`, `error` or `cancelled`). */
  async *convertEvents(job: string, signal?: AbortSignal): AsyncGenerator<JobEvent, void, undefined> {
    for await (const ev of this.events(`/api/convert/${encodeURIComponent(job)}/events`, signal)) {
      try {
        yield JSON.parse(ev.data) as JobEvent;
      } catch {
        // a keep-alive or a malformed event: skip it
      }
    }
  }

  cancelConvert(job: string): Promise<unknown> {
    return this.json(`/api/convert/${encodeURIComponent(job)}`, 'DELETE');
  }

  // -- Downloads from Hugging Face (engine jobs) ------------------------------------------------

  startPull(req: PullRequest): Promise<DownloadView> {
    return this.json<DownloadView>('/api/pull', 'POST', req);
  }

  async listPulls(signal?: AbortSignal): Promise<DownloadView[]> {
    return (await this.json<DownloadList>('/api/pull', 'GET', undefined, signal)).downloads;
  }

  pullStatus(job: string, signal?: AbortSignal): Promise<DownloadView> {
    return this.json<DownloadView>(`/api/pull/${encodeURIComponent(job)}`, 'GET', undefined, signal);
  }

  /** The download's events, until it ends. */
  async *pullEvents(job: string, signal?: AbortSignal): AsyncGenerator<DownloadEvent, void, undefined> {
    for await (const ev of this.events(`/api/pull/${encodeURIComponent(job)}/events`, signal)) {
      try {
        yield JSON.parse(ev.data) as DownloadEvent;
      } catch {
        // a keep-alive or a malformed event: skip it
      }
    }
  }

  cancelPull(job: string): Promise<unknown> {
    return this.json(`/api/pull/${encodeURIComponent(job)}`, 'DELETE');
  }

  /** The known Qwen3.5-family repos, each with what fits this machine. */
  catalog(signal?: AbortSignal): Promise<CatalogList> {
    return this.json<CatalogList>('/api/catalog', 'GET', undefined, signal);
  }

  /** The Hub's repos whose names contain `q`, most downloaded first. */
  async searchHub(q: string, signal?: AbortSignal): Promise<HubModel[]> {
    return (await this.json<HubSearch>(`/api/hub/search?q=${encodeURIComponent(q)}`, 'GET', undefined, signal)).models;
  }

  /** What a repo holds and whether it fits, before downloading it. */
  previewRepo(repo: string, signal?: AbortSignal): Promise<PreviewView> {
    return this.json<PreviewView>(`/api/hub/preview?repo=${encodeURIComponent(repo)}`, 'GET', undefined, signal);
  }

  /** Fetches the raw checkpoint's MTP head and grafts it onto model `id` (a download job). */
  graftHead(id: string, req: GraftRequest = {}): Promise<DownloadView> {
    return this.json<DownloadView>(`/api/models/${encodeURIComponent(id)}/graft`, 'POST', req);
  }

  // -- App-wide settings and the server's own state (the Settings page) --------------------------

  settings(signal?: AbortSignal): Promise<SettingsView> {
    return this.json<SettingsView>('/api/settings', 'GET', undefined, signal);
  }

  /** Saves a change (what `patch` leaves out stays); a bad value is a 400 whose message names the setting. */
  updateSettings(patch: AppPatch): Promise<SettingsView> {
    return this.json<SettingsView>('/api/settings', 'PATCH', patch);
  }

  serverInfo(signal?: AbortSignal): Promise<ServerInfo> {
    return this.json<ServerInfo>('/api/server', 'GET', undefined, signal);
  }

  /** The server's recent API requests, newest first. */
  async requestLog(signal?: AbortSignal): Promise<LoggedRequest[]> {
    return (await this.json<RequestLog>('/api/server/requests', 'GET', undefined, signal)).requests;
  }

  // -- Folders the person chose, and model folders added as they are ---------------------------

  /** Lets conversions read `path` for this run: call it only after the person confirmed the folder. */
  chooseFolder(path: string): Promise<ChosenFolder> {
    return this.json<ChosenFolder>('/api/folders', 'POST', { path });
  }

  /** Whether this window can open the desktop app's folder dialog. */
  canPickFolder(): boolean {
    return folderDialog() != null;
  }

  /** The desktop app's native folder dialog; null when the person closed it (or outside the app). */
  async pickFolder(title?: string): Promise<PickedFolder | null> {
    const dialog = folderDialog();
    if (!dialog) return null;
    const picked = await this.json<PickedFolder>('/api/folders/pick', 'POST', title ? { title } : {}, undefined, {
      [dialog.header]: dialog.token,
    });
    return picked?.path ? picked : null;
  }

  /** Registers an existing model folder (no conversion) in models.toml. */
  addModel(req: AddModelRequest): Promise<ModelStatus> {
    return this.json<ModelStatus>('/api/models', 'POST', req);
  }

  // -- Conversations (kept by the engine, one file each) ---------------------------------------

  /** The saved conversations, newest first. A 404 means an engine without a conversation store. */
  async listConversations(signal?: AbortSignal): Promise<ConversationSummary[]> {
    return (await this.json<ConversationList>('/api/conversations', 'GET', undefined, signal)).conversations;
  }

  /** One conversation as saved; null when there is none with that id. */
  async getConversation(id: string, signal?: AbortSignal): Promise<Conversation | null> {
    try {
      return await this.json<Conversation>(`/api/conversations/${encodeURIComponent(id)}`, 'GET', undefined, signal);
    } catch (e) {
      if (e instanceof ApiError && e.status === 404 && e.code === 'conversation_not_found') return null;
      throw e;
    }
  }

  /** Saves the whole conversation (created or replaced). */
  putConversation(c: Conversation): Promise<ConversationSummary> {
    return this.json<ConversationSummary>(`/api/conversations/${encodeURIComponent(c.id)}`, 'PUT', c);
  }

  /** Deletes a conversation; one that is not there is not an error. */
  async deleteConversation(id: string): Promise<void> {
    try {
      await this.json(`/api/conversations/${encodeURIComponent(id)}`, 'DELETE');
    } catch (e) {
      if (e instanceof ApiError && e.status === 404 && e.code === 'conversation_not_found') return;
      throw e;
    }
  }

  stats(signal?: AbortSignal): Promise<StatsSnapshot> {
    return this.json<StatsSnapshot>('/api/stats', 'GET', undefined, signal);
  }

  /** Live snapshots from `/api/stats/stream`; ends when the server closes the stream. */
  async *statsStream(signal?: AbortSignal): AsyncGenerator<StatsSnapshot, void, undefined> {
    for await (const ev of this.events('/api/stats/stream', signal)) {
      if (ev.event === 'error') throw new ApiError(parseErrorBody(ev.data)?.message ?? ev.data, 0, 'stream_error');
      try {
        const body = JSON.parse(ev.data) as StatsSnapshot;
        if (body && typeof body === 'object') yield body;
      } catch {
        // a keep-alive or a malformed snapshot: skip it
      }
    }
  }
}

export const api = new Api();
