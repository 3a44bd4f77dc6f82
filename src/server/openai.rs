//! The OpenAI-compatible API: `GET /v1/models`, `GET /v1/models/{model}` and `POST /v1/chat/completions`,
//! streaming (SSE chunks as OpenAI writes them, ending with `data: [DONE]`) and not.

use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine as _;
use futures::{Stream, StreamExt};
use serde::de::Error as _;
use serde::Deserialize;
use serde::Serialize;
use ts_rs::TS;

use super::error::{ApiError, ApiJson};
use super::request::{count, image_kind, json_kind, model_or_default, one_choice, stops, unsupported, ResponseFormat};
use super::wire::{
    AssistantMessage, ChatCompletion, ChatCompletionChunk, ChoiceLogprobs, ChunkChoice, ChunkDelta, CompletionChoice,
    FunctionCallOut, OpenAiModel, OpenAiModelList, ToolCallOut, Usage,
};
use super::{security, AppState};
use crate::chat::tools::{self as calls, CallStream, Tool, ToolCall, ToolChoice, ToolUse};
use crate::engine::{
    ChatMessage, Completion, EngineError, Event, Generation, Image, Input, MtpOverrides, Part, Request,
    SamplingOverrides,
};
use crate::generate::FinishReason;

pub async fn list_models(State(state): State<Arc<AppState>>) -> Result<Json<OpenAiModelList>, ApiError> {
    let registry = state.engine.registry();
    let created = state.started_unix;
    // The default model first: clients (the UI among them) pick the first one.
    let default = registry.default_model().ok().map(|m| m.name);
    let mut models = registry.list();
    models.sort_by_key(|m| Some(&m.name) != default.as_ref());
    let data = models.into_iter().map(|m| openai_model(m.name, created)).collect();
    Ok(Json(OpenAiModelList { object: "list".into(), data }))
}

/// `GET /v1/models/{model}`: OpenAI's "retrieve model" (`client.models.retrieve`). A name with a `/`
/// (`ORG/NAME`) may come percent-encoded, as the clients send it, or as it is.
pub async fn get_model(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<OpenAiModel>, ApiError> {
    let registry = state.engine.registry();
    match registry.get(&id) {
        Some(m) => Ok(Json(openai_model(m.name, state.started_unix))),
        None => {
            let known = registry.list().into_iter().map(|m| m.name).collect();
            Err(EngineError::UnknownModel { name: id, known }.into())
        }
    }
}

fn openai_model(id: String, created: u64) -> OpenAiModel {
    OpenAiModel { id, object: "model".into(), created, owned_by: "tandem".into() }
}

/// `POST /v1/chat/completions` (OpenAI's fields that Tandem reads, and its extensions).
#[derive(Debug, Deserialize, TS)]
#[ts(rename = "ChatCompletionRequest", optional_fields)]
pub struct ChatRequest {
    /// Empty or absent: the default model.
    #[serde(default)]
    #[ts(optional, as = "Option<String>")]
    model: String,
    messages: Vec<InMessage>,
    #[serde(default)]
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    max_tokens: Option<u64>,
    max_completion_tokens: Option<u64>,
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
    /// Tandem's extension: `{"enabled": bool, "depth": k}` overrides the model's MTP settings.
    mtp: Option<MtpIn>,
    /// Passed to the chat template (Qwen3 reads `enable_thinking`), as vLLM accepts it.
    chat_template_kwargs: Option<TemplateKwargs>,
    enable_thinking: Option<bool>,
    /// vLLM's extension: generate up to max_tokens even past end-of-sequence.
    ignore_eos: Option<bool>,
    /// Functions the model may call.
    tools: Option<Vec<ToolIn>>,
    tool_choice: Option<ToolChoiceIn>,
    /// Each token's log-probability, and `top_logprobs` alternatives.
    logprobs: Option<bool>,
    top_logprobs: Option<u64>,
    /// Several calls in one answer are always allowed.
    parallel_tool_calls: Option<bool>,
    /// Every other field: refused by name unless it asks for nothing (see [`unsupported`]).
    #[serde(flatten)]
    #[ts(skip)]
    other: serde_json::Map<String, serde_json::Value>,
}

#[derive(Debug, Deserialize, TS)]
#[ts(optional_fields)]
pub(super) struct StreamOptions {
    pub(super) include_usage: Option<bool>,
}

/// A field it does not know is refused, never ignored: `{"dept": 2}` would otherwise run the model's depth.
#[derive(Debug, Deserialize, TS)]
#[serde(deny_unknown_fields)]
#[ts(optional_fields, rename = "RequestMtp")]
pub(super) struct MtpIn {
    pub(super) enabled: Option<bool>,
    pub(super) depth: Option<usize>,
}

/// Only `enable_thinking` reaches the template; any other key is refused rather than dropped.
#[derive(Debug, Deserialize, TS)]
#[serde(deny_unknown_fields)]
#[ts(optional_fields, rename = "ChatTemplateKwargs")]
struct TemplateKwargs {
    enable_thinking: Option<bool>,
}

// A string or a list of strings (read by [`StopIn::deserialize`]).
#[derive(Debug, TS)]
#[ts(untagged, rename = "Stop")]
pub(super) enum StopIn {
    One(String),
    Many(Vec<String>),
}

impl<'de> Deserialize<'de> for StopIn {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match serde_json::Value::deserialize(d)? {
            serde_json::Value::String(s) => Ok(StopIn::One(s)),
            serde_json::Value::Array(v) => Ok(StopIn::Many(strings(v)?)),
            other => {
                Err(D::Error::custom(format!("expected a string or a list of strings, not {}", json_kind(&other))))
            }
        }
    }
}

/// Each item a string, or an error naming the first that is not.
pub(super) fn strings<E: serde::de::Error>(v: Vec<serde_json::Value>) -> Result<Vec<String>, E> {
    v.into_iter()
        .enumerate()
        .map(|(i, s)| match s {
            serde_json::Value::String(s) => Ok(s),
            other => Err(E::custom(format!("item {i} is {}, not a string", json_kind(&other)))),
        })
        .collect()
}

impl StopIn {
    /// The stop sequences, checked ([`stops`]).
    pub(super) fn list(stop: Option<StopIn>) -> Result<Vec<String>, ApiError> {
        let stop = match stop {
            None => Vec::new(),
            Some(StopIn::One(s)) => vec![s],
            Some(StopIn::Many(v)) => v,
        };
        stops(stop, "stop")
    }
}

#[derive(Debug, Deserialize, TS)]
#[ts(rename = "RequestTool")]
struct ToolIn {
    /// "function"
    #[serde(rename = "type")]
    kind: String,
    function: FunctionIn,
}

#[derive(Debug, Deserialize, TS)]
#[ts(optional_fields, rename = "RequestFunction")]
struct FunctionIn {
    #[ts(optional = false)]
    name: String,
    description: Option<String>,
    #[ts(type = "unknown")]
    parameters: Option<serde_json::Value>,
    strict: Option<bool>,
}

// A mode or a named function (read by [`ToolChoiceIn::deserialize`]).
#[derive(Debug, TS)]
#[ts(untagged, rename = "RequestToolChoice")]
enum ToolChoiceIn {
    /// none, auto or required.
    Mode(String),
    Named {
        function: NamedFunction,
    },
}

impl<'de> Deserialize<'de> for ToolChoiceIn {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Named {
            function: NamedFunction,
        }
        match serde_json::Value::deserialize(d)? {
            serde_json::Value::String(mode) => Ok(ToolChoiceIn::Mode(mode)),
            o @ serde_json::Value::Object(_) => serde_json::from_value::<Named>(o)
                .map(|n| ToolChoiceIn::Named { function: n.function })
                .map_err(|e| D::Error::custom(format!("a named function, `{{\"function\": {{\"name\": ...}}}}`: {e}"))),
            other => Err(D::Error::custom(format!(
                "expected none, auto, required or a named function, not {}",
                json_kind(&other)
            ))),
        }
    }
}

#[derive(Debug, Deserialize, TS)]
struct NamedFunction {
    name: String,
}

/// An earlier call, as a client sends the conversation back.
#[derive(Debug, Deserialize, TS)]
#[ts(rename = "RequestToolCall")]
struct ToolCallIn {
    #[serde(default)]
    #[ts(optional)]
    id: Option<String>,
    function: FunctionCallIn,
}

#[derive(Debug, Deserialize, TS)]
struct FunctionCallIn {
    name: String,
    /// The arguments object as JSON text.
    arguments: String,
}

/// OpenAI's limit on `top_logprobs`.
const MAX_TOP_LOGPROBS: u64 = 20;

/// `tools` and `tool_choice` as the engine takes them; None when no tool may be called.
fn tool_use(tools: Option<Vec<ToolIn>>, choice: Option<ToolChoiceIn>) -> Result<Option<ToolUse>, ApiError> {
    let bad = |m: String| ApiError::bad_request("invalid_value", m);
    let tools = tools.unwrap_or_default();
    let choice = match choice {
        None => ToolChoice::Auto,
        Some(ToolChoiceIn::Mode(m)) => match m.as_str() {
            "none" => return Ok(None),
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            other => return Err(bad(format!("`tool_choice` = `{other}`: must be none, auto, required or a function"))),
        },
        Some(ToolChoiceIn::Named { function }) => ToolChoice::Function(function.name),
    };
    if tools.is_empty() {
        return match choice {
            ToolChoice::Auto => Ok(None),
            _ => Err(bad("`tool_choice` asks for a call but `tools` is empty".into())),
        };
    }
    let tools = tools
        .into_iter()
        .enumerate()
        .map(|(i, t)| {
            if t.kind != "function" {
                return Err(bad(format!("`tools[{i}].type` = `{}`: only function tools exist", t.kind)));
            }
            let _ = t.function.strict;
            let parameters = t.function.parameters.unwrap_or_else(|| serde_json::json!({"type": "object"}));
            if !parameters.is_object() {
                return Err(bad(format!("`tools[{i}].function.parameters` is not a JSON schema object")));
            }
            Ok(Tool { name: t.function.name, description: t.function.description, parameters })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Some(ToolUse { tools, choice }))
}

#[derive(Debug, Deserialize, TS)]
#[ts(rename = "RequestMessage")]
struct InMessage {
    /// system, developer, user, assistant or tool.
    role: String,
    #[serde(default)]
    #[ts(optional)]
    content: Option<InContent>,
    /// An assistant turn's calls.
    #[serde(default)]
    #[ts(optional)]
    tool_calls: Option<Vec<ToolCallIn>>,
    /// Which call a tool message answers (the template has no place for it).
    #[serde(default)]
    #[ts(optional)]
    tool_call_id: Option<String>,
    /// Fields Tandem does not read (`tool_calls`, `name`, ...): refused by name unless empty.
    #[serde(flatten)]
    #[ts(skip)]
    other: serde_json::Map<String, serde_json::Value>,
}

// Text or a list of parts (read by [`InContent::deserialize`], whose errors name the part and what is
// wrong with it, where serde's untagged enums only say that nothing matched).
#[derive(Debug, TS)]
#[ts(untagged, rename = "RequestContent")]
enum InContent {
    Text(String),
    Parts(Vec<InPart>),
}

impl<'de> Deserialize<'de> for InContent {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match serde_json::Value::deserialize(d)? {
            serde_json::Value::String(text) => Ok(InContent::Text(text)),
            serde_json::Value::Array(parts) => parts
                .into_iter()
                .enumerate()
                .map(|(j, p)| match p {
                    p @ serde_json::Value::Object(_) => {
                        serde_json::from_value(p).map_err(|e| D::Error::custom(format!("part {j}: {e}")))
                    }
                    other => Err(D::Error::custom(format!(
                        "part {j} is {}, not an object such as {{\"type\": \"text\", \"text\": ...}}",
                        json_kind(&other)
                    ))),
                })
                .collect::<Result<_, _>>()
                .map(InContent::Parts),
            other => Err(D::Error::custom(format!("expected text or a list of parts, not {}", json_kind(&other)))),
        }
    }
}

#[derive(Debug, Deserialize, TS)]
#[serde(tag = "type", rename_all = "snake_case")]
#[ts(rename = "ContentPart")]
enum InPart {
    Text { text: String },
    ImageUrl { image_url: ImageUrlIn },
}

// `{"url": ...}` (other keys, such as `detail`, change nothing) or the URL itself.
#[derive(Debug, TS)]
#[ts(untagged, rename = "ImageUrl")]
enum ImageUrlIn {
    Object { url: String },
    Url(String),
}

impl<'de> Deserialize<'de> for ImageUrlIn {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde_json::Value;
        match Value::deserialize(d)? {
            Value::String(url) => Ok(ImageUrlIn::Url(url)),
            Value::Object(mut o) => match o.remove("url") {
                Some(Value::String(url)) => Ok(ImageUrlIn::Object { url }),
                Some(other) => Err(D::Error::custom(format!("`image_url.url` is {}, not a string", json_kind(&other)))),
                None => Err(D::Error::custom("`image_url` has no `url`")),
            },
            other => {
                Err(D::Error::custom(format!("`image_url` is {}, not a URL or {{\"url\": ...}}", json_kind(&other))))
            }
        }
    }
}

/// What the handler needs besides the engine request.
struct Parsed {
    request: Request,
    stream: bool,
    include_usage: bool,
    /// The answer is read for tool calls.
    tools: bool,
    logprobs: bool,
}

fn parse(req: ChatRequest, state: &AppState) -> Result<Parsed, ApiError> {
    // OpenAI's end-user identifier changes nothing about the answer.
    unsupported(&req.other, "", &["user"])?;
    for (i, m) in req.messages.iter().enumerate() {
        // `name` tells participants apart; Qwen's templates have no place for it.
        unsupported(&m.other, &format!("messages[{i}]."), &["name"])?;
    }
    let _ = req.parallel_tool_calls;
    let logprobs = match (req.logprobs.unwrap_or(false), req.top_logprobs) {
        (_, Some(n)) if n > MAX_TOP_LOGPROBS => {
            return Err(ApiError::bad_request(
                "invalid_value",
                format!("`top_logprobs` = {n}: at most {MAX_TOP_LOGPROBS}"),
            ))
        }
        (true, n) => Some(n.map_or(0, count)),
        (false, Some(n)) if n > 0 => {
            return Err(ApiError::bad_request("invalid_value", "`top_logprobs` needs `logprobs: true`"))
        }
        (false, _) => None,
    };
    let tools = tool_use(req.tools, req.tool_choice)?;
    if req.response_format.is_some() && tools.as_ref().is_some_and(|t| t.choice != ToolChoice::Auto) {
        return Err(ApiError::bad_request(
            "invalid_value",
            "`response_format` and a `tool_choice` that forces a call cannot both constrain the answer",
        ));
    }
    one_choice(req.n)?;
    let model = model_or_default(state, req.model)?;
    let mut messages = Vec::with_capacity(req.messages.len());
    // Images are numbered across the conversation, as the engine names them in its errors.
    let mut images = 0;
    let mut image_roots = None;
    for (i, m) in req.messages.into_iter().enumerate() {
        let role = match m.role.as_str() {
            "system" | "developer" => "system",
            "user" => "user",
            "assistant" => "assistant",
            "tool" => "tool",
            other => {
                return Err(ApiError::bad_request(
                    "invalid_value",
                    format!("`messages[{i}].role` = `{other}`: must be system, developer, user, assistant or tool"),
                ))
            }
        };
        let parts = match m.content {
            None => Vec::new(),
            Some(InContent::Text(text)) => vec![Part::Text(text)],
            Some(InContent::Parts(parts)) => parts
                .into_iter()
                .enumerate()
                .map(|(j, p)| match p {
                    InPart::Text { text } => Ok(Part::Text(text)),
                    InPart::ImageUrl { image_url } => {
                        let url = match image_url {
                            ImageUrlIn::Object { url } | ImageUrlIn::Url(url) => url,
                        };
                        images += 1;
                        read_image(&url, state, &mut image_roots).map(Part::Image).map_err(|e| ApiError {
                            message: format!("image #{images} (`messages[{i}].content[{j}].image_url`): {}", e.message),
                            ..e
                        })
                    }
                })
                .collect::<Result<_, _>>()?,
        };
        let _ = m.tool_call_id;
        let tool_calls = m
            .tool_calls
            .unwrap_or_default()
            .into_iter()
            .enumerate()
            .map(|(j, c)| {
                let _ = c.id;
                match serde_json::from_str::<serde_json::Value>(&c.function.arguments) {
                    Ok(arguments @ serde_json::Value::Object(_)) => Ok(ToolCall { name: c.function.name, arguments }),
                    _ => Err(ApiError::bad_request(
                        "invalid_value",
                        format!("`messages[{i}].tool_calls[{j}].function.arguments` is not a JSON object"),
                    )),
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        messages.push(ChatMessage { role: role.to_owned(), parts, tool_calls });
    }
    if messages.is_empty() {
        return Err(ApiError::bad_request("invalid_value", "`messages` is empty"));
    }
    let stop = StopIn::list(req.stop)?;
    let max_tokens = req.max_completion_tokens.or(req.max_tokens).map(count);
    let thinking = req.chat_template_kwargs.and_then(|k| k.enable_thinking).or(req.enable_thinking);
    let mtp = req.mtp.map(|m| MtpOverrides { enabled: m.enabled, depth: m.depth, adaptive: None }).unwrap_or_default();
    let request = Request {
        model,
        input: Input::Chat(messages),
        sampling: SamplingOverrides {
            temperature: req.temperature,
            top_p: req.top_p,
            top_k: req.top_k.map(count),
            min_p: req.min_p,
            repetition_penalty: req.repetition_penalty,
            presence_penalty: req.presence_penalty,
            frequency_penalty: req.frequency_penalty,
            // OpenAI's seed is a signed integer; every value names a distinct stream.
            seed: req.seed.map(|s| s as u64),
        },
        max_tokens,
        stop,
        mtp,
        enable_thinking: thinking,
        ignore_eos: req.ignore_eos.unwrap_or(false),
        grammar: ResponseFormat::grammar(req.response_format)?,
        tools,
        logprobs,
    };
    let stream = req.stream.unwrap_or(false);
    let include_usage = stream && req.stream_options.and_then(|o| o.include_usage).unwrap_or(false);
    let tools = request.tools.is_some();
    let logprobs = request.logprobs.is_some();
    Ok(Parsed { request, stream, include_usage, tools, logprobs })
}

/// An image from a `data:` URL, or (for a server on loopback) a local `file:` URL inside the
/// folders images may come from (`roots`, computed on the first file URL).
fn read_image(url: &str, state: &AppState, roots: &mut Option<Vec<PathBuf>>) -> Result<Image, ApiError> {
    let bad = |message: String| ApiError::bad_request("invalid_image", message);
    let (bytes, media_type) = if let Some(rest) = url.strip_prefix("data:") {
        let (meta, data) =
            rest.split_once(',').ok_or_else(|| bad("a data URL needs a comma before its data".into()))?;
        let Some(media_type) = meta.strip_suffix(";base64") else {
            return Err(bad("only base64 data URLs (`data:image/png;base64,...`) are accepted".into()));
        };
        let data: String = data.chars().filter(|c| !c.is_ascii_whitespace()).collect();
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(data.as_bytes())
            .map_err(|e| bad(format!("the data URL is not valid base64: {e}")))?;
        (bytes, (!media_type.is_empty()).then(|| media_type.to_owned()))
    } else if url.starts_with("file:") {
        if !state.policy.loopback_only() {
            return Err(ApiError::forbidden(
                "path_forbidden",
                "file URLs are only read by a server bound to loopback; send the image as a data URL",
            ));
        }
        let path = url::Url::parse(url)
            .ok()
            .and_then(|u| u.to_file_path().ok())
            .ok_or_else(|| bad(format!("`{url}` is not a valid file URL")))?;
        let roots = roots.get_or_insert_with(|| security::image_roots(&state.engine.registry(), &state.image_dirs));
        let path = security::image_file(&path, roots)?;
        let meta = std::fs::metadata(&path).map_err(|e| bad(format!("{}: {e}", path.display())))?;
        if !meta.is_file() {
            return Err(bad(format!("{}: not a file", path.display())));
        }
        if meta.len() > state.max_body_bytes as u64 {
            return Err(bad(format!(
                "{}: {} bytes is more than the {} accepted",
                path.display(),
                meta.len(),
                state.max_body_bytes
            )));
        }
        let bytes = std::fs::read(&path).map_err(|e| bad(format!("{}: {e}", path.display())))?;
        (bytes, None)
    } else if url.starts_with("http://") || url.starts_with("https://") {
        return Err(bad("remote image URLs are not fetched; send the image as a data URL".into()));
    } else {
        return Err(bad("expected a `data:` or `file:` URL".into()));
    };
    let kind = image_kind(&bytes).ok_or_else(|| bad("not a PNG, JPEG, GIF or WebP image".into()))?;
    Ok(Image { bytes, media_type: media_type.or_else(|| Some(kind.to_owned())) })
}

pub async fn chat_completions(
    State(state): State<Arc<AppState>>,
    ApiJson(body): ApiJson<ChatRequest>,
) -> Result<Response, ApiError> {
    let parsed = {
        let state = state.clone();
        // Reading a file URL is blocking I/O.
        tokio::task::spawn_blocking(move || parse(body, &state))
            .await
            .map_err(|e| ApiError::internal(format!("request parsing failed: {e}")))??
    };
    let generation = state.engine.chat(parsed.request).await?;
    let meta = ChunkMeta {
        id: format!("chatcmpl-{:x}{:08x}", state.started_unix, generation.id),
        created: now_unix(),
        model: generation.model.clone(),
    };
    if parsed.stream {
        let calls = parsed.tools.then(CallStream::default);
        let stream = chunks(generation, meta, parsed.include_usage, calls).take_until(state.shutdown_signal());
        Ok(Sse::new(stream).keep_alive(KeepAlive::default()).into_response())
    } else {
        let completion = generation.collect().await?;
        if completion.finish == FinishReason::Cancelled {
            return Err(cancelled());
        }
        let (content, made) =
            if parsed.tools { calls::parse(&completion.text) } else { (completion.text.clone(), Vec::new()) };
        let tool_calls = tool_calls_out(&meta.id, &made, false);
        let finish = if made.is_empty() { finish_reason(completion.finish) } else { "tool_calls" };
        let body = ChatCompletion {
            id: meta.id,
            object: "chat.completion".into(),
            created: meta.created,
            model: meta.model,
            system_fingerprint: (),
            choices: vec![CompletionChoice {
                index: 0,
                message: AssistantMessage { role: "assistant".into(), content, refusal: (), tool_calls },
                logprobs: parsed.logprobs.then(|| ChoiceLogprobs::of(&completion.logprobs)),
                finish_reason: finish,
            }],
            usage: Usage::of(&completion.stats),
            stats: completion.stats,
        };
        Ok(Json(body).into_response())
    }
}

/// Calls in OpenAI's shape, ids unique within the answer (`index` set in a stream).
fn tool_calls_out(answer_id: &str, made: &[ToolCall], streamed: bool) -> Vec<ToolCallOut> {
    made.iter()
        .enumerate()
        .map(|(i, c)| ToolCallOut {
            index: streamed.then_some(i as u32),
            id: format!("call_{}_{i}", answer_id.trim_start_matches("chatcmpl-")),
            kind: "function".into(),
            function: FunctionCallOut { name: c.name.clone(), arguments: c.arguments.to_string() },
        })
        .collect()
}

pub(super) fn cancelled() -> ApiError {
    ApiError::new(
        axum::http::StatusCode::SERVICE_UNAVAILABLE,
        "server_error",
        "cancelled",
        "the generation was stopped by the server (model unloaded or server stopping)",
    )
}

pub(super) fn now_unix() -> u64 {
    crate::engine::live::unix_ms() / 1000
}

pub(super) fn finish_reason(finish: FinishReason) -> &'static str {
    match finish {
        FinishReason::Length => "length",
        FinishReason::Stop | FinishReason::Cancelled => "stop",
    }
}

struct ChunkMeta {
    id: String,
    created: u64,
    model: String,
}

impl ChunkMeta {
    /// A chunk; `usage: null` on each when the client asked for a usage chunk at the end.
    fn chunk(&self, choices: Vec<ChunkChoice>, include_usage: bool) -> ChatCompletionChunk {
        ChatCompletionChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk".into(),
            created: self.created,
            model: self.model.clone(),
            system_fingerprint: (),
            choices,
            usage: include_usage.then_some(None),
            stats: None,
        }
    }

    fn delta(&self, delta: ChunkDelta, finish: Option<&'static str>, include_usage: bool) -> ChatCompletionChunk {
        self.chunk(vec![ChunkChoice { index: 0, delta, logprobs: None, finish_reason: finish }], include_usage)
    }
}

pub(super) fn data(value: &impl Serialize) -> SseEvent {
    SseEvent::default().data(serde_json::to_string(value).unwrap_or_else(|_| "{}".into()))
}

/// The event stream of one generation: a first chunk with the role, one chunk per text delta, a
/// last chunk with the finish reason (and Tandem's `stats`), the usage chunk when asked for, then
/// `[DONE]`. Errors after the start are sent as `{"error": ...}` before `[DONE]`.
fn chunks(
    generation: Generation,
    meta: ChunkMeta,
    include_usage: bool,
    calls: Option<CallStream>,
) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    struct St {
        generation: Generation,
        meta: ChunkMeta,
        include_usage: bool,
        started: bool,
        done: bool,
        /// Set when the answer is read for tool calls.
        calls: Option<CallStream>,
    }
    let st = St { generation, meta, include_usage, started: false, done: false, calls };
    futures::stream::unfold(st, |mut st| async move {
        if st.done {
            return None;
        }
        if !st.started {
            st.started = true;
            let role = ChunkDelta { role: Some("assistant".into()), content: Some(String::new()), tool_calls: None };
            let first = st.meta.delta(role, None, st.include_usage);
            return Some((vec![data(&first)], st));
        }
        loop {
            let events = match st.generation.events.recv().await {
                Some(Event::Started) => continue,
                Some(Event::Delta { text, logprobs, .. }) if text.is_empty() && logprobs.is_empty() => continue,
                Some(Event::Delta { text, stats, logprobs, .. }) => {
                    let mut events = Vec::new();
                    let text = match st.calls.as_mut() {
                        Some(calls) => {
                            let (text, first) = calls.feed(&text);
                            if calls.calls.len() > first {
                                events.extend(call_chunks(&st.meta, &calls.calls, first, st.include_usage));
                            }
                            text
                        }
                        None => text,
                    };
                    if !text.is_empty() || stats.is_some() || !logprobs.is_empty() {
                        let content = ChunkDelta { content: Some(text), ..ChunkDelta::default() };
                        let mut chunk = st.meta.delta(content, None, st.include_usage);
                        if !logprobs.is_empty() {
                            chunk.choices[0].logprobs = Some(ChoiceLogprobs::of(&logprobs));
                        }
                        // Tandem's extension: running statistics a few times a second.
                        chunk.stats = stats;
                        events.insert(0, data(&chunk));
                    }
                    if events.is_empty() {
                        continue;
                    }
                    events
                }
                Some(Event::Done(completion)) => {
                    st.done = true;
                    let mut events = Vec::new();
                    let mut called = false;
                    if let Some(calls) = st.calls.as_mut() {
                        let rest = calls.finish();
                        if !rest.is_empty() {
                            let content = ChunkDelta { content: Some(rest), ..ChunkDelta::default() };
                            events.push(data(&st.meta.delta(content, None, st.include_usage)));
                        }
                        called = !calls.calls.is_empty();
                    }
                    events.extend(finish_events(&st.meta, &completion, st.include_usage, called));
                    events
                }
                Some(Event::Failed(e)) => {
                    st.done = true;
                    vec![data(&ApiError::from(e).body()), SseEvent::default().data("[DONE]")]
                }
                None => {
                    st.done = true;
                    let e = ApiError::internal("the model's worker stopped without finishing the answer");
                    vec![data(&e.body()), SseEvent::default().data("[DONE]")]
                }
            };
            return Some((events, st));
        }
    })
    .flat_map(|events| futures::stream::iter(events.into_iter().map(Ok)))
}

/// The chunks of the calls from `from` on: each call whole (id, name and all its arguments) in one
/// delta, as soon as its block closes.
fn call_chunks(meta: &ChunkMeta, made: &[ToolCall], from: usize, include_usage: bool) -> Vec<SseEvent> {
    tool_calls_out(&meta.id, made, true)
        .into_iter()
        .skip(from)
        .map(|c| {
            data(&meta.delta(ChunkDelta { tool_calls: Some(vec![c]), ..ChunkDelta::default() }, None, include_usage))
        })
        .collect()
}

fn finish_events(meta: &ChunkMeta, completion: &Completion, include_usage: bool, called: bool) -> Vec<SseEvent> {
    if completion.finish == FinishReason::Cancelled {
        return vec![data(&cancelled().body()), SseEvent::default().data("[DONE]")];
    }
    let finish = if called { "tool_calls" } else { finish_reason(completion.finish) };
    let mut last = meta.delta(ChunkDelta::default(), Some(finish), include_usage);
    last.stats = Some(completion.stats.clone());
    let mut events = vec![data(&last)];
    if include_usage {
        let mut chunk = meta.chunk(Vec::new(), false);
        chunk.usage = Some(Some(Usage::of(&completion.stats)));
        chunk.stats = Some(completion.stats.clone());
        events.push(data(&chunk));
    }
    events.push(SseEvent::default().data("[DONE]"));
    events
}
