//! Tokenizer and chat template: messages (text and images) -> prompt text -> token ids, and generated
//! ids -> text, with Hugging Face semantics.
//!
//! A model folder holds `tokenizer.json` (the `tokenizers` format), `tokenizer_config.json` (special
//! tokens, added tokens, usually the chat template), optionally `chat_template.jinja` or
//! `chat_template.json` (the processor's template of vision-language models), and the stop tokens in
//! `generation_config.json` and `config.json`.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};

use minijinja::value::{Kwargs, Value};
use minijinja::{context, Environment, ErrorKind};
use serde_json::Value as Json;
use tokenizers::AddedToken;

use crate::model::files;

/// Used when a checkpoint ships no chat template. ChatML, which every Qwen model speaks; an image
/// becomes Qwen's vision placeholder, which the vision code expands.
const CHATML_TEMPLATE: &str = r#"{%- for message in messages %}
{{- '<|im_start|>' + message.role + '\n' }}
{%- if message.content is string %}
{{- message.content }}
{%- else %}
{%- for part in message.content %}
{%- if part.type == 'text' %}{{- part.text }}
{%- elif part.type == 'image' %}{{- '<|vision_start|><|image_pad|><|vision_end|>' }}
{%- endif %}
{%- endfor %}
{%- endif %}
{{- '<|im_end|>\n' }}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"#;

const FALLBACK_ORIGIN: &str = "built-in ChatML template";

/// The work one template render may do (minijinja's fuel: an instruction costs one, and every 64 bytes
/// of data it creates another), so a downloaded template can neither loop forever nor build a string
/// that exhausts memory: at most ~256 MB of data, well under a second of work. A real template spends
/// a few fuel per message plus its text's size / 64.
const TEMPLATE_FUEL: u64 = 4_000_000;

/// The largest `tojson(indent=...)` a template may ask for (transformers' templates use 2 or 4).
const MAX_TOJSON_INDENT: usize = 32;

/// Marks where a special token's text stood in a message (Unicode private-use characters), so the
/// rendered prompt can be encoded with that text as plain text: see `encode_chat_with`.
const MARK_OPEN: char = '\u{E000}';
const MARK_CLOSE: char = '\u{E001}';

#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    #[error("{}: no such folder", dir.display())]
    MissingDir { dir: PathBuf },
    #[error("{}: no tokenizer.json in this folder", dir.display())]
    MissingTokenizer { dir: PathBuf },
    // The cause is part of the message and not also a `source`, or a chain printed whole (the CLI's
    // `{:#}`) would say it twice.
    #[error("{}: {error}", path.display())]
    Io { path: PathBuf, error: io::Error },
    #[error("{}: invalid JSON: {error}", path.display())]
    Json { path: PathBuf, error: serde_json::Error },
    #[error("{}: cannot load the tokenizer: {message}", path.display())]
    Tokenizer { path: PathBuf, message: String },
    #[error("{}: field `{field}`: {message}", path.display())]
    Field { path: PathBuf, field: String, message: String },
    #[error("{}: chat template: {message}", dir.display())]
    Template { dir: PathBuf, message: String },
    #[error("cannot {action}: {message}")]
    Codec { action: &'static str, message: String },
}

type Result<T, E = ChatError> = std::result::Result<T, E>;

/// One part of a message: text, or an image whose pixels travel separately.
#[derive(Debug, Clone, PartialEq)]
pub enum ContentPart {
    Text(String),
    Image,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    /// "system", "user", "assistant" or "tool", as the template expects.
    pub role: String,
    pub content: Vec<ContentPart>,
    /// The calls an assistant turn made (function calling).
    pub tool_calls: Vec<tools::ToolCall>,
}

impl Message {
    pub fn new(role: impl Into<String>, content: Vec<ContentPart>) -> Self {
        Self { role: role.into(), content, tool_calls: Vec::new() }
    }
    pub fn text(role: impl Into<String>, text: impl Into<String>) -> Self {
        Self::new(role, vec![ContentPart::Text(text.into())])
    }
    pub fn system(text: impl Into<String>) -> Self {
        Self::text("system", text)
    }
    pub fn user(text: impl Into<String>) -> Self {
        Self::text("user", text)
    }
    pub fn assistant(text: impl Into<String>) -> Self {
        Self::text("assistant", text)
    }

    /// HF form: a plain string when the message is only text (text templates call string methods on
    /// it), the list form `[{"type": "text", "text": ..}, {"type": "image"}]` when it has images.
    fn to_value(&self) -> Value {
        let text_only = self.content.iter().all(|p| matches!(p, ContentPart::Text(_)));
        let content = if text_only {
            let text: String = self.content.iter().filter_map(ContentPart::as_text).collect();
            Value::from(text)
        } else {
            let parts: Vec<Value> = self
                .content
                .iter()
                .map(|part| match part {
                    ContentPart::Text(text) => context! { type => "text", text => text },
                    ContentPart::Image => context! { type => "image" },
                })
                .collect();
            Value::from(parts)
        };
        if self.tool_calls.is_empty() {
            return context! { role => self.role.as_str(), content => content };
        }
        // As transformers passes them: `function.arguments` an object.
        let calls: Vec<Value> = self
            .tool_calls
            .iter()
            .map(|c| {
                let function = context! { name => c.name.as_str(), arguments => Value::from(minijinja::value::Serde(&c.arguments)) };
                context! { type => "function", function => function }
            })
            .collect();
        context! { role => self.role.as_str(), content => content, tool_calls => calls }
    }
}

impl ContentPart {
    fn as_text(&self) -> Option<&str> {
        match self {
            ContentPart::Text(text) => Some(text),
            ContentPart::Image => None,
        }
    }
}

/// Options of one rendering, beyond the messages.
#[derive(Debug, Clone, Default)]
pub struct ChatOptions {
    /// End with the header of an assistant turn, so that the model answers.
    pub add_generation_prompt: bool,
    /// Passed to the template only when set: Qwen3 templates test `enable_thinking is defined`.
    pub enable_thinking: Option<bool>,
    /// The functions the model may call: passed to a template that reads `tools`, else written
    /// into the system message as Qwen's tool preamble ([`tools::preamble`]).
    pub tools: Option<Vec<tools::Tool>>,
}

/// A model's tokenizer, special tokens, stop tokens and chat template.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    dir: PathBuf,
    template: Environment<'static>,
    /// Where the template came from; also its name inside `template`, so it appears in errors.
    template_origin: String,
    /// bos/eos/pad/unk token strings from tokenizer_config.json, passed to the template when set.
    special_tokens: Vec<(&'static str, String)>,
    stop_ids: Vec<u32>,
    /// The text of every special added token, longest first: a message containing one gets it
    /// encoded as plain text, never as the token (no forged turn boundaries).
    special_texts: Vec<String>,
    /// The same tokenizer with special tokens encoded as plain text, made on first need.
    literal: std::sync::OnceLock<tokenizers::Tokenizer>,
    /// What each id spells (llguidance's reading of tokenizer.json), made on first need: grammars and
    /// log-probabilities both read it.
    spellings: std::sync::OnceLock<std::result::Result<Vec<Vec<u8>>, String>>,
    /// The template renders `tools` and assistant `tool_calls` itself.
    reads_tools: bool,
    call_format: tools::CallFormat,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("dir", &self.dir)
            .field("vocab_size", &self.vocab_size())
            .field("template_origin", &self.template_origin)
            .field("stop_ids", &self.stop_ids)
            .finish()
    }
}

impl Tokenizer {
    /// Loads the tokenizer, its configuration and chat template from a model folder.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        if !dir.is_dir() {
            return Err(ChatError::MissingDir { dir: dir.to_owned() });
        }
        let tokenizer_path = dir.join("tokenizer.json");
        if !tokenizer_path.is_file() {
            return Err(ChatError::MissingTokenizer { dir: dir.to_owned() });
        }
        let bytes =
            files::read(&tokenizer_path).map_err(|error| ChatError::Io { path: tokenizer_path.clone(), error })?;
        // The tokenizers crate panics on some malformed files (deeply nested decoders): caught here.
        let mut inner = no_panic(|| tokenizers::Tokenizer::from_bytes(&bytes))
            .map_err(|message| ChatError::Tokenizer { path: tokenizer_path.clone(), message })?
            .map_err(|e| ChatError::Tokenizer { path: tokenizer_path.clone(), message: e.to_string() })?;
        // Tandem fits prompts to the context itself: a file's padding or truncation would only pad a
        // prompt to a length it names (a billion tokens asks for gigabytes) or cut it silently.
        if inner.get_padding().is_some() || inner.get_truncation().is_some() {
            tracing::warn!("{}: ignoring the file's padding/truncation settings", tokenizer_path.display());
            inner.with_padding(None);
            inner
                .with_truncation(None)
                .map_err(|e| ChatError::Tokenizer { path: tokenizer_path.clone(), message: e.to_string() })?;
        }

        let config_path = dir.join("tokenizer_config.json");
        let config = read_json_if_present(&config_path)?.unwrap_or(Json::Null);
        add_missing_tokens(&mut inner, &config, &config_path)?;
        let special_tokens = ["bos_token", "eos_token", "pad_token", "unk_token"]
            .into_iter()
            .filter_map(|field| token_field(&config, &config_path, field).transpose())
            .collect::<Result<Vec<_>>>()?;

        let (template_origin, source) = match find_template(dir, &config, &config_path)? {
            Some(found) => found,
            None => {
                tracing::warn!("{}: no chat template; using the {FALLBACK_ORIGIN}", dir.display());
                (FALLBACK_ORIGIN.to_owned(), CHATML_TEMPLATE.to_owned())
            }
        };
        let reads_tools = source.contains("tools") && source.contains("tool_call");
        let call_format = tools::CallFormat::of_template(&source);
        let template = template_env(&template_origin, source)
            .map_err(|e| ChatError::Template { dir: dir.to_owned(), message: e })?;

        let mut special_texts: Vec<String> =
            inner.get_added_tokens_decoder().into_values().filter(|t| t.special).map(|t| t.content).collect();
        special_texts.retain(|t| !t.is_empty());
        special_texts.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        let mut tokenizer = Self {
            inner,
            dir: dir.to_owned(),
            template,
            template_origin,
            special_tokens,
            stop_ids: Vec::new(),
            special_texts,
            literal: std::sync::OnceLock::new(),
            spellings: std::sync::OnceLock::new(),
            reads_tools,
            call_format,
        };
        // A post-processor naming tokens the vocabulary lacks fails here, at load, not at the first chat.
        tokenizer
            .encode("a", true)
            .map_err(|e| ChatError::Tokenizer { path: tokenizer_path.clone(), message: e.to_string() })?;
        tokenizer.stop_ids = tokenizer.collect_stop_ids(&config, &config_path)?;
        Ok(tokenizer)
    }

    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        encode_with(&self.inner, text, add_special_tokens)
    }

    /// Encodes `text` with special tokens' text as plain text.
    fn encode_literal(&self, text: &str) -> Result<Vec<u32>> {
        let literal = self.literal.get_or_init(|| {
            let mut t = self.inner.clone();
            t.set_encode_special_tokens(true);
            t
        });
        encode_with(literal, text, false)
    }

    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        no_panic(|| self.inner.decode(ids, skip_special_tokens))
            .map_err(|message| ChatError::Codec { action: "decode ids", message })?
            .map_err(|e| ChatError::Codec { action: "decode ids", message: e.to_string() })
    }

    /// What each of the first `width` ids spells, as bytes (special tokens marked as llguidance
    /// marks them; ids without a token empty): the vocabulary a grammar is compiled against. The
    /// tokenizer is read once; each call copies the table.
    pub fn token_bytes(&self, width: usize) -> std::result::Result<Vec<Vec<u8>>, String> {
        let table = self.spellings.get_or_init(|| {
            let json: Json = serde_json::from_str(&self.inner.to_string(false).map_err(|e| e.to_string())?)
                .map_err(|e| e.to_string())?;
            llguidance::token_bytes_from_tokenizer_json(&json).map_err(|e| e.to_string())
        });
        let mut bytes = table.clone()?;
        if bytes.len() > width {
            return Err(format!("the tokenizer has {} ids, more than the model's {width} logits", bytes.len()));
        }
        bytes.resize(width, Vec::new());
        Ok(bytes)
    }

    /// The id of a token of the vocabulary (added tokens included), e.g. `<|im_end|>`.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Tokens that end generation: generation_config's and config's eos ids, the tokenizer's eos
    /// token, and the token that closes an assistant turn in the chat template. Deduplicated.
    pub fn stop_ids(&self) -> &[u32] {
        &self.stop_ids
    }

    /// Number of ids the tokenizer can produce, added tokens included (the model's embedding table is
    /// often padded beyond it).
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Where the chat template came from: a file name, or the built-in fallback.
    pub fn template_origin(&self) -> &str {
        &self.template_origin
    }

    pub fn uses_fallback_template(&self) -> bool {
        self.template_origin == FALLBACK_ORIGIN
    }

    pub fn apply_chat_template(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        self.apply_chat_template_with(messages, &ChatOptions { add_generation_prompt, ..ChatOptions::default() })
    }

    /// How this model writes a tool call (its template's format; Qwen3's JSON when it has none).
    pub fn call_format(&self) -> tools::CallFormat {
        self.call_format
    }

    /// The conversation as a template without tool support can render it: the tool preamble in
    /// the system message, earlier calls as the text the model wrote, results as user turns.
    fn without_tools(&self, messages: &[Message], offered: Option<&[tools::Tool]>) -> Vec<Message> {
        let mut out: Vec<Message> = messages
            .iter()
            .map(|m| {
                let mut m = m.clone();
                if m.role == "tool" {
                    let text: String = m.content.iter().filter_map(ContentPart::as_text).collect();
                    m = Message::user(tools::response_text(&text));
                }
                for call in std::mem::take(&mut m.tool_calls) {
                    m.content.push(ContentPart::Text(format!("\n{}", call.render(self.call_format))));
                }
                m
            })
            .collect();
        if let Some(offered) = offered.filter(|t| !t.is_empty()) {
            let preamble = tools::preamble(offered);
            match out.first_mut().filter(|m| m.role == "system") {
                Some(system) => system.content.push(ContentPart::Text(format!("\n\n{preamble}"))),
                None => out.insert(0, Message::system(preamble)),
            }
        }
        out
    }

    pub fn apply_chat_template_with(&self, messages: &[Message], options: &ChatOptions) -> Result<String> {
        let has_tool_turns = messages.iter().any(|m| m.role == "tool" || !m.tool_calls.is_empty());
        let rewritten;
        let (messages, tools) = if !self.reads_tools && (options.tools.is_some() || has_tool_turns) {
            rewritten = self.without_tools(messages, options.tools.as_deref());
            (&rewritten[..], Value::from(()))
        } else {
            let tools = match &options.tools {
                Some(t) => {
                    Value::from(minijinja::value::Serde(t.iter().map(tools::Tool::to_value).collect::<Vec<_>>()))
                }
                None => Value::from(()),
            };
            (messages, tools)
        };
        let messages: Vec<Value> = messages.iter().map(Message::to_value).collect();
        // As transformers does: special tokens first, then the call's arguments; `tools` and
        // `documents` are passed as none, not left undefined.
        let mut vars: Vec<(&str, Value)> =
            self.special_tokens.iter().map(|(name, token)| (*name, Value::from(token.as_str()))).collect();
        vars.extend([
            ("messages", Value::from(messages)),
            ("add_generation_prompt", Value::from(options.add_generation_prompt)),
            ("tools", tools),
            ("documents", Value::from(())),
        ]);
        if let Some(enable_thinking) = options.enable_thinking {
            vars.push(("enable_thinking", Value::from(enable_thinking)));
        }
        let ctx: Value = vars.into_iter().collect::<HashMap<_, _>>().into();
        self.template
            .get_template(&self.template_origin)
            .and_then(|t| t.render(ctx))
            .map_err(|e| ChatError::Template { dir: self.dir.clone(), message: describe(&e) })
    }

    /// Renders the conversation and encodes it. The template already wrote every special token, so
    /// none is added again.
    pub fn encode_chat(&self, messages: &[Message], add_generation_prompt: bool) -> Result<Vec<u32>> {
        self.encode_chat_with(messages, &ChatOptions { add_generation_prompt, ..ChatOptions::default() })
    }

    /// Renders and encodes a conversation. Text that came in messages never becomes a special token:
    /// where a message holds a special token's text (`<|im_end|>` typed by a user, say), that text is
    /// marked before rendering and encoded as plain text, so it cannot forge a turn boundary (as
    /// llama.cpp's `parse_special = false`). Messages without such text encode exactly as before.
    pub fn encode_chat_with(&self, messages: &[Message], options: &ChatOptions) -> Result<Vec<u32>> {
        let has_special = |text: &str| self.special_texts.iter().any(|s| text.contains(s.as_str()));
        if !messages.iter().flat_map(|m| &m.content).filter_map(ContentPart::as_text).any(has_special) {
            return self.encode(&self.apply_chat_template_with(messages, options)?, false);
        }
        let marked: Vec<Message> = messages
            .iter()
            .map(|m| Message {
                role: m.role.clone(),
                tool_calls: m.tool_calls.clone(),
                content: m
                    .content
                    .iter()
                    .map(|part| match part {
                        ContentPart::Text(text) => ContentPart::Text(mark_specials(text, &self.special_texts)),
                        ContentPart::Image => ContentPart::Image,
                    })
                    .collect(),
            })
            .collect();
        let rendered = self.apply_chat_template_with(&marked, options)?;
        let mut ids = Vec::new();
        let mut rest = rendered.as_str();
        while let Some(open) = rest.find(MARK_OPEN) {
            ids.extend(self.encode(&rest[..open], false)?);
            let after = &rest[open + MARK_OPEN.len_utf8()..];
            let marked_token = after
                .find(MARK_CLOSE)
                .and_then(|close| Some((after[..close].parse::<usize>().ok()?, close)))
                .and_then(|(i, close)| Some((self.special_texts.get(i)?, close)));
            match marked_token {
                Some((special, close)) => {
                    ids.extend(self.encode_literal(special)?);
                    rest = &after[close + MARK_CLOSE.len_utf8()..];
                }
                // A mark the template took apart, or one typed by the user: plain text either way.
                None => {
                    ids.extend(self.encode_literal(&rest[open..open + MARK_OPEN.len_utf8()])?);
                    rest = after;
                }
            }
        }
        ids.extend(self.encode(rest, false)?);
        Ok(ids)
    }

    /// A decoder for ids generated one at a time.
    pub fn stream_decoder(&self, skip_special_tokens: bool) -> StreamDecoder<'_> {
        StreamDecoder { tokenizer: self, ids: Vec::new(), prefix: 0, read: 0, skip_special_tokens }
    }

    fn collect_stop_ids(&self, tokenizer_config: &Json, tokenizer_config_path: &Path) -> Result<Vec<u32>> {
        let generation_path = self.dir.join("generation_config.json");
        let config_path = self.dir.join("config.json");
        let mut ids = Vec::new();
        if let Some(generation) = read_json_if_present(&generation_path)? {
            ids.extend(eos_ids(&generation, &generation_path, "eos_token_id")?);
        }
        if let Some(config) = read_json_if_present(&config_path)? {
            ids.extend(eos_ids(&config, &config_path, "eos_token_id")?);
            if let Some(text_config) = config.get("text_config") {
                ids.extend(eos_ids(text_config, &config_path, "text_config.eos_token_id")?);
            }
        }
        if let Some(eos) = token_field(tokenizer_config, tokenizer_config_path, "eos_token")? {
            ids.extend(self.token_id(&eos.1));
        }
        ids.extend(self.turn_end_token());
        let mut seen = std::collections::HashSet::new();
        ids.retain(|id| seen.insert(*id));
        Ok(ids)
    }

    /// The special token the template writes right after an assistant's words (`<|im_end|>` in
    /// ChatML), found by rendering a sample conversation: templates differ and few configs name it.
    fn turn_end_token(&self) -> Option<u32> {
        const MARK: &str = "TANDEM-END-OF-ANSWER";
        let sample = [Message::user("Hi"), Message::assistant(MARK)];
        let rendered = self.apply_chat_template(&sample, false).ok()?;
        let after = &rendered[rendered.rfind(MARK)? + MARK.len()..];
        let first = *self.encode(after, false).ok()?.first()?;
        let special = self.inner.get_added_tokens_decoder().get(&first).is_some_and(|t| t.special);
        special.then_some(first)
    }
}

/// Turns generated ids into text incrementally. Byte-level BPE splits a multi-byte character across
/// tokens, so text is only released once it decodes without a trailing replacement character. Each
/// step decodes a short window that starts with the previously released tokens rather than at the
/// new ones, because decoders such as SentencePiece's drop a leading space at the start of a text.
pub struct StreamDecoder<'t> {
    tokenizer: &'t Tokenizer,
    ids: Vec<u32>,
    /// `ids[prefix..read]` is the already released context of the window; `ids[read..]` is pending.
    prefix: usize,
    read: usize,
    skip_special_tokens: bool,
}

impl StreamDecoder<'_> {
    /// Adds one generated id; returns the text it completes, if any.
    pub fn step(&mut self, id: u32) -> Result<Option<String>> {
        self.ids.push(id);
        let released = self.tokenizer.decode(&self.ids[self.prefix..self.read], self.skip_special_tokens)?;
        let window = self.tokenizer.decode(&self.ids[self.prefix..], self.skip_special_tokens)?;
        if window.ends_with(char::REPLACEMENT_CHARACTER) {
            return Ok(None);
        }
        let Some(new) = window.get(released.len()..).filter(|new| !new.is_empty()) else {
            return Ok(None);
        };
        let new = new.to_owned();
        // The released ids now serve as context; older ones are not needed any more.
        self.ids.drain(..self.read);
        self.prefix = 0;
        self.read = self.ids.len();
        Ok(Some(new))
    }

    /// Releases whatever is pending at the end of generation, even an incomplete character.
    pub fn flush(&mut self) -> Result<Option<String>> {
        let released = self.tokenizer.decode(&self.ids[self.prefix..self.read], self.skip_special_tokens)?;
        let window = self.tokenizer.decode(&self.ids[self.prefix..], self.skip_special_tokens)?;
        self.ids.clear();
        (self.prefix, self.read) = (0, 0);
        let rest = window.get(released.len()..).unwrap_or(&window);
        Ok((!rest.is_empty()).then(|| rest.to_owned()))
    }
}

/// A Jinja environment configured as transformers configures its own: trim_blocks and lstrip_blocks,
/// Python string methods, loop controls, `raise_exception` and a `tojson` that writes what Python's
/// `json.dumps` writes.
fn template_env(origin: &str, source: String) -> Result<Environment<'static>, String> {
    let mut env = Environment::new();
    let syntax = minijinja::syntax::SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .build()
        .map_err(|e| e.to_string())?;
    env.set_syntax(syntax);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.set_fuel(Some(TEMPLATE_FUEL));
    env.add_function("raise_exception", |message: String| -> Result<Value, minijinja::Error> {
        Err(minijinja::Error::new(ErrorKind::InvalidOperation, format!("raise_exception: {message}")))
    });
    env.add_filter("tojson", tojson);
    env.add_template_owned(origin.to_owned(), source).map_err(|e| describe(&e))?;
    Ok(env)
}

/// Encodes with `tokenizer`; a panic inside the tokenizers crate (a malformed `tokenizer.json` can
/// cause one) becomes an error instead of taking the process down.
fn encode_with(tokenizer: &tokenizers::Tokenizer, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
    let encoded = no_panic(|| tokenizer.encode_fast(text, add_special_tokens))
        .map_err(|message| ChatError::Codec { action: "encode text", message })?
        .map_err(|e| ChatError::Codec { action: "encode text", message: e.to_string() })?;
    Ok(encoded.get_ids().to_vec())
}

/// Runs `f`, turning a panic inside the tokenizers crate into its message.
fn no_panic<T>(f: impl FnOnce() -> T) -> std::result::Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|panic| {
        let message = panic
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| panic.downcast_ref::<&str>().copied())
            .unwrap_or("the tokenizer failed");
        format!("tokenizer error: {message}")
    })
}

/// `text` with each special token's text (longest first) replaced by a mark naming its index.
fn mark_specials(text: &str, specials: &[String]) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    'scan: while !rest.is_empty() {
        for (i, special) in specials.iter().enumerate() {
            if rest.starts_with(special.as_str()) {
                out.push(MARK_OPEN);
                out.push_str(&i.to_string());
                out.push(MARK_CLOSE);
                rest = &rest[special.len()..];
                continue 'scan;
            }
        }
        let Some(c) = rest.chars().next() else { break };
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    out
}

/// A minijinja error with its template location, and the cause where there is one.
fn describe(e: &minijinja::Error) -> String {
    let mut message = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        message.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    message
}

/// Python's `json.dumps(value, ensure_ascii=False, indent=indent, sort_keys=sort_keys)`, which is
/// transformers' `tojson`: `", "` and `": "` separators, no HTML escaping (minijinja's own escapes).
fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, minijinja::Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    if let Some(n) = indent.filter(|n| *n > MAX_TOJSON_INDENT) {
        return Err(minijinja::Error::new(
            ErrorKind::InvalidOperation,
            format!("tojson: indent={n} is larger than {MAX_TOJSON_INDENT}"),
        ));
    }
    let to_error = |e: serde_json::Error| {
        minijinja::Error::new(ErrorKind::InvalidOperation, "cannot serialize to JSON").with_source(e)
    };
    // Objects keep their insertion order, as Python's dicts do, unless sort_keys asks otherwise.
    let out = if sort_keys == Some(true) {
        let mut json = serde_json::to_value(value).map_err(to_error)?;
        json.sort_all_objects();
        write_json(&json, indent)
    } else {
        write_json(value, indent)
    }
    .map_err(to_error)?;
    Ok(Value::from_safe_string(String::from_utf8_lossy(&out).into_owned()))
}

fn write_json(value: &impl serde::Serialize, indent: Option<usize>) -> serde_json::Result<Vec<u8>> {
    let mut out = Vec::new();
    match indent {
        Some(n) => {
            let indent = vec![b' '; n];
            let formatter = serde_json::ser::PrettyFormatter::with_indent(&indent);
            value.serialize(&mut serde_json::Serializer::with_formatter(&mut out, formatter))?
        }
        None => value.serialize(&mut serde_json::Serializer::with_formatter(&mut out, PythonFormatter))?,
    }
    Ok(out)
}

/// serde_json's compact output with Python's default separators.
struct PythonFormatter;

impl serde_json::ser::Formatter for PythonFormatter {
    fn begin_array_value<W: ?Sized + io::Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        if first {
            Ok(())
        } else {
            w.write_all(b", ")
        }
    }
    fn begin_object_key<W: ?Sized + io::Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        if first {
            Ok(())
        } else {
            w.write_all(b", ")
        }
    }
    fn begin_object_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        w.write_all(b": ")
    }
}

fn read_json_if_present(path: &Path) -> Result<Option<Json>> {
    let text = match files::read_if_present(path) {
        Ok(Some(text)) => text,
        Ok(None) => return Ok(None),
        Err(error) => return Err(ChatError::Io { path: path.to_owned(), error }),
    };
    serde_json::from_str(&text).map(Some).map_err(|error| ChatError::Json { path: path.to_owned(), error })
}

fn field_error(path: &Path, field: &str, message: String) -> ChatError {
    ChatError::Field { path: path.to_owned(), field: field.to_owned(), message }
}

/// A special token as tokenizer_config.json writes it: a string, an `AddedToken` object, or null.
/// Returns the field's name with the token, ready for the template's variables.
fn token_field(config: &Json, path: &Path, field: &'static str) -> Result<Option<(&'static str, String)>> {
    let token = match config.get(field) {
        None | Some(Json::Null) => return Ok(None),
        Some(Json::String(token)) => token,
        Some(Json::Object(object)) => match object.get("content") {
            Some(Json::String(token)) => token,
            _ => return Err(field_error(path, field, "an object without a string `content`".into())),
        },
        Some(other) => return Err(field_error(path, field, format!("expected a token string, got {other}"))),
    };
    Ok(Some((field, token.clone())))
}

/// `eos_token_id`: absent, null, an integer or a list of integers.
fn eos_ids(config: &Json, path: &Path, field: &str) -> Result<Vec<u32>> {
    let key = field.rsplit('.').next().unwrap_or(field);
    let as_id = |v: &Json| {
        v.as_u64()
            .and_then(|id| u32::try_from(id).ok())
            .ok_or_else(|| field_error(path, field, format!("expected a token id, got {v}")))
    };
    match config.get(key) {
        None | Some(Json::Null) => Ok(Vec::new()),
        Some(Json::Array(items)) => items.iter().map(as_id).collect(),
        Some(id) => Ok(vec![as_id(id)?]),
    }
}

/// An entry of `added_tokens_decoder`; only `content` is required (tokenizers' own `AddedToken`
/// requires every flag).
#[derive(serde::Deserialize)]
struct AddedTokenSpec {
    content: String,
    #[serde(default)]
    special: bool,
    #[serde(default)]
    lstrip: bool,
    #[serde(default)]
    rstrip: bool,
    #[serde(default)]
    single_word: bool,
    normalized: Option<bool>,
}

impl From<AddedTokenSpec> for AddedToken {
    fn from(t: AddedTokenSpec) -> Self {
        AddedToken::from(t.content, t.special)
            .lstrip(t.lstrip)
            .rstrip(t.rstrip)
            .single_word(t.single_word)
            .normalized(t.normalized.unwrap_or(!t.special))
    }
}

/// tokenizer_config.json's `added_tokens_decoder` usually repeats tokenizer.json's added tokens;
/// transformers adds those that are missing, and so do we.
fn add_missing_tokens(tokenizer: &mut tokenizers::Tokenizer, config: &Json, path: &Path) -> Result<()> {
    let Some(decoder) = config.get("added_tokens_decoder") else {
        return Ok(());
    };
    let decoder: HashMap<String, AddedTokenSpec> = serde_json::from_value(decoder.clone())
        .map_err(|e| field_error(path, "added_tokens_decoder", e.to_string()))?;
    let mut missing: Vec<(u32, AddedToken)> = Vec::new();
    for (id, token) in decoder {
        let id =
            id.parse().map_err(|_| field_error(path, "added_tokens_decoder", format!("`{id}` is not a token id")))?;
        if tokenizer.token_to_id(&token.content).is_none() {
            missing.push((id, token.into()));
        }
    }
    missing.sort_by_key(|(id, _)| *id);
    for (id, token) in missing {
        let content = token.content.clone();
        // Special tokens are registered as such, so that decoding can skip them.
        let added = if token.special { tokenizer.add_special_tokens([token]) } else { tokenizer.add_tokens([token]) };
        added.map_err(|e| field_error(path, "added_tokens_decoder", e.to_string()))?;
        let got = tokenizer.token_to_id(&content);
        if got != Some(id) {
            tracing::warn!("{}: added token {content:?} got id {got:?}, not {id}", path.display());
        }
    }
    Ok(())
}

/// The chat template and where it came from, in transformers' order of precedence:
/// `chat_template.jinja`, then `chat_template.json`, then tokenizer_config.json's `chat_template`.
fn find_template(dir: &Path, config: &Json, config_path: &Path) -> Result<Option<(String, String)>> {
    let jinja_path = dir.join("chat_template.jinja");
    match files::read_if_present(&jinja_path) {
        Ok(Some(source)) => return Ok(Some(("chat_template.jinja".into(), source))),
        Ok(None) => {}
        Err(error) => return Err(ChatError::Io { path: jinja_path, error }),
    }
    let json_path = dir.join("chat_template.json");
    if let Some(json) = read_json_if_present(&json_path)? {
        if let Some(source) = template_field(&json, &json_path)? {
            return Ok(Some(("chat_template.json".into(), source)));
        }
    }
    Ok(template_field(config, config_path)?.map(|source| ("tokenizer_config.json".into(), source)))
}

/// `chat_template`: a string, or a list of `{name, template}` of which transformers uses "default".
fn template_field(config: &Json, path: &Path) -> Result<Option<String>> {
    const FIELD: &str = "chat_template";
    match config.get(FIELD) {
        None | Some(Json::Null) => Ok(None),
        Some(Json::String(source)) => Ok(Some(source.clone())),
        Some(Json::Array(named)) => {
            let name_of = |t: &Json| t.get("name").and_then(Json::as_str).map(str::to_owned);
            let default = named.iter().find(|t| name_of(t).as_deref() == Some("default"));
            match default.and_then(|t| t.get("template")).and_then(Json::as_str) {
                Some(source) => Ok(Some(source.to_owned())),
                None => {
                    let names: Vec<String> = named.iter().filter_map(name_of).collect();
                    let message = format!("no template named \"default\" with a string `template` (names: {names:?})");
                    Err(field_error(path, FIELD, message))
                }
            }
        }
        Some(other) => Err(field_error(
            path,
            FIELD,
            format!("expected a string or a list of named templates, got {}", kind(other)),
        )),
    }
}

fn kind(value: &Json) -> &'static str {
    match value {
        Json::Null => "null",
        Json::Bool(_) => "a boolean",
        Json::Number(_) => "a number",
        Json::String(_) => "a string",
        Json::Array(_) => "a list",
        Json::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests;

pub mod tools;
