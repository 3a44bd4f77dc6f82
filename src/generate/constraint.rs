//! Constrained decoding: a grammar (a JSON schema, any JSON object, or a Lark grammar) decides
//! which tokens may come next, and every position a token is drawn at is masked by it: the plain
//! step, the first token after prefill and each row of an MTP verify alike. A verify row j is
//! masked with the grammar's state after drafts 0..j, which is the state plain decoding would be in
//! had it emitted those drafts, so speculative decoding stays lossless under a constraint.
//! llguidance compiles the grammars and computes the masks.

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory};
use mlx::Array;

/// What the output must match.
#[derive(Debug, Clone, PartialEq)]
pub enum GrammarSpec {
    /// Any JSON object.
    JsonObject,
    /// A JSON schema (draft 2020-12 as llguidance reads it).
    JsonSchema(serde_json::Value),
    /// A Lark grammar (llguidance's dialect, `%json { .. }` included).
    Lark(String),
}

/// The grammar compiler of one vocabulary: built once per loaded model.
#[derive(Clone)]
pub struct Grammars {
    factory: Arc<ParserFactory>,
}

impl Grammars {
    /// `token_bytes[id]` is what token `id` spells (special tokens start with
    /// [`TokTrie::SPECIAL_TOKEN_MARKER`]; ids the tokenizer does not use are empty and never
    /// allowed); `eos` is the token a finished grammar allows, and ends the generation.
    pub fn new(token_bytes: &[Vec<u8>], eos: u32) -> Result<Grammars, String> {
        if eos as usize >= token_bytes.len() {
            return Err(format!("end token {eos} is outside the vocabulary of {} ids", token_bytes.len()));
        }
        let info = TokRxInfo::new(token_bytes.len() as u32, eos);
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(TokTrie::from(&info, token_bytes)));
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
        factory.quiet();
        Ok(Grammars { factory: Arc::new(factory) })
    }

    /// Compiles `spec`; a grammar or schema it cannot compile is an error saying why.
    pub fn compile(&self, spec: &GrammarSpec) -> Result<Constraint, String> {
        let grammar = match spec {
            GrammarSpec::JsonObject => {
                TopLevelGrammar::from_json_schema(compact(serde_json::json!({"type": "object"})))
            }
            GrammarSpec::JsonSchema(schema) => TopLevelGrammar::from_json_schema(compact(schema.clone())),
            GrammarSpec::Lark(lark) => TopLevelGrammar::from_lark(lark.clone()),
        };
        let parser = self.factory.create_parser(grammar).map_err(|e| e.to_string())?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(e);
        }
        Ok(Constraint { matcher, vocab: self.factory.tok_env().tok_trie().vocab_size() })
    }
}

/// JSON written as `json.dumps` writes it (", " and ": ", no other whitespace), unless the schema
/// says otherwise (llguidance's `x-guidance` options). Free whitespace would let a model pad with
/// spaces and newlines until `max_tokens`, valid at every step and never finished.
fn compact(mut schema: serde_json::Value) -> serde_json::Value {
    if let Some(o) = schema.as_object_mut() {
        o.entry("x-guidance").or_insert_with(
            || serde_json::json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}),
        );
    }
    schema
}

/// One generation's grammar state.
pub struct Constraint {
    matcher: Matcher,
    vocab: usize,
}

impl Clone for Constraint {
    fn clone(&self) -> Self {
        Constraint { matcher: self.matcher.deep_clone(), vocab: self.vocab }
    }
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint").field("vocab", &self.vocab).finish_non_exhaustive()
    }
}

impl Constraint {
    /// The additive mask `[V]` (f32) for the next token: 0 where the grammar allows it, -inf
    /// elsewhere. `V` is the model's logit width (wider than the tokenizer where ids are padding).
    pub fn bias(&mut self, width: usize) -> Result<Array, String> {
        let row = self.bias_row(width)?;
        Array::from_slice(&row, &[width as i32]).map_err(|e| e.to_string())
    }

    fn bias_row(&mut self, width: usize) -> Result<Vec<f32>, String> {
        let mask = self.matcher.compute_mask_or_eos().map_err(|e| self.failed(e))?;
        let mut row = vec![f32::NEG_INFINITY; width];
        mask.iter_set_entries(|id| {
            if let Some(slot) = row.get_mut(id) {
                *slot = 0.0;
            }
        });
        Ok(row)
    }

    /// The masks `[k + 1, V]` of the positions after each prefix of `drafts` (row j: after
    /// drafts 0..j), for a verify. The state is left as it was. Rows after a draft the grammar
    /// refuses are left open: acceptance stops at that draft, so they are never drawn from.
    pub fn biases_along(&mut self, drafts: &[u32], width: usize) -> Result<Array, String> {
        let mut rows = Vec::with_capacity((drafts.len() + 1) * width);
        let mut fed = 0;
        let mut open = true;
        for j in 0..=drafts.len() {
            if open {
                rows.extend(self.bias_row(width)?);
            } else {
                rows.extend(std::iter::repeat_n(0.0, width));
            }
            if let Some(&d) = drafts.get(j) {
                if open && !self.matcher.is_stopped() && self.matcher.validate_tokens(&[d]).unwrap_or(0) == 1 {
                    self.matcher.consume_token(d).map_err(|e| self.failed(e))?;
                    fed += 1;
                } else {
                    open = false;
                }
            }
        }
        if fed > 0 {
            self.matcher.rollback(fed).map_err(|e| self.failed(e))?;
        }
        Array::from_slice(&rows, &[drafts.len() as i32 + 1, width as i32]).map_err(|e| e.to_string())
    }

    /// Moves the grammar past emitted tokens.
    pub fn consume(&mut self, tokens: &[u32]) -> Result<(), String> {
        for &t in tokens {
            if self.matcher.is_stopped() {
                // Past the end (the end token itself): nothing more to follow.
                break;
            }
            self.matcher.consume_token(t).map_err(|e| self.failed(e))?;
        }
        Ok(())
    }

    fn failed(&self, e: impl std::fmt::Display) -> String {
        self.matcher.get_error().unwrap_or_else(|| e.to_string())
    }
}
