//! What every generation route (OpenAI's, Ollama's, Anthropic's) reads the same way: fields it does not
//! implement refused by name, the model or the registry's default, stop sequences, counts, one choice,
//! base64 images.

use base64::Engine as _;

use super::error::ApiError;
use super::AppState;
use crate::engine::Image;
use crate::generate::GrammarSpec;

/// Stop sequences a request may give at most.
pub const MAX_STOPS: usize = 16;

/// The first field of `other` that asks for something Tandem does not do: a parameter it does not
/// implement (tools, response_format, logprobs, penalties, ...) or one it does not know. A field set
/// to what means "off" in OpenAI's API (null, false, 0, "", [] or {}) asks for nothing, so clients
/// that send their defaults or echo a returned message back work; anything else is a 400 naming it,
/// never silently dropped.
/// `harmless` names fields accepted whatever their value.
pub(super) fn unsupported(
    other: &serde_json::Map<String, serde_json::Value>,
    path: &str,
    harmless: &[&str],
) -> Result<(), ApiError> {
    use serde_json::Value;
    let asks = |v: &Value| match v {
        Value::Null | Value::Bool(false) => false,
        Value::Number(n) => n.as_f64() != Some(0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
        Value::Bool(true) => true,
    };
    match other.iter().find(|(k, v)| asks(v) && !harmless.contains(&k.as_str())) {
        None => Ok(()),
        Some((name, value)) => Err(ApiError::bad_request(
            "unsupported_parameter",
            format!("`{path}{name}` = {value}: not supported by this server (it would be ignored, so it is refused)"),
        )),
    }
}

/// What kind of JSON value `v` is, for errors: "a number", "an object"...
pub(super) fn json_kind(v: &serde_json::Value) -> &'static str {
    use serde_json::Value;
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// The model a request names, or the registry's default when it names none.
pub(super) fn model_or_default(state: &AppState, model: String) -> Result<String, ApiError> {
    if model.trim().is_empty() {
        Ok(state.engine.default_model()?)
    } else {
        Ok(model)
    }
}

/// `stop` sequences of the field `field`, at most [`MAX_STOPS`].
pub(super) fn stops(stop: Vec<String>, field: &str) -> Result<Vec<String>, ApiError> {
    if stop.len() > MAX_STOPS {
        return Err(ApiError::bad_request(
            "invalid_value",
            format!("`{field}` has {} sequences; at most {MAX_STOPS}", stop.len()),
        ));
    }
    Ok(stop)
}

/// OpenAI's `response_format`: free text, any JSON object, or JSON matching a schema.
#[derive(Debug, serde::Deserialize, ts_rs::TS)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(super) enum ResponseFormat {
    Text,
    JsonObject,
    JsonSchema { json_schema: JsonSchemaIn },
}

#[derive(Debug, serde::Deserialize, ts_rs::TS)]
#[ts(optional_fields)]
pub(super) struct JsonSchemaIn {
    name: Option<String>,
    description: Option<String>,
    #[ts(type = "unknown")]
    schema: Option<serde_json::Value>,
    /// Constrained decoding always holds to the schema; `strict` changes nothing.
    strict: Option<bool>,
}

impl ResponseFormat {
    /// The grammar the output must match (None for free text).
    pub(super) fn grammar(format: Option<ResponseFormat>) -> Result<Option<GrammarSpec>, ApiError> {
        Ok(match format {
            None | Some(ResponseFormat::Text) => None,
            Some(ResponseFormat::JsonObject) => Some(GrammarSpec::JsonObject),
            Some(ResponseFormat::JsonSchema { json_schema }) => {
                let _ = (json_schema.name, json_schema.description, json_schema.strict);
                match json_schema.schema {
                    Some(schema @ serde_json::Value::Object(_)) => Some(GrammarSpec::JsonSchema(schema)),
                    Some(other) => {
                        return Err(ApiError::bad_request(
                            "invalid_schema",
                            format!("`response_format.json_schema.schema` = {other}: a schema is a JSON object"),
                        ))
                    }
                    // OpenAI's default: any JSON object.
                    None => Some(GrammarSpec::JsonObject),
                }
            }
        })
    }
}

/// A count from JSON as a `usize` (saturating: a larger one means "no limit" to the engine anyway).
pub(super) fn count(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

/// OpenAI's `n`: one choice per request.
pub(super) fn one_choice(n: Option<u64>) -> Result<(), ApiError> {
    match n.filter(|&n| n != 1) {
        None => Ok(()),
        Some(n) => {
            Err(ApiError::bad_request("invalid_value", format!("`n` = {n}: only one choice per request is supported")))
        }
    }
}

/// The media type from the file's first bytes.
pub(super) fn image_kind(b: &[u8]) -> Option<&'static str> {
    if b.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some("image/png")
    } else if b.starts_with(&[0xff, 0xd8, 0xff]) {
        Some("image/jpeg")
    } else if b.starts_with(b"GIF87a") || b.starts_with(b"GIF89a") {
        Some("image/gif")
    } else if b.len() >= 12 && &b[..4] == b"RIFF" && &b[8..12] == b"WEBP" {
        Some("image/webp")
    } else {
        None
    }
}

/// An image sent as base64 text (`what` names the field for errors); its type from its first bytes.
pub(super) fn base64_image(data: &str, what: &str) -> Result<Image, ApiError> {
    let data: String = data.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data.as_bytes())
        .map_err(|e| ApiError::bad_request("invalid_image", format!("{what}: not valid base64: {e}")))?;
    let kind = image_kind(&bytes)
        .ok_or_else(|| ApiError::bad_request("invalid_image", format!("{what}: not a PNG, JPEG, GIF or WebP image")))?;
    Ok(Image { bytes, media_type: Some(kind.to_owned()) })
}
