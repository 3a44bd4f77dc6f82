//! What can go wrong in a generation.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum GenerateError {
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("the prompt has {prompt} tokens and {max_tokens} more were asked for, but the model's context is {context} tokens")]
    ContextExceeded { prompt: usize, max_tokens: usize, context: usize },
    #[error("token id {id} is outside the vocabulary of {vocab}")]
    BadToken { id: u32, vocab: i32 },
    #[error("invalid sampling settings: {0}")]
    Sampling(String),
    #[error("MTP depth {0} is outside {range}", range = super::options::MTP_DEPTHS_TEXT)]
    Depth(usize),
    #[error("model `{model}` has no vision tower: it cannot read images{} (send text only, or choose a vision model)", .reason.as_deref().map(|r| format!(" ({r})")).unwrap_or_default())]
    NoVision { model: String, reason: Option<String> },
    #[error("oracle drafts: {0}")]
    Oracle(String),
    #[error("images: {0}")]
    Images(String),
    /// A model split over several processes: another rank refused the request.
    #[error("{0}")]
    OtherRank(String),
    #[error(transparent)]
    Mlx(#[from] mlx::Error),
}

pub type Result<T> = std::result::Result<T, GenerateError>;
