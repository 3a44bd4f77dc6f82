//! The HTTP-only bodies: envelopes around the engine's own types (which serialize directly: a model's
//! status, statistics, jobs, conversations) and the OpenAI-compatible shapes. Every body the server
//! writes is one of these types or an engine type; the UI's TypeScript types are generated from them
//! (`ui/src/generated/`, by the integration test `wire_types`), never written by hand.

use std::path::PathBuf;

use serde::Serialize;
use ts_rs::TS;

use crate::engine::{ConversationSummary, JobStatus, JobView, ModelStatus};
use crate::generate::Stats;

pub use super::completions::CompletionRequest;
pub use super::convert::ConvertRequest;
pub use super::downloads::{CatalogList, DownloadList, GraftRequest, HubSearch, PullRequest};
pub use super::folders::{AddModel, ChooseFolder, PickFolder};
pub use super::openai::ChatRequest;

/// Every error answer, and the `error` chunk of a stream that fails after it started.
#[derive(Debug, Clone, Serialize, TS)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, Serialize, TS)]
pub struct ErrorDetail {
    pub message: String,
    /// OpenAI's error `type`: invalid_request_error, authentication_error, permission_error,
    /// not_found_error, rate_limit_error, server_error.
    #[serde(rename = "type")]
    pub kind: String,
    /// What went wrong, for programs: `model_not_found`, `queue_full`, `invalid_value`...
    pub code: String,
}

/// `GET /api/health`
#[derive(Debug, Clone, Serialize, TS)]
pub struct Health {
    /// "ok"
    pub status: String,
    pub version: String,
    pub uptime_s: f64,
    pub models_loaded: Vec<String>,
    /// /v1 and /api (except this endpoint) need `Authorization: Bearer <key>`.
    pub api_key_required: bool,
    /// Where MLX computes: "metal", "cuda" or "cpu" (the UI says what that means for quantized
    /// models: on the CPU build they decode slower than bf16).
    pub backend: String,
}

/// `GET` and `PATCH /api/settings`
#[derive(Debug, Clone, Serialize, TS)]
pub struct SettingsView {
    pub settings: crate::registry::AppSettings,
    /// The saved `server` settings differ from those the server started with: they apply when it
    /// next starts.
    pub restart_needed: bool,
}

/// `GET /api/server`
#[derive(Debug, Clone, Serialize, TS)]
pub struct ServerInfo {
    /// Where clients reach it from this machine, e.g. `http://127.0.0.1:11435`.
    pub url: String,
    /// The address it is bound to, e.g. `0.0.0.0:11435`.
    pub listening: String,
    /// Bound beyond loopback: other machines may connect (with the API key).
    pub exposed: bool,
    pub api_key_required: bool,
    pub uptime_s: f64,
    /// API requests answered since it started.
    pub requests_served: u64,
    /// As in [`SettingsView`].
    pub restart_needed: bool,
}

pub use super::request_log::{LoggedRequest, RequestLog};

/// `GET /api/models`
#[derive(Debug, Clone, Serialize, TS)]
pub struct ModelList {
    pub models: Vec<ModelStatus>,
    /// The registry's default model.
    pub default: Option<String>,
    pub models_dir: PathBuf,
}

/// `GET /api/conversations`: newest first.
#[derive(Debug, Clone, Serialize, TS)]
pub struct ConversationList {
    pub conversations: Vec<ConversationSummary>,
}

/// `DELETE /api/conversations/{id}`
#[derive(Debug, Clone, Serialize, TS)]
pub struct ConversationDeleted {
    pub id: String,
    pub deleted: bool,
}

/// `GET /api/convert`
#[derive(Debug, Clone, Serialize, TS)]
pub struct JobList {
    pub jobs: Vec<JobView>,
}

/// `DELETE /api/convert/{job}`: a finished job forgotten (`removed`), or a running one asked to stop
/// (`cancelling`).
#[derive(Debug, Clone, Serialize, TS)]
pub struct JobDeleted {
    pub job: String,
    pub state: JobStatus,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[ts(optional)]
    pub removed: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[ts(optional)]
    pub cancelling: Option<bool>,
}

/// `GET /api/folders`: the folders chosen in this run, which conversions may read.
#[derive(Debug, Clone, Serialize, TS)]
pub struct FolderList {
    pub folders: Vec<PathBuf>,
}

/// `POST /api/folders`: the folder, resolved, and whether it holds a model (config.json and weights).
#[derive(Debug, Clone, Serialize, TS)]
pub struct ChosenFolder {
    pub path: PathBuf,
    pub model_folder: bool,
}

/// `POST /api/folders/pick`: the folder picked in the desktop app's dialog (`null`: the person closed it).
#[derive(Debug, Clone, Serialize, TS)]
pub struct PickedFolder {
    pub path: Option<PathBuf>,
    pub model_folder: bool,
}

// -- OpenAI-compatible -----------------------------------------------------------------------------

/// One model of `GET /v1/models`.
#[derive(Debug, Clone, Serialize, TS)]
#[ts(rename = "OpenAIModel")]
pub struct OpenAiModel {
    pub id: String,
    /// "model"
    pub object: String,
    pub created: u64,
    pub owned_by: String,
}

/// `GET /v1/models`: the default model first.
#[derive(Debug, Clone, Serialize, TS)]
#[ts(rename = "OpenAIModelList")]
pub struct OpenAiModelList {
    /// "list"
    pub object: String,
    pub data: Vec<OpenAiModel>,
}

#[derive(Debug, Clone, Serialize, TS)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    pub prompt_tokens_details: PromptTokensDetails,
}

/// OpenAI's breakdown of the prompt tokens.
#[derive(Debug, Clone, Serialize, TS)]
pub struct PromptTokensDetails {
    /// Restored from the prefix cache instead of prefilled.
    pub cached_tokens: usize,
}

impl Usage {
    pub fn of(stats: &Stats) -> Usage {
        Usage {
            prompt_tokens: stats.prompt_tokens,
            completion_tokens: stats.completion_tokens,
            total_tokens: stats.prompt_tokens + stats.completion_tokens,
            prompt_tokens_details: PromptTokensDetails { cached_tokens: stats.cached_tokens },
        }
    }
}

/// `"stop"` or `"length"`.
pub type FinishReasonName = &'static str;

/// `POST /v1/chat/completions` without streaming.
#[derive(Debug, Clone, Serialize, TS)]
pub struct ChatCompletion {
    pub id: String,
    /// "chat.completion"
    pub object: String,
    pub created: u64,
    pub model: String,
    #[ts(type = "null")]
    pub system_fingerprint: (),
    pub choices: Vec<CompletionChoice>,
    pub usage: Usage,
    /// Tandem's extension: the generation's statistics.
    pub stats: Stats,
}

#[derive(Debug, Clone, Serialize, TS)]
pub struct CompletionChoice {
    pub index: u32,
    pub message: AssistantMessage,
    /// Null unless `logprobs` was asked for.
    pub logprobs: Option<ChoiceLogprobs>,
    #[ts(type = "string")]
    pub finish_reason: FinishReasonName,
}

#[derive(Debug, Clone, Serialize, TS)]
pub struct AssistantMessage {
    /// "assistant"
    pub role: String,
    pub content: String,
    #[ts(type = "null")]
    pub refusal: (),
    /// The functions the model called (absent when none).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[ts(as = "Option<Vec<ToolCallOut>>", optional)]
    pub tool_calls: Vec<ToolCallOut>,
}

/// The completions API's `logprobs`: per token its text, log-probability, the most likely
/// alternatives (text to log-probability, most likely first) and its character offset in the text.
#[derive(Debug, Clone, Serialize, TS)]
pub struct TextLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<f32>,
    #[ts(type = "Array<Record<string, number>>")]
    pub top_logprobs: Vec<serde_json::Map<String, serde_json::Value>>,
    pub text_offset: Vec<usize>,
}

impl TextLogprobs {
    /// `start`: the offset of the first token (characters of text before it).
    pub fn of(logprobs: &[crate::engine::Logprob], start: usize) -> TextLogprobs {
        let mut out =
            TextLogprobs { tokens: vec![], token_logprobs: vec![], top_logprobs: vec![], text_offset: vec![] };
        let mut offset = start;
        for l in logprobs {
            out.text_offset.push(offset);
            offset += l.token.text.chars().count();
            out.tokens.push(l.token.text.clone());
            out.token_logprobs.push(l.logprob);
            out.top_logprobs.push(l.top.iter().map(|(t, lp)| (t.text.clone(), serde_json::json!(lp))).collect());
        }
        out
    }
}

/// OpenAI's `logprobs` of a choice: one entry per generated token.
#[derive(Debug, Clone, Serialize, TS)]
pub struct ChoiceLogprobs {
    pub content: Vec<TokenLogprobOut>,
    #[ts(type = "null")]
    pub refusal: (),
}

#[derive(Debug, Clone, Serialize, TS)]
pub struct TokenLogprobOut {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    pub top_logprobs: Vec<TopLogprobOut>,
}

#[derive(Debug, Clone, Serialize, TS)]
pub struct TopLogprobOut {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

impl ChoiceLogprobs {
    pub fn of(logprobs: &[crate::engine::Logprob]) -> ChoiceLogprobs {
        let top = |t: &crate::engine::TokenText, logprob: f32| TopLogprobOut {
            token: t.text.clone(),
            logprob,
            bytes: t.bytes.clone(),
        };
        let content = logprobs
            .iter()
            .map(|l| TokenLogprobOut {
                token: l.token.text.clone(),
                logprob: l.logprob,
                bytes: l.token.bytes.clone(),
                top_logprobs: l.top.iter().map(|(t, lp)| top(t, *lp)).collect(),
            })
            .collect();
        ChoiceLogprobs { content, refusal: () }
    }
}

/// A call in OpenAI's shape: `arguments` is the JSON object as text. In a stream `index` counts
/// the calls of the answer.
#[derive(Debug, Clone, Serialize, TS)]
pub struct ToolCallOut {
    #[serde(skip_serializing_if = "Option::is_none")]
    #[ts(optional)]
    pub index: Option<u32>,
    pub id: String,
    /// "function"
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionCallOut,
}

#[derive(Debug, Clone, Serialize, TS)]
pub struct FunctionCallOut {
    pub name: String,
    pub arguments: String,
}

/// One `data:` event of a streamed completion: a first chunk with the role, one per text delta
/// (with running `stats` a few times a second), a last one with the finish reason and the final
/// `stats`, and, when `stream_options.include_usage` is set, a last chunk without choices carrying
/// `usage` (then every other chunk has `usage: null`).
#[derive(Debug, Clone, Serialize, TS)]
pub struct ChatCompletionChunk {
    pub id: String,
    /// "chat.completion.chunk"
    pub object: String,
    pub created: u64,
    pub model: String,
    #[ts(type = "null")]
    pub system_fingerprint: (),
    pub choices: Vec<ChunkChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[ts(optional = nullable, as = "Option<Usage>")]
    pub usage: Option<Option<Usage>>,
    /// Tandem's extension: the generation's statistics (running, or final on the last chunks).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[ts(optional)]
    pub stats: Option<Stats>,
}

#[derive(Debug, Clone, Serialize, TS)]
pub struct ChunkChoice {
    pub index: u32,
    pub delta: ChunkDelta,
    /// The delta's tokens, when `logprobs` was asked for.
    pub logprobs: Option<ChoiceLogprobs>,
    #[ts(type = "string | null")]
    pub finish_reason: Option<FinishReasonName>,
}

/// `{"role": "assistant", "content": ""}` first, then `{"content": text}`, and `{}` at the end.
#[derive(Debug, Clone, Default, Serialize, TS)]
pub struct ChunkDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    #[ts(optional)]
    pub role: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[ts(optional)]
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[ts(optional)]
    pub tool_calls: Option<Vec<ToolCallOut>>,
}

/// `POST /v1/completions`: the non-streamed answer, and (`finish_reason` null until the last) each
/// streamed chunk.
#[derive(Debug, Clone, Serialize, TS)]
pub struct TextCompletion {
    pub id: String,
    /// "text_completion"
    pub object: String,
    pub created: u64,
    pub model: String,
    #[ts(type = "null")]
    pub system_fingerprint: (),
    pub choices: Vec<TextChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[ts(optional = nullable, as = "Option<Usage>")]
    pub usage: Option<Option<Usage>>,
    /// Tandem's extension: the generation's statistics (running on streamed chunks, final at the end).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[ts(optional)]
    pub stats: Option<Stats>,
}

#[derive(Debug, Clone, Serialize, TS)]
pub struct TextChoice {
    pub index: u32,
    pub text: String,
    /// Null unless `logprobs` was asked for.
    pub logprobs: Option<TextLogprobs>,
    #[ts(type = "string | null")]
    pub finish_reason: Option<FinishReasonName>,
}
