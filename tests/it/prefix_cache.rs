//! The prefix cache (src/engine/prefix_cache.rs): a generation that restores a cached prefix gives
//! the tokens of a cold run of the same prompt, token for token, plain and with MTP; only the
//! common prefix of an edited conversation is reused; images are part of the key; stored entries
//! are never changed by the decoding that follows a hit; the byte cap holds.

use tandem::chat::Tokenizer;
use tandem::engine::prefix_cache::{PrefixCache, BLOCK};
use tandem::generate::{generate_resumed, Control, GenerateOptions, MtpOptions, Output, Prompt, SamplingParams};
use tandem::model::{self, LoadOptions, Qwen35};

use crate::common::*;

fn tiny() -> Qwen35 {
    model::load(&tiny_model_dir(), &LoadOptions::default()).expect("load tandem-tiny")
}

/// Text of the probe file, from paragraph `from`, as token ids.
fn text(tok: &Tokenizer, words: &str) -> Vec<u32> {
    tok.encode(words, false).unwrap()
}

fn story(tok: &Tokenizer, n: usize, offset: usize) -> Vec<u32> {
    let words = std::fs::read_to_string(repo().join("assets/probe/mtp-probe.txt")).unwrap();
    let ids = text(tok, &words);
    ids.iter().cycle().skip(offset).take(n).copied().collect()
}

fn opts(n: usize, mtp: bool) -> GenerateOptions {
    GenerateOptions {
        max_tokens: n,
        sampling: SamplingParams::greedy(),
        mtp: MtpOptions { enabled: mtp, depth: 3, adaptive: false, exact_verify: false },
        ..Default::default()
    }
}

/// One generation through `cache` (None: cold, nothing restored or kept), as the engine's worker runs it.
fn run(m: &Qwen35, cache: Option<&mut PrefixCache>, prompt: &Prompt, opts: &GenerateOptions) -> Output {
    let mut off = PrefixCache::new(0);
    let cache = cache.unwrap_or(&mut off);
    let (ids, resume) = cache.resume(m, prompt, opts);
    let mut out = generate_resumed(m, prompt, opts, resume, &mut |_| Control::Continue).expect("generation");
    if let Some(ids) = ids {
        cache.keep(&ids, std::mem::take(&mut out.kept));
    }
    out
}

/// [`opts`] recording log-probabilities: this small model's greedy text hardly depends on the
/// linear layers' state (it decays within a few tokens), the log-probabilities right after a
/// restore do.
fn scored(n: usize, mtp: bool) -> GenerateOptions {
    GenerateOptions { logprobs: Some(1), ..opts(n, mtp) }
}

/// The same tokens as the cold run, and log-probabilities within rounding of its.
fn same(warm: &Output, cold: &Output, what: &str) {
    assert_eq!(warm.tokens, cold.tokens, "{what}");
    assert_eq!(warm.logprobs.len(), cold.logprobs.len(), "{what}");
    let drift =
        warm.logprobs.iter().zip(&cold.logprobs).map(|(w, c)| (w.logprob - c.logprob).abs()).fold(0.0, f32::max);
    assert!(drift < 1e-3, "{what}: log-probabilities {drift} from the cold run's");
}

fn join(parts: &[&[u32]]) -> Vec<u32> {
    parts.concat()
}

/// Turn 2 resends turn 1's prompt and reply and a new message: it restores turn 1's end (all of it
/// but the reply's last token, which was never fed) and matches a cold run; MTP drafts as well
/// after the restore as cold (the head's cache came back too).
#[test]
fn a_second_turn_hits_and_matches_a_cold_run() {
    let m = tiny();
    let tok = Tokenizer::from_dir(&tiny_model_dir()).unwrap();
    for mtp in [false, true] {
        let mut cache = PrefixCache::new(1 << 30);
        let turn1 = Prompt::text(story(&tok, 3 * BLOCK + 17, 0));
        let first = run(&m, Some(&mut cache), &turn1, &opts(24, mtp));
        assert_eq!(first.stats.cached_tokens, 0);
        let turn2 = Prompt::text(join(&[&turn1.ids, &first.tokens, &text(&tok, "\n\nAnd then the people said:")]));
        let cold = run(&m, None, &turn2, &opts(32, mtp));
        let warm = run(&m, Some(&mut cache), &turn2, &opts(32, mtp));
        assert_eq!(warm.tokens, cold.tokens, "mtp {mtp}");
        let cached = warm.stats.cached_tokens;
        assert!(
            (turn1.ids.len() + first.tokens.len() - 1..=turn1.ids.len() + first.tokens.len()).contains(&cached),
            "mtp {mtp}: {cached} cached of {} + {}",
            turn1.ids.len(),
            first.tokens.len()
        );
        if mtp {
            let (w, c) = (warm.stats.spec.unwrap(), cold.stats.spec.unwrap());
            println!("acceptance: restored {:.3}, cold {:.3}", w.acceptance, c.acceptance);
            assert!(w.accepted + 2 >= c.accepted, "the head lost its history: {w:?} against {c:?}");
        }
        let s = cache.stats();
        assert_eq!((s.lookups, s.hits), (2, 1), "mtp {mtp}: {s:?}");
    }
}

/// A prefix that ends inside a block (turn 1's prompt, a whole number of blocks plus 37 tokens),
/// followed by something other than turn 1's reply.
#[test]
fn a_hit_that_ends_mid_block_matches_a_cold_run() {
    let m = tiny();
    let tok = Tokenizer::from_dir(&tiny_model_dir()).unwrap();
    let mut cache = PrefixCache::new(1 << 30);
    let prompt = story(&tok, 2 * BLOCK + 37, 5);
    run(&m, Some(&mut cache), &Prompt::text(prompt.clone()), &opts(6, true));
    let other = Prompt::text(join(&[&prompt, &text(&tok, " Meanwhile, far away,")]));
    let cold = run(&m, None, &other, &scored(24, true));
    let warm = run(&m, Some(&mut cache), &other, &scored(24, true));
    assert_eq!(warm.stats.cached_tokens, prompt.len());
    same(&warm, &cold, "mid block");
}

/// Three turns, then turn 2's message edited: only the common prefix (turn 1 and its reply) is
/// restored, and the output is the cold run's.
#[test]
fn an_edit_of_an_earlier_message_reuses_only_the_common_prefix() {
    let m = tiny();
    let tok = Tokenizer::from_dir(&tiny_model_dir()).unwrap();
    let mut cache = PrefixCache::new(1 << 30);
    let turn1 = story(&tok, BLOCK + 40, 11);
    let r1 = run(&m, Some(&mut cache), &Prompt::text(turn1.clone()), &opts(16, false)).tokens;
    let turn2 = join(&[&turn1, &r1, &text(&tok, "\nTell me about the battle.")]);
    let r2 = run(&m, Some(&mut cache), &Prompt::text(turn2.clone()), &opts(16, false)).tokens;
    run(&m, Some(&mut cache), &Prompt::text(join(&[&turn2, &r2, &text(&tok, "\nAnd then?")])), &opts(8, false));
    let edited = Prompt::text(join(&[&turn1, &r1, &text(&tok, "\nTell me about the harvest instead.")]));
    let cold = run(&m, None, &edited, &opts(24, false));
    let warm = run(&m, Some(&mut cache), &edited, &opts(24, false));
    assert_eq!(warm.tokens, cold.tokens);
    let common = turn1.len() + r1.len();
    assert!((common - 1..=common).contains(&warm.stats.cached_tokens), "{} of {common}", warm.stats.cached_tokens);
}

/// Decoding after a hit writes into new buffers: the same turn, run again from the same entries
/// (the whole prompt, then the prefix before it), still gives the cold run's tokens.
#[test]
fn a_cached_entry_is_never_changed_by_decoding_after_a_hit() {
    let m = tiny();
    let tok = Tokenizer::from_dir(&tiny_model_dir()).unwrap();
    for mtp in [false, true] {
        let mut cache = PrefixCache::new(1 << 30);
        let turn1 = Prompt::text(story(&tok, 2 * BLOCK, 30));
        let r1 = run(&m, Some(&mut cache), &turn1, &opts(12, mtp)).tokens;
        let turn2 = Prompt::text(join(&[&turn1.ids, &r1, &text(&tok, "\nWhy?")]));
        let cold = run(&m, None, &turn2, &scored(40, mtp));
        let cached: Vec<usize> = (0..3)
            .map(|i| {
                let warm = run(&m, Some(&mut cache), &turn2, &scored(40, mtp));
                same(&warm, &cold, &format!("mtp {mtp}, run {i}"));
                warm.stats.cached_tokens
            })
            .collect();
        // The first run restores turn 1's end; the others the whole prompt, kept by the first.
        assert!(cached[0] < turn2.ids.len() && cached[1] == turn2.ids.len() && cached[2] == cached[1], "{cached:?}");
        // And turn 1's end once more, under another new message.
        let other = Prompt::text(join(&[&turn1.ids, &r1, &text(&tok, "\nHow?")]));
        let warm = run(&m, Some(&mut cache), &other, &scored(24, mtp));
        assert_eq!(warm.stats.cached_tokens, cached[0]);
        same(&warm, &run(&m, None, &other, &scored(24, mtp)), &format!("mtp {mtp}, another message"));
    }
}

/// A loop of distinct prompts never takes the cache past its cap, and the newest stays usable.
#[test]
fn the_byte_cap_holds_under_distinct_prompts() {
    let m = tiny();
    let tok = Tokenizer::from_dir(&tiny_model_dir()).unwrap();
    let probe = {
        let mut c = PrefixCache::new(u64::MAX);
        run(&m, Some(&mut c), &Prompt::text(story(&tok, 150, 0)), &opts(4, true));
        c.stats().bytes
    };
    let mut cache = PrefixCache::new(probe * 5 / 2);
    for i in 0..8 {
        let prompt = Prompt::text(story(&tok, 150, 7 * i + 1));
        run(&m, Some(&mut cache), &prompt, &opts(4, true));
        let s = cache.stats();
        assert!(s.bytes <= s.cap_bytes, "prompt {i}: {s:?}");
        assert!(s.entries >= 1);
        let again = run(&m, Some(&mut cache), &prompt, &opts(2, true));
        assert_eq!(again.stats.cached_tokens, prompt.ids.len(), "prompt {i}");
    }
    assert!(cache.stats().evictions > 0);
}

/// Image pads are keyed by the image: a turn after an image restores it (and its reply) and
/// matches a cold run; the same pads with another image reuse nothing past the text before it;
/// an image after a restored text prefix is encoded and placed as in a cold run.
#[test]
fn image_turns_are_keyed_by_the_image() {
    let dir = tempdir();
    let m = crate::vision::tandem_tiny_with_eyes(dir.path());
    let tok = Tokenizer::from_dir(&tiny_model_dir()).unwrap();
    let ids = read_ids(&crate::vision::reference(), "input_ids");
    let image = crate::vision::fixture_image();
    let first_pad = ids.iter().position(|&id| id == 5).unwrap();
    let mut cache = PrefixCache::new(1 << 30);

    // Text first, then the image in the next prompt: the rest holds the image.
    let before = Prompt::text(ids[..first_pad - 1].to_vec());
    run(&m, Some(&mut cache), &before, &opts(4, true));
    let turn1 = Prompt { ids: ids.clone(), images: vec![image.clone()] };
    let cold = run(&m, None, &turn1, &opts(12, true));
    let warm = run(&m, Some(&mut cache), &turn1, &opts(12, true));
    assert_eq!((warm.tokens.clone(), warm.stats.cached_tokens), (cold.tokens.clone(), first_pad - 1));

    let turn2 = join(&[&ids, &warm.tokens, &text(&tok, "\nWhat else is in it?")]);
    let prompt = Prompt { ids: turn2.clone(), images: vec![image.clone()] };
    let cold = run(&m, None, &prompt, &opts(16, true));
    let warm = run(&m, Some(&mut cache), &prompt, &opts(16, true));
    assert_eq!(warm.tokens, cold.tokens);
    assert!(warm.stats.cached_tokens >= ids.len(), "{} cached", warm.stats.cached_tokens);

    let mut other = image.clone();
    other.pixel_values.iter_mut().for_each(|v| *v = -*v);
    let prompt = Prompt { ids: turn2, images: vec![other] };
    let cold = run(&m, None, &prompt, &opts(16, true));
    let warm = run(&m, Some(&mut cache), &prompt, &opts(16, true));
    assert_eq!(warm.tokens, cold.tokens);
    assert_eq!(warm.stats.cached_tokens, first_pad - 1, "only the text before the image is shared");
}

/// Through the engine: turn 2 on a model that served turn 1 reports its cached tokens and gives the
/// tokens of a second model (the same folder, its own empty cache); `/api/stats` counts the hit.
#[test]
fn the_engine_reports_cached_tokens_and_its_cache() {
    use tandem::engine::{Engine, EngineConfig, Input, Request};
    use tandem::registry::Registry;
    let tmp = tempdir();
    let toml = tmp.path().join("models.toml");
    let tiny = tiny_model_dir();
    std::fs::write(
        &toml,
        format!("models_dir = \"models\"\n[[model]]\nname = \"a\"\npath = {tiny:?}\n[[model]]\nname = \"b\"\npath = {tiny:?}\n"),
    )
    .unwrap();
    std::fs::create_dir_all(tmp.path().join("models")).unwrap();
    let e = Engine::new(Registry::load(&toml).unwrap(), EngineConfig::default());
    let tok = Tokenizer::from_dir(&tiny).unwrap();
    let chat = |model: &str, ids: Vec<u32>| {
        let mut r = Request::new(model, Input::Tokens(ids));
        r.max_tokens = Some(16);
        r.ignore_eos = true;
        r.sampling.temperature = Some(0.0);
        e.chat_blocking(r).and_then(|g| g.blocking_collect()).unwrap()
    };
    let turn1 = story(&tok, BLOCK + 20, 3);
    let reply = chat("a", turn1.clone());
    let turn2 = join(&[&turn1, &reply.tokens, &text(&tok, "\nAnd?")]);
    let warm = chat("a", turn2.clone());
    let cold = chat("b", turn2);
    assert_eq!(warm.tokens, cold.tokens);
    assert_eq!(cold.stats.cached_tokens, 0);
    assert!(warm.stats.cached_tokens >= turn1.len() + reply.tokens.len() - 1, "{:?}", warm.stats);
    let stats = e.stats();
    let a = stats.models.iter().find(|m| m.id == "a").unwrap();
    let c = &a.prefix_cache;
    assert!(c.cap_bytes > 0 && c.bytes > 0 && c.bytes <= c.cap_bytes, "{c:?}");
    assert_eq!((c.lookups, c.hits, c.cached_tokens), (2, 1, warm.stats.cached_tokens as u64), "{c:?}");
    assert!(c.entries >= 3, "{c:?}");
}
