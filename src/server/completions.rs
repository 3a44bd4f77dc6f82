//! `POST /v1/completions`: OpenAI's text completion of a raw prompt (no chat template), streamed as SSE
//! chunks ending with `data: [DONE]` or not, with `usage` and Tandem's `stats` as on chat completions.

use std::convert::Infallible;
use std::sync::Arc;

use axum::extract::State;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::{Stream, StreamExt};
use serde::Deserialize;
use ts_rs::TS;

use super::error::{ApiError, ApiJson};
use super::openai::{cancelled, data, finish_reason, now_unix, strings, MtpIn, StopIn, StreamOptions};
use super::request::{count, json_kind, model_or_default, one_choice, unsupported, ResponseFormat};
use super::wire::{FinishReasonName, TextChoice, TextCompletion, TextLogprobs, Usage};
use super::AppState;
use crate::engine::{Completion, Event, Generation, Input, MtpOverrides, Request, SamplingOverrides};
use crate::generate::{FinishReason, Stats};

/// The completions API's limit on `logprobs`.
const MAX_LOGPROBS: u64 = 5;

/// OpenAI's default `max_tokens` for completions.
const DEFAULT_MAX_TOKENS: usize = 16;

/// `POST /v1/completions`
#[derive(Debug, Deserialize, TS)]
#[ts(rename = "CompletionRequest", optional_fields)]
pub struct CompletionRequest {
    /// Empty or absent: the default model.
    #[serde(default)]
    #[ts(optional, as = "Option<String>")]
    model: String,
    /// The text to continue (one; a list of one is accepted).
    #[ts(optional = false)]
    prompt: PromptIn,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    /// Default 16, as OpenAI's.
    max_tokens: Option<u64>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<u64>,
    min_p: Option<f32>,
    repetition_penalty: Option<f32>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    seed: Option<i64>,
    /// Free text (the default), any JSON object, or JSON matching a schema: constrained decoding.
    response_format: Option<ResponseFormat>,
    stop: Option<StopIn>,
    n: Option<u64>,
    /// Each token's log-probability and this many alternatives (at most 5).
    logprobs: Option<u64>,
    /// Tandem's extension, as on chat completions.
    mtp: Option<MtpIn>,
    ignore_eos: Option<bool>,
    /// Every other field (`echo`, `suffix`, `logprobs`, `best_of`, penalties...): refused by name unless off.
    #[serde(flatten)]
    #[ts(skip)]
    other: serde_json::Map<String, serde_json::Value>,
}

// Text, or a list of texts (read by [`PromptIn::deserialize`]).
#[derive(Debug, TS)]
#[ts(untagged, rename = "CompletionPrompt")]
enum PromptIn {
    One(String),
    Many(Vec<String>),
}

impl<'de> Deserialize<'de> for PromptIn {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error as _;
        use serde_json::Value;
        match Value::deserialize(d)? {
            Value::String(p) => Ok(PromptIn::One(p)),
            Value::Array(v) if v.first().is_some_and(|t| t.is_number() || t.is_array()) => {
                Err(D::Error::custom("token ids are not taken: send the prompt as text"))
            }
            Value::Array(v) => Ok(PromptIn::Many(strings(v)?)),
            other => Err(D::Error::custom(format!("expected text, not {}", json_kind(&other)))),
        }
    }
}

struct Parsed {
    request: Request,
    stream: bool,
    include_usage: bool,
    logprobs: bool,
}

fn parse(mut req: CompletionRequest, state: &AppState) -> Result<Parsed, ApiError> {
    // `best_of: 1` is OpenAI's default, one candidate that is the answer itself: clients that write out
    // their defaults send it, as they send `n: 1`. More candidates are refused by name below.
    if req.other.get("best_of").and_then(serde_json::Value::as_u64) == Some(1) {
        req.other.remove("best_of");
    }
    unsupported(&req.other, "", &["user"])?;
    one_choice(req.n)?;
    let prompt = match req.prompt {
        PromptIn::One(p) => p,
        PromptIn::Many(mut v) if v.len() == 1 => v.remove(0),
        PromptIn::Many(v) => {
            return Err(ApiError::bad_request(
                "invalid_value",
                format!("`prompt` has {} texts: one prompt per request is supported", v.len()),
            ))
        }
    };
    let model = model_or_default(state, req.model)?;
    let mtp = req.mtp.map(|m| MtpOverrides { enabled: m.enabled, depth: m.depth, adaptive: None }).unwrap_or_default();
    let request = Request {
        model,
        input: Input::Raw(prompt),
        sampling: SamplingOverrides {
            temperature: req.temperature,
            top_p: req.top_p,
            top_k: req.top_k.map(count),
            min_p: req.min_p,
            repetition_penalty: req.repetition_penalty,
            presence_penalty: req.presence_penalty,
            frequency_penalty: req.frequency_penalty,
            seed: req.seed.map(|s| s as u64),
        },
        max_tokens: Some(req.max_tokens.map_or(DEFAULT_MAX_TOKENS, count)),
        stop: StopIn::list(req.stop)?,
        mtp,
        enable_thinking: None,
        ignore_eos: req.ignore_eos.unwrap_or(false),
        grammar: ResponseFormat::grammar(req.response_format)?,
        tools: None,
        logprobs: match req.logprobs {
            Some(n) if n > MAX_LOGPROBS => {
                return Err(ApiError::bad_request("invalid_value", format!("`logprobs` = {n}: at most {MAX_LOGPROBS}")))
            }
            n => n.map(count),
        },
    };
    let stream = req.stream.unwrap_or(false);
    let include_usage = stream && req.stream_options.and_then(|o| o.include_usage).unwrap_or(false);
    let logprobs = request.logprobs.is_some();
    Ok(Parsed { request, stream, include_usage, logprobs })
}

struct Meta {
    id: String,
    created: u64,
    model: String,
}

impl Meta {
    fn body(&self, choices: Vec<TextChoice>, usage: Option<Option<Usage>>, stats: Option<Stats>) -> TextCompletion {
        TextCompletion {
            id: self.id.clone(),
            object: "text_completion".into(),
            created: self.created,
            model: self.model.clone(),
            system_fingerprint: (),
            choices,
            usage,
            stats,
        }
    }
}

fn choice(text: String, finish: Option<FinishReasonName>) -> Vec<TextChoice> {
    vec![TextChoice { index: 0, text, logprobs: None, finish_reason: finish }]
}

pub async fn completions(
    State(state): State<Arc<AppState>>,
    ApiJson(body): ApiJson<CompletionRequest>,
) -> Result<Response, ApiError> {
    let parsed = parse(body, &state)?;
    let generation = state.engine.chat(parsed.request).await?;
    let meta = Meta {
        id: format!("cmpl-{:x}{:08x}", state.started_unix, generation.id),
        created: now_unix(),
        model: generation.model.clone(),
    };
    if parsed.stream {
        let stream = chunks(generation, meta, parsed.include_usage).take_until(state.shutdown_signal());
        return Ok(Sse::new(stream).keep_alive(KeepAlive::default()).into_response());
    }
    let completion = generation.collect().await?;
    if completion.finish == FinishReason::Cancelled {
        return Err(cancelled());
    }
    let usage = Usage::of(&completion.stats);
    let mut choices = choice(completion.text, Some(finish_reason(completion.finish)));
    if parsed.logprobs {
        choices[0].logprobs = Some(TextLogprobs::of(&completion.logprobs, 0));
    }
    let body = meta.body(choices, Some(Some(usage)), Some(completion.stats));
    Ok(Json(body).into_response())
}

/// One chunk per text delta, a last one with the finish reason and the final `stats`, the usage chunk
/// when asked for, then `[DONE]`; an error after the start is sent as `{"error": ...}` before `[DONE]`.
fn chunks(generation: Generation, meta: Meta, include_usage: bool) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    let meta = Arc::new(meta);
    // The characters of the tokens so far: the next token's `text_offset`.
    futures::stream::unfold((generation, false, 0usize), move |(mut g, done, mut offset)| {
        let meta = meta.clone();
        async move {
            if done {
                return None;
            }
            loop {
                let events = match g.events.recv().await {
                    Some(Event::Started) => continue,
                    Some(Event::Delta { text, logprobs, .. }) if text.is_empty() && logprobs.is_empty() => continue,
                    Some(Event::Delta { text, stats, logprobs, .. }) => {
                        let mut choices = choice(text, None);
                        if !logprobs.is_empty() {
                            let l = TextLogprobs::of(&logprobs, offset);
                            offset += logprobs.iter().map(|l| l.token.text.chars().count()).sum::<usize>();
                            choices[0].logprobs = Some(l);
                        }
                        vec![data(&meta.body(choices, include_usage.then_some(None), stats))]
                    }
                    Some(Event::Done(c)) => return Some((end(&meta, &c, include_usage), (g, true, offset))),
                    Some(Event::Failed(e)) => vec![data(&ApiError::from(e).body()), SseEvent::default().data("[DONE]")],
                    None => {
                        let e = ApiError::internal("the model's worker stopped without finishing the answer");
                        vec![data(&e.body()), SseEvent::default().data("[DONE]")]
                    }
                };
                let finished = events.len() > 1;
                return Some((events, (g, finished, offset)));
            }
        }
    })
    .flat_map(|events| futures::stream::iter(events.into_iter().map(Ok)))
}

fn end(meta: &Meta, c: &Completion, include_usage: bool) -> Vec<SseEvent> {
    if c.finish == FinishReason::Cancelled {
        return vec![data(&cancelled().body()), SseEvent::default().data("[DONE]")];
    }
    let last = meta.body(
        choice(String::new(), Some(finish_reason(c.finish))),
        include_usage.then_some(None),
        Some(c.stats.clone()),
    );
    let mut events = vec![data(&last)];
    if include_usage {
        events.push(data(&meta.body(Vec::new(), Some(Some(Usage::of(&c.stats))), Some(c.stats.clone()))));
    }
    events.push(SseEvent::default().data("[DONE]"));
    events
}
