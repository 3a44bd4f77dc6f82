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
        mtp: MtpOptions { enabled: mtp, depth: 3, adaptive: false, exact_verify: false },
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
