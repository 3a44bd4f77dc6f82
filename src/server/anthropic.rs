//! Anthropic's Messages API, `POST /v1/messages`: text and image content blocks, a `system` prompt,
//! streamed as Anthropic's named server-sent events (`message_start`, `content_block_start`,
//! `content_block_delta`, `content_block_stop`, `message_delta`, `message_stop`) or not. Errors are
//! Anthropic's `{"type": "error", "error": {"type", "message"}}`. Tandem's `stats` ride on the message
//! and on `message_delta`. Tool use is refused by name, like every field Tandem does not implement.

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::StreamExt;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::error::{parse_json, ApiError};
use super::openai::cancelled;
use super::request::{base64_image, count, model_or_default, stops, unsupported};
use super::AppState;
use crate::chat::tools::{self, CallStream, Tool, ToolCall, ToolChoice, ToolUse};
use crate::engine::{ChatMessage, Completion, Event, Input, Part, Request, SamplingOverrides};
use crate::generate::FinishReason;

/// An error as Anthropic writes it.
pub struct AnthropicError(ApiError);

impl From<ApiError> for AnthropicError {
    fn from(e: ApiError) -> Self {
        AnthropicError(e)
    }
}

impl From<crate::engine::EngineError> for AnthropicError {
    fn from(e: crate::engine::EngineError) -> Self {
        AnthropicError(e.into())
    }
}

impl IntoResponse for AnthropicError {
    fn into_response(self) -> Response {
        let kind = match self.0.status.as_u16() {
            400 => "invalid_request_error",
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            503 => "overloaded_error",
            _ => "api_error",
        };
        let body = json!({"type": "error", "error": {"type": kind, "message": self.0.message}});
        (self.0.status, Json(body)).into_response()
    }
}

#[derive(Debug, Deserialize)]
struct MessagesBody {
    #[serde(default)]
    model: String,
    max_tokens: u64,
    messages: Vec<InMessage>,
    system: Option<SystemIn>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<u64>,
    stop_sequences: Option<Vec<String>>,
    stream: Option<bool>,
    tools: Option<Vec<ToolIn>>,
    tool_choice: Option<ToolChoiceIn>,
    #[serde(flatten)]
    other: Map<String, Value>,
}

#[derive(Debug, Deserialize)]
struct ToolIn {
    name: String,
    description: Option<String>,
    input_schema: Value,
    #[serde(flatten)]
    other: Map<String, Value>,
}

#[derive(Debug, Deserialize)]
struct ToolChoiceIn {
    /// auto, any, tool or none.
    #[serde(rename = "type")]
    kind: String,
    name: Option<String>,
    /// Several calls are always allowed.
    #[serde(default)]
    disable_parallel_tool_use: Option<bool>,
}

/// Anthropic's `tools` and `tool_choice` as the engine takes them.
fn tool_use(tools: Option<Vec<ToolIn>>, choice: Option<ToolChoiceIn>) -> Result<Option<ToolUse>, ApiError> {
    let tools = tools.unwrap_or_default();
    let choice = match choice {
        None => ToolChoice::Auto,
        Some(c) => {
            let _ = c.disable_parallel_tool_use;
            match (c.kind.as_str(), c.name) {
                ("none", _) => return Ok(None),
                ("auto", _) => ToolChoice::Auto,
                ("any", _) => ToolChoice::Required,
                ("tool", Some(name)) => ToolChoice::Function(name),
                (kind, _) => {
                    return Err(ApiError::bad_request(
                        "invalid_value",
                        format!("`tool_choice.type` = `{kind}`: must be auto, any, none, or tool with a name"),
                    ))
                }
            }
        }
    };
    if tools.is_empty() {
        return Ok(None);
    }
    let tools = tools
        .into_iter()
        .enumerate()
        .map(|(i, t)| {
            unsupported(&t.other, &format!("tools[{i}]."), &["cache_control"])?;
            Ok(Tool { name: t.name, description: t.description, parameters: t.input_schema })
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    Ok(Some(ToolUse { tools, choice }))
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum SystemIn {
    Text(String),
    Blocks(Vec<Block>),
}

#[derive(Debug, Deserialize)]
struct InMessage {
    role: String,
    content: ContentIn,
    #[serde(flatten)]
    other: Map<String, Value>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum ContentIn {
    Text(String),
    Blocks(Vec<Block>),
}

#[derive(Debug, Deserialize)]
struct Block {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
    source: Option<ImageSource>,
    /// tool_use: the call.
    id: Option<String>,
    name: Option<String>,
    input: Option<Value>,
    /// tool_result: which call, and what it returned (text or text blocks).
    tool_use_id: Option<String>,
    content: Option<Value>,
    is_error: Option<bool>,
    #[serde(flatten)]
    other: Map<String, Value>,
}

#[derive(Debug, Deserialize)]
struct ImageSource {
    #[serde(rename = "type")]
    kind: String,
    media_type: Option<String>,
    data: Option<String>,
}

/// Fields Anthropic's clients send that change nothing here.
const HARMLESS: &[&str] = &["metadata"];

/// What a message's blocks hold: text and images, calls (tool_use), results (tool_result).
#[derive(Default)]
struct Blocks {
    parts: Vec<Part>,
    calls: Vec<ToolCall>,
    results: Vec<String>,
}

fn parts(blocks: Vec<Block>, at: &str) -> Result<Vec<Part>, ApiError> {
    let read = read_blocks(blocks, at)?;
    if !read.calls.is_empty() || !read.results.is_empty() {
        return Err(ApiError::bad_request("invalid_value", format!("`{at}` may hold only text and image blocks")));
    }
    Ok(read.parts)
}

fn read_blocks(blocks: Vec<Block>, at: &str) -> Result<Blocks, ApiError> {
    let mut out = Blocks::default();
    for (j, b) in blocks.into_iter().enumerate() {
        let here = format!("{at}[{j}]");
        // `cache_control` asks for a prompt cache Anthropic keeps; asking changes no answer.
        unsupported(&b.other, &format!("{here}."), &["cache_control"])?;
        if b.kind == "tool_use" {
            let _ = b.id;
            let (Some(name), Some(arguments @ Value::Object(_))) = (b.name, b.input) else {
                return Err(ApiError::bad_request(
                    "invalid_value",
                    format!("`{here}`: a tool_use needs a name and an input object"),
                ));
            };
            out.calls.push(ToolCall { name, arguments });
            continue;
        }
        if b.kind == "tool_result" {
            let _ = (b.tool_use_id, b.is_error);
            let text = match b.content {
                None => String::new(),
                Some(Value::String(s)) => s,
                Some(Value::Array(items)) => {
                    items.iter().filter_map(|i| i.get("text").and_then(Value::as_str)).collect::<Vec<_>>().join("\n")
                }
                Some(other) => other.to_string(),
            };
            out.results.push(text);
            continue;
        }
        let out = &mut out.parts;
        match (b.kind.as_str(), b.text, b.source) {
            ("text", Some(text), None) => out.push(Part::Text(text)),
            ("image", None, Some(src)) if src.kind == "base64" => {
                let mut image =
                    base64_image(src.data.as_deref().unwrap_or_default(), &format!("`{here}.source.data`"))?;
                image.media_type = src.media_type.or(image.media_type);
                out.push(Part::Image(image));
            }
            ("image", _, Some(src)) => {
                return Err(ApiError::bad_request(
                    "unsupported_parameter",
                    format!("`{here}.source.type` = `{}`: only base64 images are read", src.kind),
                ))
            }
            (kind, _, _) => {
                return Err(ApiError::bad_request(
                    "unsupported_parameter",
                    format!(
                        "`{here}.type` = `{kind}`: only text, image, tool_use and tool_result blocks are supported"
                    ),
                ))
            }
        }
    }
    Ok(out)
}

fn parse(b: MessagesBody, state: &AppState) -> Result<(Request, bool), ApiError> {
    unsupported(&b.other, "", HARMLESS)?;
    let model = model_or_default(state, b.model)?;
    let mut messages = Vec::new();
    match b.system {
        Some(SystemIn::Text(t)) => messages.push(ChatMessage::text("system", t)),
        Some(SystemIn::Blocks(blocks)) => messages.push(ChatMessage {
            role: "system".into(),
            parts: parts(blocks, "system")?,
            tool_calls: Vec::new(),
        }),
        None => {}
    }
    for (i, m) in b.messages.into_iter().enumerate() {
        unsupported(&m.other, &format!("messages[{i}]."), &[])?;
        if !matches!(m.role.as_str(), "user" | "assistant") {
            return Err(ApiError::bad_request(
                "invalid_value",
                format!("`messages[{i}].role` = `{}`: must be user or assistant", m.role),
            ));
        }
        let read = match m.content {
            ContentIn::Text(t) => Blocks { parts: vec![Part::Text(t)], ..Blocks::default() },
            ContentIn::Blocks(blocks) => read_blocks(blocks, &format!("messages[{i}].content"))?,
        };
        // Results come back as the template's tool turns, before the rest of the user's turn.
        for result in read.results {
            messages.push(ChatMessage::text("tool", result));
        }
        if !read.parts.is_empty() || !read.calls.is_empty() {
            messages.push(ChatMessage { role: m.role, parts: read.parts, tool_calls: read.calls });
        }
    }
    let tools = tool_use(b.tools, b.tool_choice)?;
    let stop = stops(b.stop_sequences.unwrap_or_default(), "stop_sequences")?;
    let request = Request {
        model,
        input: Input::Chat(messages),
        sampling: SamplingOverrides {
            temperature: b.temperature,
            top_p: b.top_p,
            top_k: b.top_k.map(count),
            ..Default::default()
        },
        max_tokens: Some(count(b.max_tokens)),
        stop,
        mtp: Default::default(),
        enable_thinking: None,
        ignore_eos: false,
        grammar: None,
        tools,
        logprobs: None,
    };
    Ok((request, b.stream.unwrap_or(false)))
}

/// A call as a `tool_use` content block (`input` filled in).
fn tool_block(message_id: &str, i: usize, call: &ToolCall) -> Value {
    let id = format!("toolu_{}_{i}", message_id.trim_start_matches("msg_"));
    json!({"type": "tool_use", "id": id, "name": call.name, "input": call.arguments})
}

/// Anthropic's usage: `input_tokens` counts the prompt tokens prefilled, `cache_read_input_tokens`
/// those restored from the prefix cache (their sum is the prompt); Tandem writes no cache on request,
/// so `cache_creation_input_tokens` is 0.
fn usage(s: &crate::generate::Stats) -> Value {
    json!({
        "input_tokens": s.prompt_tokens.saturating_sub(s.cached_tokens),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": s.cached_tokens,
        "output_tokens": s.completion_tokens,
    })
}

fn stop_reason(c: &Completion) -> (&'static str, Value) {
    match (&c.finish, &c.stop) {
        (_, Some(s)) => ("stop_sequence", json!(s)),
        (FinishReason::Length, None) => ("max_tokens", Value::Null),
        _ => ("end_turn", Value::Null),
    }
}

/// Where a streamed answer's content blocks stand.
struct Streamed {
    /// The newest block's index.
    index: usize,
    /// The newest block is text and open.
    text_open: bool,
    /// Calls sent so far.
    made: usize,
}

type Events = tokio::sync::mpsc::UnboundedSender<SseEvent>;

impl Streamed {
    /// Sends text into the open text block (opening one after a call); false when the client left.
    fn text(&mut self, tx: &Events, text: &str) -> bool {
        if text.is_empty() {
            return true;
        }
        if !self.text_open {
            self.index += 1;
            self.text_open = true;
            let start = json!({"type": "content_block_start", "index": self.index, "content_block": {"type": "text", "text": ""}});
            let _ = tx.send(sse("content_block_start", start));
        }
        let delta =
            json!({"type": "content_block_delta", "index": self.index, "delta": {"type": "text_delta", "text": text}});
        tx.send(sse("content_block_delta", delta)).is_ok()
    }

    /// Sends each call as a tool_use block, closing the open text block first.
    fn calls(&mut self, tx: &Events, message_id: &str, calls: &[ToolCall]) -> bool {
        for call in calls {
            if self.text_open {
                let _ = tx.send(sse("content_block_stop", json!({"type": "content_block_stop", "index": self.index})));
                self.text_open = false;
            }
            self.index += 1;
            let mut block = tool_block(message_id, self.made, call);
            let input = block["input"].take();
            block["input"] = json!({});
            let start = json!({"type": "content_block_start", "index": self.index, "content_block": block});
            let delta = json!({"type": "content_block_delta", "index": self.index,
                "delta": {"type": "input_json_delta", "partial_json": input.to_string()}});
            let stop = json!({"type": "content_block_stop", "index": self.index});
            self.made += 1;
            let sent = tx.send(sse("content_block_start", start)).is_ok()
                && tx.send(sse("content_block_delta", delta)).is_ok()
                && tx.send(sse("content_block_stop", stop)).is_ok();
            if !sent {
                return false;
            }
        }
        true
    }
}

fn sse(name: &str, value: Value) -> SseEvent {
    SseEvent::default().event(name).data(value.to_string())
}

pub async fn messages(State(state): State<Arc<AppState>>, bytes: Bytes) -> Result<Response, AnthropicError> {
    let (request, stream) = parse(parse_json(&bytes)?, &state)?;
    let reads_calls = request.tools.is_some();
    let mut g = state.engine.chat(request).await?;
    let id = format!("msg_{:x}{:08x}", state.started_unix, g.id);
    let model = g.model.clone();
    let prompt_tokens = g.prompt_tokens;
    if !stream {
        let c = g.collect().await?;
        if c.finish == FinishReason::Cancelled {
            return Err(cancelled().into());
        }
        let (text, calls) = if reads_calls { tools::parse(&c.text) } else { (c.text.clone(), Vec::new()) };
        let (reason, sequence) = if calls.is_empty() { stop_reason(&c) } else { ("tool_use", Value::Null) };
        let mut content = Vec::new();
        if !text.is_empty() || calls.is_empty() {
            content.push(json!({"type": "text", "text": text}));
        }
        content.extend(calls.iter().enumerate().map(|(i, call)| tool_block(&id, i, call)));
        return Ok(Json(json!({
            "id": id, "type": "message", "role": "assistant", "model": model,
            "content": content,
            "stop_reason": reason, "stop_sequence": sequence,
            "usage": usage(&c.stats),
            "stats": c.stats,
        }))
        .into_response());
    }
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<SseEvent>();
    tokio::spawn(async move {
        let start = json!({"type": "message_start", "message": {
            "id": id, "type": "message", "role": "assistant", "model": model, "content": [],
            "stop_reason": null, "stop_sequence": null, "usage": {"input_tokens": prompt_tokens, "output_tokens": 0}}});
        let _ = tx.send(sse("message_start", start));
        let block = json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}});
        let _ = tx.send(sse("content_block_start", block));
        let _ = tx.send(sse("ping", json!({"type": "ping"})));
        // Blocks by index: the text block 0 open from the start; each call its own tool_use block as
        // its `<tool_call>` closes (start, the whole input as one input_json_delta, stop); text after
        // a call opens a new text block.
        let mut calls = reads_calls.then(CallStream::default);
        let mut blocks = Streamed { index: 0, text_open: true, made: 0 };
        while let Some(event) = g.events.recv().await {
            match event {
                Event::Started => {}
                Event::Delta { text, .. } if text.is_empty() => {}
                Event::Delta { text, .. } => {
                    let (text, new) = match calls.as_mut() {
                        None => (text, Vec::new()),
                        Some(calls) => {
                            let (text, first) = calls.feed(&text);
                            (text, calls.calls[first..].to_vec())
                        }
                    };
                    if !blocks.text(&tx, &text) || !blocks.calls(&tx, &id, &new) {
                        return;
                    }
                }
                Event::Done(c) if c.finish != FinishReason::Cancelled => {
                    let rest = calls.as_mut().map(CallStream::finish).unwrap_or_default();
                    blocks.text(&tx, &rest);
                    let (reason, sequence) = if blocks.made > 0 { ("tool_use", Value::Null) } else { stop_reason(&c) };
                    if blocks.text_open {
                        let stop = json!({"type": "content_block_stop", "index": blocks.index});
                        let _ = tx.send(sse("content_block_stop", stop));
                    }
                    let delta = json!({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
                        "usage": usage(&c.stats), "stats": c.stats});
                    let _ = tx.send(sse("message_delta", delta));
                    let _ = tx.send(sse("message_stop", json!({"type": "message_stop"})));
                    return;
                }
                Event::Done(_) => {
                    let e =
                        json!({"type": "error", "error": {"type": "overloaded_error", "message": cancelled().message}});
                    let _ = tx.send(sse("error", e));
                    return;
                }
                Event::Failed(e) => {
                    let e =
                        json!({"type": "error", "error": {"type": "api_error", "message": ApiError::from(e).message}});
                    let _ = tx.send(sse("error", e));
                    return;
                }
            }
        }
    });
    let events = tokio_stream::wrappers::UnboundedReceiverStream::new(rx)
        .map(Ok::<_, Infallible>)
        .take_until(state.shutdown_signal());
    Ok(Sse::new(events).keep_alive(KeepAlive::default()).into_response())
}
