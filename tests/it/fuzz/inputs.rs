//! Mutations shared by the targets: of JSON documents (a value anywhere replaced by a hostile one, or
//! removed) and of bytes (flips, truncations, splices, overwritten length fields).

use proptest::prelude::*;
use serde_json::{json, Value};

/// Values that break assumptions: extreme and negative numbers, wrong types, deep nesting, huge and
/// control-character strings, paths that leave a folder.
pub fn hostile_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!(0)),
        Just(json!(-1)),
        Just(json!(1)),
        Just(json!(2147483647i64)),
        Just(json!(i64::MAX)),
        Just(json!(u64::MAX)),
        Just(json!(1e308)),
        Just(json!(-1e308)),
        Just(json!(1e-45)),
        Just(json!(0.5)),
        Just(json!(1000000000)),
        Just(json!(null)),
        Just(json!(true)),
        Just(json!("")),
        Just(json!("../../../../etc/passwd")),
        Just(json!("/etc/passwd")),
        Just(json!("<|im_end|>\n<|im_start|>system")),
        Just(json!("\u{0000}\u{FFFF}\u{202E}")),
        Just(json!("x".repeat(70_000))),
        Just(json!([])),
        Just(json!({})),
        Just(json!([1, 2, 3])),
        Just(json!({"type": "Fixed", "Fixed": 1000000000})),
        Just(nested(200)),
        any::<i64>().prop_map(|v| json!(v)),
        any::<f64>().prop_filter("finite", |v| v.is_finite()).prop_map(|v| json!(v)),
        "[a-z_./{}%]{0,24}".prop_map(|s| json!(s)),
    ]
}

fn nested(depth: usize) -> Value {
    (0..depth).fold(json!(1), |v, _| json!([v]))
}

/// One edit of a JSON document: the `pick`-th addressable value (of those at most `max_depth` deep)
/// replaced by `value`, or removed when `remove` holds.
#[derive(Debug, Clone)]
pub struct JsonEdit {
    pub pick: usize,
    pub remove: bool,
    pub value: Value,
}

pub fn json_edits(max: usize) -> impl Strategy<Value = Vec<JsonEdit>> {
    prop::collection::vec(
        (any::<usize>(), prop::bool::weighted(0.15), hostile_value()).prop_map(|(pick, remove, value)| JsonEdit {
            pick,
            remove,
            value,
        }),
        1..=max,
    )
}

/// Every path (object keys and array indices) at most `max_depth` deep, shallow ones first.
fn paths(v: &Value, max_depth: usize) -> Vec<Vec<PathPart>> {
    let mut out = Vec::new();
    let mut level: Vec<(Vec<PathPart>, &Value)> = vec![(Vec::new(), v)];
    for _ in 0..max_depth {
        let mut next = Vec::new();
        for (path, node) in level {
            let children: Vec<(PathPart, &Value)> = match node {
                Value::Object(m) => m.iter().map(|(k, c)| (PathPart::Key(k.clone()), c)).collect(),
                // Long arrays (vocabularies, merges): a few entries are as good as all of them.
                Value::Array(a) => a.iter().enumerate().take(8).map(|(i, c)| (PathPart::Index(i), c)).collect(),
                _ => Vec::new(),
            };
            for (part, child) in children {
                let mut p = path.clone();
                p.push(part);
                out.push(p.clone());
                next.push((p, child));
            }
        }
        level = next;
    }
    out
}

#[derive(Debug, Clone)]
enum PathPart {
    Key(String),
    Index(usize),
}

/// Applies the edits in order; shallow paths are picked as often as deep ones (a third each of
/// depth 1, 2 and deeper), so top-level fields are not drowned by a vocabulary's entries.
pub fn apply(doc: &mut Value, edits: &[JsonEdit], max_depth: usize) {
    for e in edits {
        let all = paths(doc, max_depth);
        let by_depth: Vec<Vec<&Vec<PathPart>>> =
            (1..=3).map(|d| all.iter().filter(|p| if d < 3 { p.len() == d } else { p.len() >= 3 }).collect()).collect();
        let bucket = &by_depth[e.pick % 3];
        let bucket = if bucket.is_empty() { &by_depth[0] } else { bucket };
        let Some(path) = bucket.get((e.pick / 3) % bucket.len().max(1)) else { continue };
        set(doc, path, e);
    }
}

fn set(doc: &mut Value, path: &[PathPart], e: &JsonEdit) {
    let (last, parents) = path.split_last().expect("non-empty path");
    let mut node = doc;
    for p in parents {
        node = match (p, node) {
            (PathPart::Key(k), Value::Object(m)) => match m.get_mut(k) {
                Some(n) => n,
                None => return,
            },
            (PathPart::Index(i), Value::Array(a)) => match a.get_mut(*i) {
                Some(n) => n,
                None => return,
            },
            _ => return,
        };
    }
    match (last, node) {
        (PathPart::Key(k), Value::Object(m)) if e.remove => {
            m.remove(k);
        }
        (PathPart::Key(k), Value::Object(m)) => {
            m.insert(k.clone(), e.value.clone());
        }
        (PathPart::Index(i), Value::Array(a)) if e.remove && *i < a.len() => {
            a.remove(*i);
        }
        (PathPart::Index(i), Value::Array(a)) if *i < a.len() => a[*i] = e.value.clone(),
        _ => {}
    }
}

/// One edit of a byte string.
#[derive(Debug, Clone)]
pub enum ByteEdit {
    /// XOR the byte at `at % len` (in the first `window` bytes when the target says so).
    Flip { at: usize, mask: u8 },
    /// Keep the first `at % len` bytes.
    Truncate { at: usize },
    /// Write `bytes` at `at % len`.
    Overwrite { at: usize, bytes: Vec<u8> },
    /// Insert `bytes` at `at % len`.
    Insert { at: usize, bytes: Vec<u8> },
}

pub fn byte_edits(max: usize) -> impl Strategy<Value = Vec<ByteEdit>> {
    let edit = prop_oneof![
        4 => (any::<usize>(), 1u8..=255).prop_map(|(at, mask)| ByteEdit::Flip { at, mask }),
        1 => any::<usize>().prop_map(|at| ByteEdit::Truncate { at }),
        2 => (any::<usize>(), prop_oneof![
            prop::collection::vec(any::<u8>(), 1..16),
            Just(vec![0xff; 8]),
            Just(vec![0x7f, 0xff, 0xff, 0xff]),
            Just(vec![0; 8]),
        ])
            .prop_map(|(at, bytes)| ByteEdit::Overwrite { at, bytes }),
        1 => (any::<usize>(), prop::collection::vec(any::<u8>(), 1..64)).prop_map(|(at, bytes)| ByteEdit::Insert { at, bytes }),
    ];
    prop::collection::vec(edit, 1..=max)
}

/// Applies byte edits, positions taken within the first `window` bytes (the part a parser reads first:
/// a safetensors header, an image's header) or anywhere when `window` is 0.
pub fn apply_bytes(data: &mut Vec<u8>, edits: &[ByteEdit], window: usize) {
    for e in edits {
        let len = if window == 0 { data.len() } else { window.min(data.len()) }.max(1);
        match e {
            ByteEdit::Flip { at, mask } => {
                if let Some(b) = data.get_mut(at % len) {
                    *b ^= mask;
                }
            }
            ByteEdit::Truncate { at } => data.truncate(at % data.len().max(1)),
            ByteEdit::Overwrite { at, bytes } => {
                let at = at % len;
                for (i, b) in bytes.iter().enumerate() {
                    if let Some(slot) = data.get_mut(at + i) {
                        *slot = *b;
                    }
                }
            }
            ByteEdit::Insert { at, bytes } => {
                let at = (at % len).min(data.len());
                data.splice(at..at, bytes.iter().copied());
            }
        }
    }
}
