//! Function calling in the Qwen family's formats: the tools a request offers, rendered into the
//! prompt (by the model's own template when it reads `tools`, else as Qwen's tool preamble in the
//! system message), the `<tool_call>` blocks parsed out of the answer (whole, or as they stream),
//! and the grammar that forces a call when the caller requires one.
//!
//! Two bodies appear inside `<tool_call>…</tool_call>`: Qwen2.5/Qwen3's JSON object
//! `{"name": .., "arguments": {..}}`, and the XML-like form of Qwen3-Coder and Qwen3.5
//! (`<function=NAME>` then `<parameter=KEY>VALUE</parameter>` lines). Both are read whatever the
//! model; the template decides which one a forced call is written in.

use serde_json::{json, Map, Value};

pub const CALL_OPEN: &str = "<tool_call>";
pub const CALL_CLOSE: &str = "</tool_call>";

/// One function a request offers: OpenAI's `function` object.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    pub name: String,
    pub description: Option<String>,
    /// A JSON schema of the arguments (an object schema).
    pub parameters: Value,
}

impl Tool {
    /// The `{"type": "function", "function": {..}}` form templates and Qwen's preamble read.
    pub fn to_value(&self) -> Value {
        let mut f = Map::new();
        f.insert("name".into(), Value::from(self.name.clone()));
        if let Some(d) = &self.description {
            f.insert("description".into(), Value::from(d.clone()));
        }
        f.insert("parameters".into(), self.parameters.clone());
        json!({"type": "function", "function": f})
    }
}

/// What the caller lets the model do with the tools.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolChoice {
    /// Call any, or answer in text.
    Auto,
    /// Call at least one.
    Required,
    /// Call this one.
    Function(String),
}

/// A request's tools and choice (`tool_choice: none` is no tools at all).
#[derive(Debug, Clone, PartialEq)]
pub struct ToolUse {
    pub tools: Vec<Tool>,
    pub choice: ToolChoice,
}

/// A call the model made.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub name: String,
    /// The arguments object.
    pub arguments: Value,
}

impl ToolCall {
    /// The text a Qwen model writes for this call, in `format`: how an earlier call is put back
    /// into the conversation.
    pub fn render(&self, format: CallFormat) -> String {
        match format {
            CallFormat::Json => {
                let body = json!({"name": self.name, "arguments": self.arguments});
                format!("{CALL_OPEN}\n{body}\n{CALL_CLOSE}")
            }
            CallFormat::Xml => {
                let mut s = format!("{CALL_OPEN}\n<function={}>\n", self.name);
                if let Some(args) = self.arguments.as_object() {
                    for (k, v) in args {
                        let v = v.as_str().map(str::to_owned).unwrap_or_else(|| v.to_string());
                        s.push_str(&format!("<parameter={k}>\n{v}\n</parameter>\n"));
                    }
                }
                s.push_str(&format!("</function>\n{CALL_CLOSE}"));
                s
            }
        }
    }
}

/// How a model writes a call's body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallFormat {
    Json,
    Xml,
}

impl CallFormat {
    /// The format a chat template writes calls in (XML when it spells `<function=`).
    pub fn of_template(source: &str) -> CallFormat {
        if source.contains("<function=") {
            CallFormat::Xml
        } else {
            CallFormat::Json
        }
    }
}

/// Qwen's tool preamble, for templates that do not read `tools`: the functions as JSON lines
/// inside `<tools>`, and how to call them.
pub fn preamble(tools: &[Tool]) -> String {
    let mut s = String::from(
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
         You are provided with function signatures within <tools></tools> XML tags:\n<tools>",
    );
    for t in tools {
        s.push('\n');
        s.push_str(&t.to_value().to_string());
    }
    s.push_str(
        "\n</tools>\n\nFor each function call, return a json object with function name and arguments within \
         <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": \
         <args-json-object>}\n</tool_call>",
    );
    s
}

/// A tool's result as templates without tool support get it: a user turn in `<tool_response>`.
pub fn response_text(content: &str) -> String {
    format!("<tool_response>\n{content}\n</tool_response>")
}

/// Splits an answer into its text (calls removed, trimmed) and its calls. A block that does not
/// parse stays in the text, so nothing the model wrote is lost.
pub fn parse(answer: &str) -> (String, Vec<ToolCall>) {
    let mut stream = CallStream::default();
    let mut text = stream.push(answer);
    text.push_str(&stream.finish());
    (text.trim().to_owned(), stream.calls)
}

/// The body of one `<tool_call>` block, either format.
fn parse_body(body: &str) -> Option<ToolCall> {
    let body = body.trim();
    if body.starts_with('{') {
        let v: Value = serde_json::from_str(body).ok()?;
        let name = v.get("name")?.as_str()?.to_owned();
        let arguments = match v.get("arguments") {
            None | Some(Value::Null) => json!({}),
            // Some models write the arguments as a JSON string.
            Some(Value::String(s)) => serde_json::from_str(s).ok()?,
            Some(a) => a.clone(),
        };
        return arguments.is_object().then_some(ToolCall { name, arguments });
    }
    let rest = body.strip_prefix("<function=")?;
    let (name, mut rest) = rest.split_once('>')?;
    let mut arguments = Map::new();
    loop {
        rest = rest.trim_start();
        if let Some(after) = rest.strip_prefix("<parameter=") {
            let (key, after) = after.split_once('>')?;
            let (value, after) = after.split_once("</parameter>")?;
            let value = value.strip_prefix('\n').unwrap_or(value);
            let value = value.strip_suffix('\n').unwrap_or(value);
            // A value that reads as JSON (a number, an object) is one; else it is a string.
            let v = serde_json::from_str::<Value>(value).unwrap_or_else(|_| Value::from(value));
            arguments.insert(key.trim().to_owned(), v);
            rest = after;
        } else {
            rest.strip_prefix("</function>")?;
            break;
        }
    }
    Some(ToolCall { name: name.trim().to_owned(), arguments: Value::Object(arguments) })
}

/// Reads an answer as it streams: text outside calls passes through (held back while it could be
/// the start of `<tool_call>`), each call comes out when its block closes.
#[derive(Debug, Default)]
pub struct CallStream {
    pending: String,
    in_call: bool,
    /// Every call so far.
    pub calls: Vec<ToolCall>,
}

impl CallStream {
    /// Takes new text; returns the text that is certainly not part of a call. New calls are
    /// appended to [`CallStream::calls`].
    pub fn push(&mut self, piece: &str) -> String {
        self.pending.push_str(piece);
        let mut out = String::new();
        loop {
            if self.in_call {
                let Some(end) = self.pending.find(CALL_CLOSE) else { break };
                let body: String = self.pending[..end].to_owned();
                self.pending.drain(..end + CALL_CLOSE.len());
                self.in_call = false;
                match parse_body(&body) {
                    Some(call) => self.calls.push(call),
                    None => out.push_str(&format!("{CALL_OPEN}{body}{CALL_CLOSE}")),
                }
            } else if let Some(start) = self.pending.find(CALL_OPEN) {
                out.push_str(&self.pending[..start]);
                self.pending.drain(..start + CALL_OPEN.len());
                self.in_call = true;
            } else {
                // Keep back the longest tail that could begin `<tool_call>`.
                let keep = (1..CALL_OPEN.len()).rev().find(|&n| self.pending.ends_with(&CALL_OPEN[..n])).unwrap_or(0);
                let cut = self.pending.len() - keep;
                out.push_str(&self.pending[..cut]);
                self.pending.drain(..cut);
                break;
            }
        }
        out
    }

    /// [`CallStream::push`] for a streaming route: the text, and the index in [`CallStream::calls`] of the
    /// first call this piece closed (`calls[first..]` are the new ones, empty when none).
    pub fn feed(&mut self, piece: &str) -> (String, usize) {
        let first = self.calls.len();
        (self.push(piece), first)
    }

    /// The end of the answer: what was held back (an unclosed call stays text).
    pub fn finish(&mut self) -> String {
        let rest = std::mem::take(&mut self.pending);
        if std::mem::take(&mut self.in_call) {
            format!("{CALL_OPEN}{rest}")
        } else {
            rest
        }
    }
}

/// The longest bare string value a forced XML call may write when its schema sets no maxLength.
const XML_STRING_MAX: u64 = 4096;

/// llguidance's options for JSON written as `json.dumps` writes it.
fn compact_json() -> Value {
    json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "})
}

/// A Lark grammar (llguidance's dialect) for an answer that is one or more calls, to the tool
/// `choice` names or to any of `tools`, in `format`; None when the choice forces nothing.
pub fn grammar(uses: &ToolUse, format: CallFormat) -> Result<Option<String>, String> {
    let allowed: Vec<&Tool> = match &uses.choice {
        ToolChoice::Auto => return Ok(None),
        ToolChoice::Required => uses.tools.iter().collect(),
        ToolChoice::Function(name) => {
            let t = uses.tools.iter().find(|t| &t.name == name);
            vec![t.ok_or_else(|| format!("`tool_choice` names `{name}`, which is not among the tools"))?]
        }
    };
    let lit = |s: &str| Value::from(s).to_string();
    let mut rules = Vec::new();
    let mut calls = Vec::new();
    for (i, t) in allowed.iter().enumerate() {
        match format {
            CallFormat::Json => {
                let schema = json!({
                    "type": "object",
                    "properties": {"name": {"const": t.name}, "arguments": t.parameters},
                    "required": ["name", "arguments"],
                    "additionalProperties": false,
                    "x-guidance": compact_json()
                });
                rules.push(format!("call{i}: %json {schema}"));
            }
            CallFormat::Xml => {
                // Each parameter once, in the schema's order, the required ones always. A string is
                // written bare (no quotes, no `<`, at most its maxLength); any other value as
                // compact JSON of its schema.
                let mut params = Vec::new();
                let required: Vec<&str> = t
                    .parameters
                    .get("required")
                    .and_then(Value::as_array)
                    .map(|r| r.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                let properties = t.parameters.get("properties").and_then(Value::as_object);
                for (j, (k, s)) in properties.into_iter().flatten().enumerate() {
                    let value = if s.get("type").and_then(Value::as_str) == Some("string") {
                        let max = s.get("maxLength").and_then(Value::as_u64).unwrap_or(XML_STRING_MAX);
                        format!("/[^<]{{0,{max}}}/")
                    } else {
                        let mut s = s.clone();
                        if let Some(o) = s.as_object_mut() {
                            o.insert("x-guidance".into(), compact_json());
                        }
                        rules.push(format!("value{i}_{j}: %json {s}"));
                        format!("value{i}_{j}")
                    };
                    let param = format!("{} {value} \"\\n</parameter>\\n\"", lit(&format!("<parameter={k}>\n")));
                    params.push(if required.contains(&k.as_str()) { param } else { format!("({param})?") });
                }
                let params: String = params.iter().map(|p| format!(" {p}")).collect();
                rules.push(format!("call{i}: {}{params} \"</function>\"", lit(&format!("<function={}>\n", t.name))));
            }
        }
        calls.push(format!("call{i}"));
    }
    let one = format!("{} ({}) {}", lit(&format!("{CALL_OPEN}\n")), calls.join(" | "), lit(&format!("\n{CALL_CLOSE}")));
    Ok(Some(format!("start: block (\"\\n\" block)*\nblock: {one}\n{}\n", rules.join("\n"))))
}

#[cfg(test)]
mod tests;
