#!/usr/bin/env node
// A stand-in for `tandem serve`, for developing and trying the UI without the engine: it speaks the HTTP
// API as the UI expects it (see ui/README.md, "What the UI expects of the server") with canned models,
// a fake streamed reply with statistics, a fake conversion and a stats stream, and serves ui/dist.
//
//   node mock/engine.mjs [--port 11436]      then open http://127.0.0.1:11436
//
// It listens on 127.0.0.1 only. Nothing here is used by the real engine or by the unit tests.

import { createReadStream, existsSync, statSync } from 'node:fs';
import { createServer } from 'node:http';
import { extname, join, normalize } from 'node:path';
import { fileURLToPath } from 'node:url';

const args = process.argv.slice(2);
const port = Number(args[args.indexOf('--port') + 1] || process.env.PORT || 11436);
const dist = fileURLToPath(new URL('../dist/', import.meta.url));

const models = [
  {
    id: 'tandem-tiny',
    name: 'tandem-tiny',
    path: 'assets/models/tandem-tiny',
    format: 'mlx',
    size: 9_830_400,
    quantization: null,
    dtype: 'bfloat16',
    loaded: true,
    vision: true,
    mtp: { available: true, enabled: true, depth: 3, reason: null },
    sampling: { temperature: 0.7, top_p: 0.95, max_tokens: 512 },
  },
  {
    id: 'Qwen3.5-4B',
    name: 'Qwen3.5-4B',
    path: '/Users/me/models/Qwen3.5-4B',
    format: 'hf',
    size: 8_650_000_000,
    quantization: null,
    dtype: 'bfloat16',
    loaded: false,
    vision: true,
    mtp: { available: true, enabled: false, depth: 3, reason: null },
    sampling: { temperature: 0.6, top_p: 0.95, max_tokens: 2048 },
  },
  {
    id: 'Qwen3.5-4B-4bit-community',
    name: 'Qwen3.5-4B-4bit-community',
    path: '/Users/me/models/Qwen3.5-4B-4bit-community',
    format: 'mlx',
    size: 2_410_000_000,
    quantization: { bits: 4, group_size: 64 },
    loaded: false,
    vision: false,
    mtp: {
      available: false,
      enabled: false,
      depth: 3,
      reason: 'config.json declares 1 MTP layer but the files hold no mtp.* tensors (the converter dropped them)',
    },
  },
];

const jobs = new Map();
let live = { generating: false, model: null, tok_s: 0, stats: null };

function send(res, status, body) {
  res.writeHead(status, { 'Content-Type': 'application/json', 'Access-Control-Allow-Origin': '*' });
  res.end(JSON.stringify(body));
}

function error(res, status, message, type = 'invalid_request_error', code = null) {
  send(res, status, { error: { message, type, code } });
}

function sseStart(res) {
  res.writeHead(200, {
    'Content-Type': 'text/event-stream',
    'Cache-Control': 'no-cache',
    Connection: 'keep-alive',
    'Access-Control-Allow-Origin': '*',
  });
}

async function body(req) {
  let raw = '';
  for await (const c of req) raw += c;
  return raw ? JSON.parse(raw) : {};
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function snapshot() {
  return {
    time_ms: Date.now(),
    generating: live.generating,
    model: live.model,
    tok_s: live.generating ? live.tok_s : 0,
    acceptance: live.stats?.spec ? live.stats.spec.acceptance : null,
    tok_per_cycle: live.stats?.spec ? live.stats.spec.tok_per_cycle : null,
    stats: live.stats,
    memory: { active_bytes: 1_240_000_000 + Math.round(Math.random() * 5e6), peak_bytes: 1_610_000_000, cache_bytes: 120_000_000 },
    loaded_models: models.filter((m) => m.loaded).map((m) => m.id),
  };
}

const REPLY = `Here is a short answer with **markdown**:

1. Multi-token prediction drafts a few tokens ahead.
2. The model verifies them in one pass and keeps the accepted prefix.

\`\`\`rust
fn accept(drafts: &[u32], target: &[u32]) -> usize {
    drafts.iter().zip(target).take_while(|(a, b)| a == b).count()
}
\`\`\`

| depth | acceptance |
|---|---|
| 1 | 90% |
| 2 | 70% |
| 3 | 45% |

That is all. <img src=x onerror="alert('xss')">`;

async function chat(req, res) {
  const b = await body(req);
  const model = models.find((m) => m.id === b.model);
  if (!model) return error(res, 404, `no model named \`${b.model}\``, 'not_found_error', 'model_not_found');
  const last = [...(b.messages ?? [])].reverse().find((m) => m.role === 'user');
  const text = typeof last?.content === 'string' ? last.content : (last?.content ?? []).find((p) => p.type === 'text')?.text ?? '';
  if (/fail/i.test(text)) return error(res, 500, `model \`${model.id}\` failed: out of memory while allocating the KV cache (needs 3.2 GB)`, 'server_error', 'oom');
  model.loaded = true;
  const images = Array.isArray(last?.content) ? last.content.filter((p) => p.type === 'image_url').length : 0;
  const reply = (images ? `I see ${images} image${images > 1 ? 's' : ''}. ` : '') + REPLY;
  const tokens = reply.match(/\s*\S+|\s+/g) ?? [];
  const depth = model.mtp.enabled && model.mtp.available ? model.mtp.depth : 0;
  const spec = depth
    ? { method: 'mtp', depth, cycles: 0, drafted: 0, accepted: 0, acceptance: 0, tok_per_cycle: 0, by_depth: Array.from({ length: depth }, (_, i) => ({ depth: i + 1, drafted: 0, accepted: 0 })), accepted_hist: Array(depth + 1).fill(0), parked_cycles: 0, ms: { draft: 0, verify: 0, sample: 0, rollback: 0 }, fallback: null }
    : model.mtp.reason
      ? { method: 'mtp', depth: 0, cycles: 0, drafted: 0, accepted: 0, acceptance: 0, tok_per_cycle: 0, by_depth: [], accepted_hist: [0], parked_cycles: 0, ms: { draft: 0, verify: 0, sample: 0, rollback: 0 }, fallback: model.mtp.reason }
      : null;
  const stats = { prompt_tokens: 17 + images * 256, completion_tokens: 0, ttft_ms: 84.2, prefill_tok_s: 512.3, decode_tok_s: 0, spec };
  let closed = false;
  res.on('close', () => {
    closed = true;
  });
  sseStart(res);
  live = { generating: true, model: model.id, tok_s: 0, stats };
  const started = Date.now();
  const id = `chatcmpl-${Date.now()}`;
  const chunk = (delta, finish = null, extra = {}) =>
    res.write(`data: ${JSON.stringify({ id, object: 'chat.completion.chunk', created: Math.floor(started / 1000), model: model.id, choices: [{ index: 0, delta, finish_reason: finish }], ...extra })}\n\n`);
  chunk({ role: 'assistant', content: '' });
  let i = 0;
  const max = b.max_tokens ?? 512;
  while (i < tokens.length && stats.completion_tokens < max && !closed) {
    let n = 1;
    if (spec && depth) {
      const accepted = Math.min(depth, [0, 1, 1, 2, 2, 3, 3, 3][Math.floor(Math.random() * 8)]);
      spec.cycles++;
      spec.drafted += depth;
      spec.accepted += accepted;
      for (let d = 0; d < depth; d++) {
        spec.by_depth[d].drafted++;
        if (d < accepted) spec.by_depth[d].accepted++;
      }
      spec.accepted_hist[accepted]++;
      spec.acceptance = spec.accepted / spec.drafted;
      spec.tok_per_cycle = (spec.accepted + spec.cycles) / spec.cycles;
      spec.ms.draft += 4.1;
      spec.ms.verify += 11.8;
      spec.ms.sample += 1.3;
      spec.ms.rollback += accepted < depth ? 0.9 : 0;
      n = accepted + 1;
    }
    const piece = tokens.slice(i, i + n).join('');
    i += n;
    stats.completion_tokens += n;
    await sleep(35);
    stats.decode_tok_s = (stats.completion_tokens * 1000) / (Date.now() - started) + Math.random() * 4;
    live.tok_s = stats.decode_tok_s;
    chunk({ content: piece }, null, { stats });
  }
  live.generating = false;
  if (closed) return;
  chunk({}, i >= tokens.length ? 'stop' : 'length');
  res.write(`data: ${JSON.stringify({ id, object: 'chat.completion.chunk', choices: [], usage: { prompt_tokens: stats.prompt_tokens, completion_tokens: stats.completion_tokens, total_tokens: stats.prompt_tokens + stats.completion_tokens }, stats })}\n\n`);
  res.write('data: [DONE]\n\n');
  res.end();
}

async function convert(req, res) {
  const b = await body(req);
  if (!b.src) return error(res, 400, 'src: required');
  if (/nowhere/.test(b.src)) return error(res, 400, `${b.src}: no such folder`, 'invalid_request_error', 'not_found');
  const job = `job-${jobs.size + 1}`;
  const name = b.name || `${b.src.replace(/\/+$/, '').split('/').pop()}-${b.bits}bit`;
  const state = { job, state: 'running', src: b.src, done: 0, total: 24, listeners: new Set(), events: [], name, req: b };
  jobs.set(job, state);
  send(res, 202, { job });
  const emit = (event, data) => {
    state.events.push([event, data]);
    for (const l of state.listeners) l(event, data);
  };
  await sleep(300);
  const bpw = b.bits + 32 / b.group_size;
  emit('planned', { predicted_bytes: Math.round(4.2e9 * bpw / 16 + (b.mtp === 'keep' ? 5e7 : 0)), predicted_bpw: bpw });
  for (let i = 1; i <= state.total; i++) {
    await sleep(150);
    if (state.state !== 'running') return;
    if (/broken/.test(b.src) && i === 5) {
      state.state = 'error';
      state.error = 'model.safetensors: tensor `mtp.fc.weight` has shape [192, 192], expected [192, 384]';
      emit('error', { message: state.error });
      return;
    }
    state.done = i;
    emit('progress', { done: i, total: state.total, tensor: `model.language_model.layers.${i - 1}.mlp.down_proj.weight` });
  }
  state.state = 'finished';
  state.path = `~/.tandem/models/${name}`;
  state.bytes = Math.round(4.2e9 * bpw / 16);
  state.bpw = bpw;
  models.push({
    id: name,
    name,
    path: state.path,
    format: 'mlx',
    size: state.bytes,
    quantization: { bits: b.bits, group_size: b.group_size },
    loaded: false,
    mtp: b.mtp === 'keep' ? { available: true, enabled: true, depth: 3, reason: null } : { available: false, enabled: false, depth: 3, reason: 'the MTP head was dropped at conversion' },
  });
  emit('finished', { bytes: state.bytes, bpw, path: state.path });
}

/** Saved conversations, in memory (the engine keeps them on disk). */
const conversations = new Map();

function serveStatic(req, res) {
  const url = new URL(req.url, 'http://x');
  let path = normalize(decodeURIComponent(url.pathname)).replace(/^(\.\.[/\\])+/, '');
  let file = join(dist, path);
  if (!file.startsWith(dist) || !existsSync(file) || statSync(file).isDirectory()) file = join(dist, 'index.html');
  if (!existsSync(file)) return error(res, 404, 'ui/dist is missing: run `npm run build` first', 'not_found_error');
  const types = { '.html': 'text/html', '.js': 'text/javascript', '.css': 'text/css', '.svg': 'image/svg+xml', '.png': 'image/png' };
  res.writeHead(200, { 'Content-Type': types[extname(file)] ?? 'application/octet-stream' });
  createReadStream(file).pipe(res);
}

const server = createServer(async (req, res) => {
  const url = new URL(req.url, 'http://x');
  const p = url.pathname;
  try {
    if (req.method === 'OPTIONS') {
      res.writeHead(204, { 'Access-Control-Allow-Origin': '*', 'Access-Control-Allow-Methods': 'GET, POST, PUT, PATCH, DELETE', 'Access-Control-Allow-Headers': 'Content-Type, Authorization' });
      return res.end();
    }
    if (p === '/api/health') return send(res, 200, { status: 'ok', version: 'mock' });
    if (p === '/v1/models') return send(res, 200, { object: 'list', data: models.map((m) => ({ id: m.id, object: 'model', owned_by: 'tandem' })) });
    if (p === '/api/models' && req.method === 'GET') return send(res, 200, { models: models.map(({ ...m }) => m) });
    let m = p.match(/^\/api\/models\/([^/]+)\/(load|unload|settings)$/);
    if (m) {
      const model = models.find((x) => x.id === decodeURIComponent(m[1]));
      if (!model) return error(res, 404, `no model named \`${decodeURIComponent(m[1])}\``, 'not_found_error', 'model_not_found');
      if (m[2] === 'load') {
        await sleep(600);
        model.loaded = true;
      } else if (m[2] === 'unload') model.loaded = false;
      else {
        const b = await body(req);
        if (b.mtp) {
          if (b.mtp.enabled && !model.mtp.available) return error(res, 409, `${model.id}: MTP cannot be enabled: ${model.mtp.reason}`, 'invalid_request_error', 'mtp_unavailable');
          Object.assign(model.mtp, b.mtp);
        }
        if (b.sampling) model.sampling = { ...model.sampling, ...b.sampling };
      }
      return send(res, 200, model);
    }
    if (p === '/v1/chat/completions' && req.method === 'POST') return await chat(req, res);
    if (p === '/api/convert' && req.method === 'POST') return await convert(req, res);
    m = p.match(/^\/api\/convert\/([^/]+)(\/events)?$/);
    if (m) {
      const job = jobs.get(m[1]);
      if (!job) return error(res, 404, `no conversion job \`${m[1]}\``, 'not_found_error');
      if (req.method === 'DELETE') {
        if (job.state === 'running') {
          job.state = 'cancelled';
          for (const l of job.listeners) l('cancelled', {});
        }
        return send(res, 200, { job: job.job, state: job.state });
      }
      if (!m[2]) {
        const { listeners, events, req: _r, ...rest } = job;
        return send(res, 200, rest);
      }
      sseStart(res);
      const write = (event, data) => {
        res.write(`event: ${event}\ndata: ${JSON.stringify(data)}\n\n`);
        if (event === 'finished' || event === 'error' || event === 'cancelled') res.end();
      };
      for (const [e, d] of job.events) write(e, d);
      if (job.state !== 'running') return res.end();
      job.listeners.add(write);
      res.on('close', () => job.listeners.delete(write));
      return;
    }
    if (p === '/api/conversations' && req.method === 'GET') {
      const list = [...conversations.values()].map(({ id, title, updated }) => ({ id, title, updated }));
      return send(res, 200, { conversations: list.sort((a, b) => b.updated - a.updated) });
    }
    m = p.match(/^\/api\/conversations\/([A-Za-z0-9_-]{1,128})$/);
    if (m) {
      const id = m[1];
      if (req.method === 'PUT') {
        const c = await body(req);
        const created = !conversations.has(id);
        conversations.set(id, c);
        return send(res, created ? 201 : 200, { id, title: c.title, updated: c.updated });
      }
      if (!conversations.has(id)) return error(res, 404, `no conversation \`${id}\``, 'not_found_error', 'conversation_not_found');
      if (req.method === 'DELETE') {
        conversations.delete(id);
        return send(res, 200, { id, deleted: true });
      }
      return send(res, 200, conversations.get(id));
    }
    if (p === '/api/stats') return send(res, 200, snapshot());
    if (p === '/api/stats/stream') {
      sseStart(res);
      const tick = () => res.write(`data: ${JSON.stringify(snapshot())}\n\n`);
      tick();
      const t = setInterval(tick, 500);
      res.on('close', () => clearInterval(t));
      return;
    }
    if (p.startsWith('/api/') || p.startsWith('/v1/')) return error(res, 404, `no route ${req.method} ${p}`, 'not_found_error');
    return serveStatic(req, res);
  } catch (e) {
    error(res, 500, String(e?.message ?? e), 'server_error');
  }
});

server.listen(port, '127.0.0.1', () => console.log(`mock engine on http://127.0.0.1:${port}`));
