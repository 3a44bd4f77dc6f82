//! Ollama-compatible routes, so tools that speak Ollama's API work when pointed at Tandem:
//! `POST /api/chat`, `POST /api/generate` (newline-delimited JSON streams, the default, or one object
//! with `"stream": false`), `GET /api/tags`, `POST /api/show`, `GET /api/ps`, `GET /api/version`. They sit
//! beside Tandem's own `/api/*` routes, whose paths they do not share. Errors are Ollama's `{"error": "..."}`.
//! A model may be named with Ollama's `:latest` tag. Tandem's `stats` (the MTP statistics) ride on the
//! final object.

use std::sync::Arc;
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use super::error::{parse_json, ApiError};
use super::request::{base64_image, count, model_or_default, stops, unsupported};
use super::AppState;
use crate::chat::tools::{self, CallStream, Tool, ToolCall, ToolChoice, ToolUse};
use crate::engine::{ChatMessage, Completion, Event, Input, ModelStatus, Part, Request, SamplingOverrides};
use crate::generate::{FinishReason, GrammarSpec, Stats};

/// An error as Ollama writes it.
pub struct OllamaError(ApiError);

impl From<ApiError> for OllamaError {
    fn from(e: ApiError) -> Self {
        OllamaError(e)
    }
}

impl From<crate::engine::EngineError> for OllamaError {
    fn from(e: crate::engine::EngineError) -> Self {
        OllamaError(e.into())
    }
}

impl IntoResponse for OllamaError {
    fn into_response(self) -> Response {
        (self.0.status, Json(json!({ "error": self.0.message }))).into_response()
    }
}

type Result<T> = std::result::Result<T, OllamaError>;

/// Ollama's `options` that Tandem implements; any other is refused by name.
#[derive(Debug, Default, Deserialize)]
struct Options {
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<u64>,
    min_p: Option<f32>,
    repeat_penalty: Option<f32>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    seed: Option<i64>,
    num_predict: Option<i64>,
    stop: Option<Vec<String>>,
    #[serde(flatten)]
    other: Map<String, Value>,
}

#[derive(Debug, Deserialize)]
struct OllamaMessage {
    role: String,
    #[serde(default)]
    content: String,
    /// Base64 images (no data-URL prefix).
    #[serde(default)]
    images: Vec<String>,
    /// An assistant turn's calls: `{"function": {"name", "arguments": {..}}}`.
    #[serde(default)]
    tool_calls: Vec<OllamaToolCall>,
    #[serde(flatten)]
    other: Map<String, Value>,
}

#[derive(Debug, Deserialize)]
struct OllamaToolCall {
    function: OllamaFunctionCall,
}

#[derive(Debug, Deserialize)]
struct OllamaFunctionCall {
    name: String,
    #[serde(default)]
    arguments: Map<String, Value>,
}

/// Ollama's `tools` (OpenAI's function objects); the model may call any (Ollama has no `tool_choice`).
fn tool_use(tools: Option<Vec<Value>>) -> std::result::Result<Option<ToolUse>, ApiError> {
    let tools = tools.unwrap_or_default();
    if tools.is_empty() {
        return Ok(None);
    }
    let tools = tools
        .into_iter()
        .enumerate()
        .map(|(i, t)| {
            let f =
                t.get("function").filter(|_| t.get("type").and_then(Value::as_str).unwrap_or("function") == "function");
            let name = f.and_then(|f| f.get("name")).and_then(Value::as_str);
            let (Some(f), Some(name)) = (f, name) else {
                return Err(ApiError::bad_request(
                    "invalid_value",
                    format!("`tools[{i}]` is not a function tool with a name"),
                ));
            };
            Ok(Tool {
                name: name.to_owned(),
                description: f.get("description").and_then(Value::as_str).map(str::to_owned),
                parameters: f.get("parameters").cloned().unwrap_or_else(|| json!({"type": "object"})),
            })
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    Ok(Some(ToolUse { tools, choice: ToolChoice::Auto }))
}

/// Calls as Ollama writes them.
fn calls_json(calls: &[ToolCall]) -> Value {
    Value::Array(calls.iter().map(|c| json!({"function": {"name": c.name, "arguments": c.arguments}})).collect())
}

#[derive(Debug, Deserialize)]
struct ChatBody {
    model: String,
    #[serde(default)]
    messages: Vec<OllamaMessage>,
    stream: Option<bool>,
    #[serde(default)]
    options: Options,
    think: Option<bool>,
    /// `"json"` or a JSON schema: constrained decoding.
    format: Option<Value>,
    /// Functions the model may call.
    tools: Option<Vec<Value>>,
    #[serde(flatten)]
    other: Map<String, Value>,
}

#[derive(Debug, Deserialize)]
struct GenerateBody {
    model: String,
    #[serde(default)]
    prompt: String,
    system: Option<String>,
    /// The prompt as it is, without the chat template.
    raw: Option<bool>,
    #[serde(default)]
    images: Vec<String>,
    stream: Option<bool>,
    #[serde(default)]
    options: Options,
    think: Option<bool>,
    /// `"json"` or a JSON schema: constrained decoding.
    format: Option<Value>,
    #[serde(flatten)]
    other: Map<String, Value>,
}

#[derive(Debug, Deserialize)]
struct ShowBody {
    #[serde(alias = "name")]
    model: String,
    #[serde(flatten)]
    other: Map<String, Value>,
}

/// Fields Ollama's clients send that change nothing here.
const HARMLESS: &[&str] = &["keep_alive"];

/// The registry's name for an Ollama model name (`name:latest` is `name`).
fn model_name(state: &AppState, given: &str) -> std::result::Result<String, ApiError> {
    let given = given.trim();
    let plain = given.strip_suffix(":latest").unwrap_or(given);
    let name = if state.engine.registry().get(given).is_some() { given } else { plain };
    model_or_default(state, name.to_owned())
}

fn sampling(o: &Options) -> std::result::Result<(SamplingOverrides, Option<usize>, Vec<String>), ApiError> {
    unsupported(&o.other, "options.", &[])?;
    let s = SamplingOverrides {
        temperature: o.temperature,
        top_p: o.top_p,
        top_k: o.top_k.map(count),
        min_p: o.min_p,
        repetition_penalty: o.repeat_penalty,
        presence_penalty: o.presence_penalty,
        frequency_penalty: o.frequency_penalty,
        seed: o.seed.map(|s| s as u64),
    };
    // Ollama's -1 (and -2) mean "until the context is full": the engine's own limit.
    let max = o.num_predict.filter(|&n| n > 0).map(|n| count(n as u64));
    Ok((s, max, stops(o.stop.clone().unwrap_or_default(), "options.stop")?))
}

/// Ollama's `format`: `"json"` for any JSON value, or a JSON schema.
fn format(format: Option<Value>) -> std::result::Result<Option<GrammarSpec>, ApiError> {
    match format {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) if s == "json" => Ok(Some(GrammarSpec::JsonObject)),
        Some(schema @ Value::Object(_)) => Ok(Some(GrammarSpec::JsonSchema(schema))),
        Some(other) => Err(ApiError::bad_request(
            "invalid_value",
            format!("`format` = {other}: must be \"json\" or a JSON schema object"),
        )),
    }
}

fn request(
    model: String,
    input: Input,
    o: &Options,
    think: Option<bool>,
    grammar: Option<Value>,
) -> std::result::Result<Request, ApiError> {
    let (sampling, max_tokens, stop) = sampling(o)?;
    Ok(Request {
        model,
        input,
        sampling,
        max_tokens,
        stop,
        mtp: Default::default(),
        enable_thinking: think,
        ignore_eos: false,
        grammar: format(grammar)?,
        tools: None,
        logprobs: None,
    })
}

fn body<T: serde::de::DeserializeOwned>(bytes: &Bytes) -> std::result::Result<T, ApiError> {
    parse_json(bytes)
}

pub async fn chat(State(state): State<Arc<AppState>>, bytes: Bytes) -> Result<Response> {
    let b: ChatBody = body(&bytes)?;
    unsupported(&b.other, "", HARMLESS)?;
    let model = model_name(&state, &b.model)?;
    let mut messages = Vec::with_capacity(b.messages.len());
    for (i, m) in b.messages.into_iter().enumerate() {
        unsupported(&m.other, &format!("messages[{i}]."), &[])?;
        if !matches!(m.role.as_str(), "system" | "user" | "assistant" | "tool") {
            return Err(ApiError::bad_request(
                "invalid_value",
                format!("`messages[{i}].role` = `{}`: must be system, user, assistant or tool", m.role),
            )
            .into());
        }
        let mut parts = vec![Part::Text(m.content)];
        for (j, img) in m.images.iter().enumerate() {
            parts.push(Part::Image(base64_image(img, &format!("`messages[{i}].images[{j}]`"))?));
        }
        let tool_calls = m
            .tool_calls
            .into_iter()
            .map(|c| ToolCall { name: c.function.name, arguments: Value::Object(c.function.arguments) })
            .collect();
        messages.push(ChatMessage { role: m.role, parts, tool_calls });
    }
    if messages.is_empty() {
        // Ollama loads the model on an empty chat; here that is an empty answer once it is loaded.
        state.engine.load(&model).await?;
        return Ok(Json(json!({"model": model, "created_at": now(), "message": {"role": "assistant", "content": ""}, "done": true, "done_reason": "load"})).into_response());
    }
    let mut req = request(model, Input::Chat(messages), &b.options, b.think, b.format)?;
    req.tools = tool_use(b.tools)?;
    answer(&state, req, b.stream.unwrap_or(true), Kind::Chat).await
}

pub async fn generate(State(state): State<Arc<AppState>>, bytes: Bytes) -> Result<Response> {
    let b: GenerateBody = body(&bytes)?;
    unsupported(&b.other, "", HARMLESS)?;
    let model = model_name(&state, &b.model)?;
    let raw = b.raw.unwrap_or(false);
    let input = if raw {
        if !b.images.is_empty() || b.system.is_some() {
            return Err(ApiError::bad_request("invalid_value", "`raw` prompts take no `images` or `system`").into());
        }
        Input::Raw(b.prompt)
    } else {
        let mut messages = Vec::new();
        if let Some(system) = b.system {
            messages.push(ChatMessage::text("system", system));
        }
        let mut parts = vec![Part::Text(b.prompt)];
        for (j, img) in b.images.iter().enumerate() {
            parts.push(Part::Image(base64_image(img, &format!("`images[{j}]`"))?));
        }
        messages.push(ChatMessage { role: "user".into(), parts, tool_calls: Vec::new() });
        Input::Chat(messages)
    };
    let req = request(model, input, &b.options, b.think, b.format)?;
    answer(&state, req, b.stream.unwrap_or(true), Kind::Generate).await
}

#[derive(Clone, Copy)]
enum Kind {
    Chat,
    Generate,
}

fn now() -> String {
    rfc3339(crate::engine::live::unix_ms())
}

/// Milliseconds since 1970 as RFC 3339 in UTC, as Ollama writes its times.
fn rfc3339(ms: u64) -> String {
    let secs = (ms / 1000) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z", rem / 3600, rem % 3600 / 60, rem % 60, ms % 1000)
}

/// One line of the stream (or the whole answer): `message` for chat, `response` for generate.
fn piece(kind: Kind, model: &str, text: &str) -> Map<String, Value> {
    let mut o = Map::new();
    o.insert("model".into(), json!(model));
    o.insert("created_at".into(), json!(now()));
    match kind {
        Kind::Chat => o.insert("message".into(), json!({"role": "assistant", "content": text})),
        Kind::Generate => o.insert("response".into(), json!(text)),
    };
    o.insert("done".into(), json!(false));
    o
}

/// The last object: `done`, the reason, Ollama's counts and durations (nanoseconds), Tandem's `stats`.
fn last(kind: Kind, model: &str, text: &str, c: &Completion, started: Instant) -> Map<String, Value> {
    let mut o = piece(kind, model, text);
    let s: &Stats = &c.stats;
    let ns = |ms: f64| (ms * 1e6).max(0.0) as u64;
    let eval_ns = if s.decode_tok_s > 0.0 { (s.completion_tokens as f64 / s.decode_tok_s * 1e9) as u64 } else { 0 };
    o.insert("done".into(), json!(true));
    o.insert("done_reason".into(), json!(if c.finish == FinishReason::Length { "length" } else { "stop" }));
    o.insert("total_duration".into(), json!(started.elapsed().as_nanos() as u64));
    o.insert("load_duration".into(), json!(0));
    o.insert("prompt_eval_count".into(), json!(s.prompt_tokens));
    o.insert("prompt_eval_duration".into(), json!(ns(s.ttft_ms)));
    o.insert("eval_count".into(), json!(s.completion_tokens));
    o.insert("eval_duration".into(), json!(eval_ns));
    o.insert("stats".into(), serde_json::to_value(s).unwrap_or(Value::Null));
    o
}

async fn answer(state: &AppState, req: Request, stream: bool, kind: Kind) -> Result<Response> {
    let started = Instant::now();
    let reads_calls = req.tools.is_some();
    let mut g = state.engine.chat(req).await?;
    let model = g.model.clone();
    if !stream {
        let c = g.collect().await?;
        if c.finish == FinishReason::Cancelled {
            return Err(super::openai::cancelled().into());
        }
        let (text, calls) = if reads_calls { tools::parse(&c.text) } else { (c.text.clone(), Vec::new()) };
        let mut o = last(kind, &model, &text, &c, started);
        if !calls.is_empty() {
            o["message"]["tool_calls"] = calls_json(&calls);
        }
        return Ok(Json(Value::Object(o)).into_response());
    }
    let mut calls = reads_calls.then(CallStream::default);
    let lines = async_stream(move |tx| async move {
        while let Some(event) = g.events.recv().await {
            let lines = match event {
                Event::Started => continue,
                Event::Delta { text, .. } if text.is_empty() => continue,
                Event::Delta { text, .. } => match calls.as_mut() {
                    None => vec![Value::Object(piece(kind, &model, &text))],
                    Some(calls) => {
                        let (text, first) = calls.feed(&text);
                        let mut lines = Vec::new();
                        if !text.is_empty() {
                            lines.push(Value::Object(piece(kind, &model, &text)));
                        }
                        if calls.calls.len() > first {
                            let mut o = piece(kind, &model, "");
                            o["message"]["tool_calls"] = calls_json(&calls.calls[first..]);
                            lines.push(Value::Object(o));
                        }
                        lines
                    }
                },
                Event::Done(c) if c.finish == FinishReason::Cancelled => {
                    vec![json!({"error": super::openai::cancelled().message})]
                }
                Event::Done(c) => {
                    let rest = calls.as_mut().map(CallStream::finish).unwrap_or_default();
                    vec![Value::Object(last(kind, &model, &rest, &c, started))]
                }
                Event::Failed(e) => vec![json!({"error": ApiError::from(e).message})],
            };
            for line in lines {
                let end = line.get("done") == Some(&json!(true)) || line.get("error").is_some();
                if tx.send(line).is_err() || end {
                    return;
                }
            }
        }
    });
    let body = Body::from_stream(
        lines
            .map(|v| Ok::<_, std::convert::Infallible>(Bytes::from(format!("{}\n", v))))
            .take_until(state.shutdown_signal()),
    );
    Ok(([(header::CONTENT_TYPE, "application/x-ndjson")], body).into_response())
}

/// A stream fed by a task (the generation's events outlive the handler).
fn async_stream<F, Fut>(f: F) -> impl futures::Stream<Item = Value>
where
    F: FnOnce(tokio::sync::mpsc::UnboundedSender<Value>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(f(tx));
    tokio_stream::wrappers::UnboundedReceiverStream::new(rx)
}

#[derive(Serialize)]
struct Details {
    format: &'static str,
    family: &'static str,
    families: Vec<&'static str>,
    parameter_size: String,
    quantization_level: String,
}

fn details(m: &ModelStatus) -> Details {
    let quantization_level = match &m.quantization {
        Some(q) => q.bits.map_or("mixed".into(), |b| format!("Q{b}")),
        None => m.dtype.clone().unwrap_or_else(|| "bf16".into()).to_uppercase(),
    };
    Details {
        format: "safetensors",
        family: "qwen3_5",
        families: vec!["qwen3_5"],
        parameter_size: String::new(),
        quantization_level,
    }
}

fn entry(m: &ModelStatus) -> Value {
    json!({
        "name": m.name,
        "model": m.name,
        "modified_at": modified(&m.path),
        "size": m.size_bytes,
        "digest": "",
        "details": details(m),
    })
}

/// When the model's config.json was last written.
fn modified(path: &std::path::Path) -> String {
    let ms = std::fs::metadata(path.join("config.json"))
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_millis() as u64);
    rfc3339(ms)
}

pub async fn tags(State(state): State<Arc<AppState>>) -> Json<Value> {
    let models: Vec<Value> = state.engine.models().iter().map(entry).collect();
    Json(json!({ "models": models }))
}

pub async fn ps(State(state): State<Arc<AppState>>) -> Json<Value> {
    let models: Vec<Value> = state
        .engine
        .models()
        .iter()
        .filter(|m| m.loaded)
        .map(|m| {
            let mut e = entry(m);
            e["size_vram"] = json!(m.size_bytes);
            e["expires_at"] = json!("2999-01-01T00:00:00Z");
            e
        })
        .collect();
    Json(json!({ "models": models }))
}

pub async fn show(State(state): State<Arc<AppState>>, bytes: Bytes) -> Result<Json<Value>> {
    let b: ShowBody = body(&bytes)?;
    unsupported(&b.other, "", &["verbose"])?;
    let name = model_name(&state, &b.model)?;
    let m = state.engine.model_status(&name)?;
    let mut capabilities = vec!["completion"];
    if m.vision {
        capabilities.push("vision");
    }
    Ok(Json(json!({
        "modelfile": "",
        "parameters": "",
        "template": "",
        "details": details(&m),
        "model_info": {
            "general.architecture": "qwen3_5",
            "qwen3_5.context_length": m.context_length,
        },
        "capabilities": capabilities,
        "modified_at": modified(&m.path),
        "tandem": { "mtp": m.mtp, "path": m.path },
    })))
}

pub async fn version() -> Json<Value> {
    Json(json!({ "version": env!("CARGO_PKG_VERSION") }))
}
