//! Model folders as a download could bring them: mutated config.json, safetensors headers, index
//! files, tokenizer.json / tokenizer_config.json, chat templates and images. Each is read by what a
//! person's action reaches (the loader, inspect, the models listing, the tokenizer, the image reader).

use std::path::Path;

use proptest::prelude::*;
use serde_json::Value;
use tandem::chat::{Message, Tokenizer};
use tandem::model::{self, vision_input, LoadOptions};

use super::inputs::{apply, apply_bytes, byte_edits, json_edits};
use super::{copy_dir, corpus, passwd_marker, runner, within};
use crate::common;

const DEADLINE_S: u64 = 30;

fn family(variant: &str) -> std::path::PathBuf {
    common::fixture("family").join(variant)
}

fn read_json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// What a person's actions read of a folder: the models listing, inspect, and a load (probe off:
/// random fixture bodies cannot judge a head) with one forward if it loads. Returns the error texts.
fn read_folder(dir: &Path) -> Result<Vec<String>, String> {
    let dir = dir.to_path_buf();
    within(DEADLINE_S, "reading the folder", move || {
        let mut errors = Vec::new();
        let info = tandem::engine::catalog::inspect_folder(&dir);
        errors.extend(info.error);
        if let Err(e) = tandem::quant::inspect(&dir) {
            errors.push(e.to_string());
        }
        match model::load(&dir, &LoadOptions { probe: false, ..LoadOptions::default() }) {
            Ok(m) => {
                let ids = mlx::Array::from_slice(&[1i32, 2, 3], &[1, 3]).unwrap();
                if let Err(e) = m.forward(&ids, &mut m.make_cache()).and_then(|h| m.logits(&h)) {
                    errors.push(e.to_string());
                }
            }
            Err(e) => errors.push(e.to_string()),
        }
        errors
    })
}

fn no_foreign_bytes(errors: &[String]) -> Result<(), TestCaseError> {
    if let Some(marker) = passwd_marker() {
        for e in errors {
            prop_assert!(!e.contains(&marker), "an error echoes /etc/passwd: {e}");
        }
    }
    Ok(())
}

#[test]
fn config_json() {
    let seeds: Vec<Value> = [family("base").join("config.json"), corpus("config").join("huge-layers.json")]
        .iter()
        .map(|p| read_json(p))
        .collect();
    runner(file!())
        .run(&(0..seeds.len(), json_edits(3)), |(seed, edits)| {
            let tmp = common::tempdir();
            copy_dir(&family("base"), tmp.path());
            let mut doc = seeds[seed].clone();
            apply(&mut doc, &edits, 4);
            std::fs::write(tmp.path().join("config.json"), serde_json::to_vec(&doc).unwrap()).unwrap();
            read_folder(tmp.path()).map_err(TestCaseError::fail)?;
            Ok(())
        })
        .unwrap();
}

#[test]
fn safetensors_header() {
    let seed = std::fs::read(family("base").join("model.safetensors")).unwrap();
    let header_len = u64::from_le_bytes(seed[..8].try_into().unwrap()) as usize;
    runner(file!())
        .run(&byte_edits(4), |edits| {
            let tmp = common::tempdir();
            copy_dir(&family("base"), tmp.path());
            let mut data = seed.clone();
            apply_bytes(&mut data, &edits, 8 + header_len);
            std::fs::write(tmp.path().join("model.safetensors"), &data).unwrap();
            read_folder(tmp.path()).map_err(TestCaseError::fail)?;
            Ok(())
        })
        .unwrap();
}

#[test]
fn index_json() {
    let mut seeds = vec![read_json(&family("mtp_sidecar").join("model.safetensors.index.json"))];
    for name in ["escape-absolute.json", "escape-parent.json"] {
        seeds.push(read_json(&corpus("index").join(name)));
    }
    runner(file!())
        .run(&(0..seeds.len(), json_edits(3)), |(seed, edits)| {
            let tmp = common::tempdir();
            copy_dir(&family("mtp_sidecar"), tmp.path());
            let mut doc = seeds[seed].clone();
            apply(&mut doc, &edits, 3);
            std::fs::write(tmp.path().join("model.safetensors.index.json"), serde_json::to_vec(&doc).unwrap()).unwrap();
            let errors = read_folder(tmp.path()).map_err(TestCaseError::fail)?;
            no_foreign_bytes(&errors)
        })
        .unwrap();
}

/// A tokenizer folder: the bundled model's tokenizer files, one of them edited.
fn tokenize(dir: &Path) -> Result<(), String> {
    let dir = dir.to_path_buf();
    within(DEADLINE_S, "tokenizing", move || {
        let Ok(tok) = Tokenizer::from_dir(&dir) else { return };
        let messages = [Message::system("Be brief."), Message::user("Hello <|im_end|> there")];
        let _ = tok.encode_chat(&messages, true);
        let _ = tok.encode("Call me Ishmael.", true);
        let _ = tok.decode(&[0, 1, 2, 3, u32::MAX], false);
    })
}

#[test]
fn tokenizer_files() {
    let tiny = common::tiny_model_dir();
    let files = ["tokenizer.json", "tokenizer_config.json"];
    let seeds: Vec<Value> = files.iter().map(|f| read_json(&tiny.join(f))).collect();
    let hostile = read_json(&corpus("tokenizer").join("padding-fixed.json"));
    runner(file!())
        .run(&(0..3usize, json_edits(3)), |(which, edits)| {
            let tmp = common::tempdir();
            for f in files {
                std::fs::copy(tiny.join(f), tmp.path().join(f)).unwrap();
            }
            // 0, 1: an edit of either file; 2: the campaign's padding seed merged in, then edited.
            let (file, mut doc) = match which {
                2 => {
                    let mut doc = seeds[0].clone();
                    if let (Some(d), Some(h)) = (doc.as_object_mut(), hostile.as_object()) {
                        d.extend(h.clone());
                    }
                    (files[0], doc)
                }
                i => (files[i], seeds[i].clone()),
            };
            apply(&mut doc, &edits, 3);
            std::fs::write(tmp.path().join(file), serde_json::to_vec(&doc).unwrap()).unwrap();
            tokenize(tmp.path()).map_err(TestCaseError::fail)
        })
        .unwrap();
}

/// Template pieces a hostile folder could combine: unbounded loops, doubling strings, huge
/// indents, recursion, errors raised on purpose, broken syntax.
fn template_piece() -> impl Strategy<Value = String> {
    let n = prop_oneof![Just(10u64), Just(1_000_000), Just(1_000_000_000_000), any::<u32>().prop_map(u64::from)];
    prop_oneof![
        n.clone().prop_map(|n| format!("{{% for i in range({n}) %}}x{{% endfor %}}")),
        n.clone().prop_map(|n| format!("{{{{ 'ab' * {n} }}}}")),
        (1u32..80).prop_map(|k| format!(
            "{{% set s = namespace(v='ab') %}}{{% for i in range({k}) %}}{{% set s.v = s.v ~ s.v %}}{{% endfor %}}{{{{ s.v }}}}"
        )),
        n.clone().prop_map(|n| format!("{{{{ messages | tojson(indent={n}) }}}}")),
        Just("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}".to_string()),
        Just("{{ raise_exception('refused') }}".to_string()),
        Just("{{ undefined_thing.attr.x }}".to_string()),
        Just("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}".to_string()),
        Just("{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}".to_string()),
        Just("{% for %}".to_string()),
        Just("{{".to_string()),
        "[a-z{}%' ]{0,40}",
    ]
}

#[test]
fn chat_templates() {
    let tiny = common::tiny_model_dir();
    let config = read_json(&tiny.join("tokenizer_config.json"));
    let seeds: Vec<String> = std::fs::read_dir(corpus("templates"))
        .unwrap()
        .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
        .collect();
    assert!(!seeds.is_empty());
    let strategy = (0..seeds.len(), prop::collection::vec(template_piece(), 0..4), any::<bool>());
    runner(file!())
        .run(&strategy, |(seed, pieces, seed_first)| {
            let tmp = common::tempdir();
            std::fs::copy(tiny.join("tokenizer.json"), tmp.path().join("tokenizer.json")).unwrap();
            let added = pieces.concat();
            let template =
                if seed_first { format!("{}{added}", seeds[seed]) } else { format!("{added}{}", seeds[seed]) };
            let mut doc = config.clone();
            doc["chat_template"] = Value::String(template);
            std::fs::write(tmp.path().join("tokenizer_config.json"), serde_json::to_vec(&doc).unwrap()).unwrap();
            let dir = tmp.path().to_path_buf();
            let rendered = within(DEADLINE_S, "rendering the template", move || {
                let tok = Tokenizer::from_dir(&dir).ok()?;
                tok.apply_chat_template(&[Message::user("Hi")], true).ok().map(|s| s.len())
            })
            .map_err(TestCaseError::fail)?;
            // A render that succeeds stays within the output budget.
            prop_assert!(rendered.unwrap_or(0) <= 64 << 20, "rendered {rendered:?} bytes");
            Ok(())
        })
        .unwrap();
}

#[test]
fn images() {
    let mut seeds: Vec<(String, Vec<u8>)> = Vec::new();
    for dir in [common::fixture("images"), corpus("images")] {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            seeds.push((p.display().to_string(), std::fs::read(&p).unwrap()));
        }
    }
    runner(file!())
        .run(&(0..seeds.len(), byte_edits(4), prop::bool::ANY), |(seed, edits, header_only)| {
            let mut data = seeds[seed].1.clone();
            apply_bytes(&mut data, &edits, if header_only { 64 } else { 0 });
            within(DEADLINE_S, "decoding the image", move || {
                let _ = vision_input::decode(&data, "fuzzed", &vision_input::DecodeLimits::default());
            })
            .map_err(TestCaseError::fail)
        })
        .unwrap();
}
