//! Constrained decoding on the bundled model: the output matches the grammar, and MTP stays
//! lossless under it (the same tokens with drafting as without, greedy, penalised and sampled).

use crate::common::*;
use tandem::chat::{Message, Tokenizer};
use tandem::generate::{
    generate, Control, FinishReason, GenerateOptions, GrammarSpec, Grammars, MtpOptions, Output, SamplingParams,
};
use tandem::model::{self, LoadOptions, Qwen35};

fn grammars(tokenizer: &Tokenizer, m: &Qwen35) -> Grammars {
    let width = m.config.text.vocab_size as usize;
    let end = tokenizer.token_id("<|im_end|>").expect("<|im_end|>");
    Grammars::new(&tokenizer.token_bytes(width).unwrap(), end).unwrap()
}

fn run(m: &Qwen35, prompt: &[u32], stop: &[u32], sampling: &SamplingParams, mtp: bool, c: Option<&Grammars>) -> Output {
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "kind": {"enum": ["whale", "ship", "sea"]},
            "name": {"type": "string", "maxLength": 24},
            "alive": {"type": "boolean"}
        },
        "required": ["kind", "name", "alive"],
        "additionalProperties": false
    });
    let opts = GenerateOptions {
        max_tokens: 80,
        sampling: sampling.clone(),
        stop_ids: stop.to_vec(),
        mtp: MtpOptions { enabled: mtp, depth: 3, adaptive: false, exact_verify: false, ..Default::default() },
        constraint: c.map(|g| g.compile(&GrammarSpec::JsonSchema(schema)).unwrap()),
        ..Default::default()
    };
    generate(m, prompt, &opts, &mut |_| Control::Continue).unwrap()
}

#[test]
fn constrained_output_matches_its_schema_and_mtp_stays_lossless() {
    let dir = tiny_model_dir();
    let m = model::load(&dir, &LoadOptions::default()).unwrap();
    assert!(m.has_mtp());
    let tokenizer = Tokenizer::from_dir(&dir).unwrap();
    let prompt = tokenizer.encode_chat(&[Message::user("Tell me of the white whale.")], true).unwrap();
    let stop = tokenizer.stop_ids().to_vec();
    let g = grammars(&tokenizer, &m);
    let text = |o: &Output| tokenizer.decode(&o.tokens, true).unwrap();

    // Without the grammar the model writes prose: the constraint is what makes it JSON.
    let free = run(&m, &prompt, &stop, &SamplingParams::greedy(), false, None);
    assert!(serde_json::from_str::<serde_json::Value>(&text(&free)).is_err(), "{}", text(&free));

    let cases = [
        ("greedy", SamplingParams::greedy()),
        ("penalised", SamplingParams { repetition_penalty: 1.3, presence_penalty: 0.5, ..SamplingParams::greedy() }),
        ("sampled", SamplingParams { temperature: 0.9, seed: Some(11), ..SamplingParams::greedy() }),
    ];
    for (what, sampling) in cases {
        let plain = run(&m, &prompt, &stop, &sampling, false, Some(&g));
        let answer = text(&plain);
        assert_eq!(plain.finish, FinishReason::Stop, "{what}: the grammar ends with the end token: {answer}");
        let v: serde_json::Value = serde_json::from_str(&answer).unwrap_or_else(|e| panic!("{what}: {e}: {answer}"));
        let o = v.as_object().unwrap();
        assert_eq!(o.len(), 3, "{what}: {answer}");
        assert!(["whale", "ship", "sea"].contains(&o["kind"].as_str().unwrap()), "{what}: {answer}");
        assert!(o["name"].as_str().unwrap().chars().count() <= 24, "{what}: {answer}");
        assert!(o["alive"].is_boolean(), "{what}: {answer}");

        let spec = run(&m, &prompt, &stop, &sampling, true, Some(&g));
        assert_eq!(spec.tokens, plain.tokens, "{what}: MTP changed the constrained output: {}", text(&spec));
        let s = spec.stats.spec.expect("MTP statistics");
        assert!(s.cycles > 0 && s.drafted > 0, "{what}: {s:?}");
    }
}

#[test]
fn a_grammar_that_does_not_compile_says_why() {
    let dir = tiny_model_dir();
    let m = model::load(&dir, &LoadOptions::default()).unwrap();
    let tokenizer = Tokenizer::from_dir(&dir).unwrap();
    let g = grammars(&tokenizer, &m);
    let lark = g.compile(&GrammarSpec::Lark("start: ( \"a\"".into())).unwrap_err();
    assert!(!lark.is_empty());
    let schema = g.compile(&GrammarSpec::JsonSchema(serde_json::json!({"$ref": "#/$defs/missing"}))).unwrap_err();
    assert!(schema.contains("missing"), "{schema}");
    // And a good one compiles.
    assert!(g.compile(&GrammarSpec::JsonObject).is_ok());
}

/// A required call, forced in either of Qwen's call formats, comes out as a call that parses back
/// with arguments of the tool's schema, the same with MTP as without.
#[test]
fn forced_tool_calls_parse_back_in_both_formats() {
    use tandem::chat::tools::{grammar, parse, CallFormat, Tool, ToolChoice, ToolUse};
    let dir = tiny_model_dir();
    let m = model::load(&dir, &LoadOptions::default()).unwrap();
    let tokenizer = Tokenizer::from_dir(&dir).unwrap();
    let g = grammars(&tokenizer, &m);
    let prompt = tokenizer.encode_chat(&[Message::user("Where is the ship?")], true).unwrap();
    let params = serde_json::json!({
        "type": "object",
        "properties": {"port": {"type": "string", "maxLength": 16}, "berth": {"type": "integer", "minimum": 1, "maximum": 9}},
        "required": ["port", "berth"],
        "additionalProperties": false
    });
    let tools = vec![
        Tool { name: "locate".into(), description: None, parameters: params },
        Tool { name: "sail".into(), description: None, parameters: serde_json::json!({"type": "object"}) },
    ];
    for format in [CallFormat::Json, CallFormat::Xml] {
        for choice in [ToolChoice::Required, ToolChoice::Function("locate".into())] {
            let uses = ToolUse { tools: tools.clone(), choice: choice.clone() };
            let lark = grammar(&uses, format).unwrap().expect("a forced call has a grammar");
            let spec = GrammarSpec::Lark(lark);
            let out = |mtp: bool| {
                let opts = GenerateOptions {
                    max_tokens: 160,
                    stop_ids: tokenizer.stop_ids().to_vec(),
                    mtp: MtpOptions {
                        enabled: mtp,
                        depth: 2,
                        adaptive: false,
                        exact_verify: false,
                        ..Default::default()
                    },
                    constraint: Some(g.compile(&spec).unwrap_or_else(|e| panic!("{format:?}: {e}"))),
                    ..Default::default()
                };
                generate(&m, &prompt, &opts, &mut |_| Control::Continue).unwrap()
            };
            let plain = out(false);
            let answer = tokenizer.decode(&plain.tokens, true).unwrap();
            let (text, calls) = parse(&answer);
            assert!(text.is_empty() && !calls.is_empty(), "{format:?} {choice:?}: {answer}");
            if choice != ToolChoice::Required || calls[0].name == "locate" {
                assert_eq!(calls[0].name, "locate", "{format:?}: {answer}");
                let a = calls[0].arguments.as_object().unwrap();
                assert!(a.keys().all(|k| k == "port" || k == "berth"), "{format:?}: {answer}");
                let berth_ok = a.get("berth").is_none_or(|b| b.as_i64().is_some_and(|b| (1..=9).contains(&b)));
                assert!(
                    berth_ok && a.get("port").is_none_or(|p| p.as_str().is_some_and(|p| p.chars().count() <= 16)),
                    "{answer}"
                );
            }
            assert_eq!(out(true).tokens, plain.tokens, "{format:?} {choice:?}: MTP changed the call");
        }
    }
}

/// The genuine Qwen3 template renders the tools, an earlier call and its result exactly as
/// transformers' `apply_chat_template` does with the same conversation.
#[test]
fn qwen3_template_renders_tools_like_transformers() {
    use tandem::chat::tools::{Tool, ToolCall};
    use tandem::chat::{ChatOptions, ContentPart};
    let dir = repo().join(".cache/assets/qwen3-tokenizer");
    let tokenizer = Tokenizer::from_dir(&dir).unwrap();
    let params =
        serde_json::json!({"type": "object", "properties": {"port": {"type": "string"}}, "required": ["port"]});
    let tool = Tool { name: "get_tide".into(), description: Some("Tide times.".into()), parameters: params };
    let call = ToolCall { name: "get_tide".into(), arguments: serde_json::json!({"port": "Nantucket"}) };
    let messages = vec![
        Message::user("When is high tide?"),
        Message { tool_calls: vec![call], ..Message::new("assistant", vec![ContentPart::Text(String::new())]) },
        Message::text("tool", "14:05"),
    ];
    let options = ChatOptions { add_generation_prompt: true, enable_thinking: None, tools: Some(vec![tool.clone()]) };
    let ours = tokenizer.apply_chat_template_with(&messages, &options).unwrap();
    let script = r#"
import json, sys
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1])
tools = [json.loads(sys.argv[2])]
messages = [
    {"role": "user", "content": "When is high tide?"},
    {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "get_tide", "arguments": {"port": "Nantucket"}}}]},
    {"role": "tool", "content": "14:05"},
]
sys.stdout.write(tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True))
"#;
    let out = std::process::Command::new(python())
        .args(["-c", script, dir.to_str().unwrap(), &tool.to_value().to_string()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let theirs = String::from_utf8(out.stdout).unwrap();
    assert!(ours.contains("get_tide") && ours.contains("<tool_response>"), "{ours}");
    assert_eq!(ours, theirs);
}
