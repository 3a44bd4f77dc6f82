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
    #[serde(flatten)]
    other: Map<String, Value>,
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

fn parts(blocks: Vec<Block>, at: &str) -> Result<Vec<Part>, ApiError> {
    let mut out = Vec::new();
    for (j, b) in blocks.into_iter().enumerate() {
        let here = format!("{at}[{j}]");
        // `cache_control` asks for a prompt cache Anthropic keeps; asking changes no answer.
        unsupported(&b.other, &format!("{here}."), &["cache_control"])?;
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
                    format!("`{here}.type` = `{kind}`: only text and image blocks are supported"),
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
        let parts = match m.content {
            ContentIn::Text(t) => vec![Part::Text(t)],
            ContentIn::Blocks(blocks) => parts(blocks, &format!("messages[{i}].content"))?,
        };
        messages.push(ChatMessage { role: m.role, parts, tool_calls: Vec::new() });
    }
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
        tools: None,
    };
    Ok((request, b.stream.unwrap_or(false)))
}

fn stop_reason(c: &Completion) -> (&'static str, Value) {
    match (&c.finish, &c.stop) {
        (_, Some(s)) => ("stop_sequence", json!(s)),
        (FinishReason::Length, None) => ("max_tokens", Value::Null),
        _ => ("end_turn", Value::Null),
    }
}

fn sse(name: &str, value: Value) -> SseEvent {
    SseEvent::default().event(name).data(value.to_string())
}

pub async fn messages(State(state): State<Arc<AppState>>, bytes: Bytes) -> Result<Response, AnthropicError> {
    let (request, stream) = parse(parse_json(&bytes)?, &state)?;
    let mut g = state.engine.chat(request).await?;
    let id = format!("msg_{:x}{:08x}", state.started_unix, g.id);
    let model = g.model.clone();
    let prompt_tokens = g.prompt_tokens;
    if !stream {
        let c = g.collect().await?;
        if c.finish == FinishReason::Cancelled {
            return Err(cancelled().into());
        }
        let (reason, sequence) = stop_reason(&c);
        return Ok(Json(json!({
            "id": id, "type": "message", "role": "assistant", "model": model,
            "content": [{"type": "text", "text": c.text}],
            "stop_reason": reason, "stop_sequence": sequence,
            "usage": {"input_tokens": c.stats.prompt_tokens, "output_tokens": c.stats.completion_tokens},
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
        while let Some(event) = g.events.recv().await {
            match event {
                Event::Started => {}
                Event::Delta { text, .. } if text.is_empty() => {}
                Event::Delta { text, .. } => {
                    let delta = json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}});
                    if tx.send(sse("content_block_delta", delta)).is_err() {
                        return;
                    }
                }
                Event::Done(c) if c.finish != FinishReason::Cancelled => {
                    let (reason, sequence) = stop_reason(&c);
                    let _ = tx.send(sse("content_block_stop", json!({"type": "content_block_stop", "index": 0})));
                    let delta = json!({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
                        "usage": {"output_tokens": c.stats.completion_tokens}, "stats": c.stats});
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
