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

/// `words` as token ids.
fn text(tok: &Tokenizer, words: &str) -> Vec<u32> {
    tok.encode(words, false).unwrap()
}

fn opts(n: usize, mtp: bool) -> GenerateOptions {
    GenerateOptions {
        max_tokens: n,
        sampling: SamplingParams::greedy(),
        mtp: MtpOptions { enabled: mtp, depth: 3, adaptive: false, exact_verify: false, ..Default::default() },
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
        let turn1 = Prompt::text(probe_tokens(3 * BLOCK + 17, 0));
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
    let prompt = probe_tokens(2 * BLOCK + 37, 5);
    run(&m, Some(&mut cache), &Prompt::text(prompt.clone()), &opts(6, true));
    let other = Prompt::text(join(&[&prompt, &text(&tok, " Meanwhile, far away,")]));
    let cold = run(&m, None, &other, &scored(24, true));
    let warm = run(&m, Some(&mut cache), &other, &scored(24, true));
    assert_eq!(warm.stats.cached_tokens, prompt.len());
    same(&warm, &cold, "mid block");
}

/// A long prompt is snapshotted inside its prefill every `every` tokens: another prompt that shares
/// only its first 3 blocks and a bit (an edited message) resumes from the boundary before they
/// differ (not from scratch, where only the prompt's end was kept), plain and with MTP (the head's
/// state is in the boundary snapshot too), and gives the cold run's tokens and log-probabilities.
#[test]
fn a_prompt_edited_inside_resumes_from_the_boundary_before_the_edit() {
    let m = tiny();
    let tok = Tokenizer::from_dir(&tiny_model_dir()).unwrap();
    let every = 2 * BLOCK;
    for mtp in [false, true] {
        let mut cache = PrefixCache::new(1 << 30).snapshot_every(every);
        let long = probe_tokens(5 * BLOCK + 9, 11);
        let first = run(&m, Some(&mut cache), &Prompt::text(long.clone()), &opts(4, mtp));
        assert_eq!(first.stats.cached_tokens, 0);
        // Boundaries at 2 and 4 blocks, the end of prefill, the end of the generation.
        assert!(cache.stats().entries >= 4, "mtp {mtp}: {:?}", cache.stats());
        let edited = Prompt::text(join(&[&long[..3 * BLOCK + 5], &text(&tok, " But the letter said otherwise:")]));
        let cold = run(&m, None, &edited, &scored(20, mtp));
        let warm = run(&m, Some(&mut cache), &edited, &scored(20, mtp));
        assert_eq!(warm.stats.cached_tokens, every, "mtp {mtp}: restored from the boundary at {every}");
        same(&warm, &cold, &format!("edited inside, mtp {mtp}"));
        if mtp {
            let (w, c) = (warm.stats.spec.unwrap(), cold.stats.spec.unwrap());
            assert!(w.accepted + 2 >= c.accepted, "the head lost its history: {w:?} against {c:?}");
        }
    }
    // Off: only the ends are kept, and the edited prompt finds nothing to resume.
    let mut cache = PrefixCache::new(1 << 30).snapshot_every(0);
    let long = probe_tokens(5 * BLOCK + 9, 11);
    run(&m, Some(&mut cache), &Prompt::text(long.clone()), &opts(4, false));
    let edited = Prompt::text(join(&[&long[..3 * BLOCK + 5], &text(&tok, " But the letter said otherwise:")]));
    assert_eq!(run(&m, Some(&mut cache), &edited, &opts(4, false)).stats.cached_tokens, 0);
}

/// Three turns, then turn 2's message edited: only the common prefix (turn 1 and its reply) is
/// restored, and the output is the cold run's.
#[test]
fn an_edit_of_an_earlier_message_reuses_only_the_common_prefix() {
    let m = tiny();
    let tok = Tokenizer::from_dir(&tiny_model_dir()).unwrap();
    let mut cache = PrefixCache::new(1 << 30);
    let turn1 = probe_tokens(BLOCK + 40, 11);
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
        let turn1 = Prompt::text(probe_tokens(2 * BLOCK, 30));
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
    let probe = {
        let mut c = PrefixCache::new(u64::MAX);
        run(&m, Some(&mut c), &Prompt::text(probe_tokens(150, 0)), &opts(4, true));
        c.stats().bytes
    };
    let mut cache = PrefixCache::new(probe * 5 / 2);
    for i in 0..8 {
        let prompt = Prompt::text(probe_tokens(150, 7 * i + 1));
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
    let turn1 = probe_tokens(BLOCK + 20, 3);
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

// --- The SSD tier (src/engine/prefix_cache/disk.rs) -------------------------------------------

use tandem::engine::prefix_cache::{model_identity, Disk, DiskStats};
use tandem::registry::PrefixCacheDisk;

fn disk_settings(dir: &std::path::Path, cap_bytes: u64) -> PrefixCacheDisk {
    PrefixCacheDisk { dir: dir.to_owned(), cap_bytes, write_bytes_per_minute: u64::MAX / 2 }
}

/// A cache with a fresh memory tier over the SSD tier in `settings.dir`, as a new engine makes.
fn on_disk(settings: &PrefixCacheDisk) -> PrefixCache {
    PrefixCache::with_disk(1 << 30, Some(Disk::open(settings, model_identity(&tiny_model_dir(), None))))
}

fn disk_stats(cache: &PrefixCache) -> DiskStats {
    cache.stats().disk.expect("an SSD tier")
}

/// Every regular file in the folder, as the cap counts them.
fn folder_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter_map(|e| e.metadata().ok())
        .filter(|m| m.is_file())
        .map(|m| m.len())
        .sum()
}

fn files(dir: &std::path::Path, kind: &str) -> Vec<std::path::PathBuf> {
    let mut out: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().contains(&format!("-{kind}-")))
        .collect();
    out.sort();
    out
}

/// Turn 1 through a cache on `settings`, and turn 2's prompt.
fn first_turn(m: &Qwen35, tok: &Tokenizer, settings: &PrefixCacheDisk, mtp: bool) -> (Prompt, DiskStats) {
    let mut cache = on_disk(settings);
    let turn1 = Prompt::text(probe_tokens(3 * BLOCK + 17, 2));
    let first = run(m, Some(&mut cache), &turn1, &opts(20, mtp));
    let turn2 = Prompt::text(join(&[&turn1.ids, &first.tokens, &text(tok, "\n\nAnd then the people said:")]));
    (turn2, disk_stats(&cache))
}

/// A new cache on the same folder (a restart: nothing in memory) restores turn 2's prefix from the
/// disk, and gives the cold run's tokens and log-probabilities, plain and with MTP; the restored
/// entry is promoted, so the same prompt again hits memory. Turn 2 writes its new blocks and
/// entries only, less than turn 1 wrote.
#[test]
fn a_restart_restores_from_the_disk_and_matches_a_cold_run() {
    let m = tiny();
    let tok = Tokenizer::from_dir(&tiny_model_dir()).unwrap();
    for mtp in [false, true] {
        let dir = tempdir();
        let settings = disk_settings(dir.path(), 1 << 30);
        let (turn2, wrote) = first_turn(&m, &tok, &settings, mtp);
        assert!(wrote.bytes_written > 0 && wrote.entries == 2, "{wrote:?}");
        assert_eq!(files(dir.path(), "b").len(), 3, "each block once: {wrote:?}");
        let cold = run(&m, None, &turn2, &scored(24, mtp));
        let mut cache = on_disk(&settings);
        let warm = run(&m, Some(&mut cache), &turn2, &scored(24, mtp));
        same(&warm, &cold, &format!("mtp {mtp}"));
        assert!(warm.stats.cached_tokens > 3 * BLOCK + 17, "{:?}", warm.stats);
        let d = disk_stats(&cache);
        assert_eq!(d.hits, 1, "{d:?}");
        assert!(
            d.bytes_written > 0 && d.bytes_written < wrote.bytes_written,
            "turn 2 wrote {} bytes, turn 1 {}",
            d.bytes_written,
            wrote.bytes_written
        );
        let again = run(&m, Some(&mut cache), &turn2, &scored(24, mtp));
        same(&again, &cold, &format!("mtp {mtp}, from memory"));
        assert_eq!((disk_stats(&cache).hits, cache.stats().hits), (1, 2));
    }
}

/// Through the engine and models.toml's `prefix_cache_disk`: a second engine on the same folder
/// answers turn 2 from the disk with the tokens of a model with no cache files.
#[test]
fn a_new_engine_hits_the_disk_on_its_first_turn() {
    use tandem::engine::{Engine, EngineConfig, Input, Request};
    use tandem::registry::Registry;
    let tmp = tempdir();
    let toml = tmp.path().join("models.toml");
    let tiny = tiny_model_dir();
    std::fs::write(
        &toml,
        format!(
            "models_dir = \"models\"\n[[model]]\nname = \"a\"\npath = {tiny:?}\n\
             prefix_cache_disk = {{ dir = \"cache\", cap_bytes = 100_000_000 }}\n\
             [[model]]\nname = \"b\"\npath = {tiny:?}\n"
        ),
    )
    .unwrap();
    std::fs::create_dir_all(tmp.path().join("models")).unwrap();
    let tok = Tokenizer::from_dir(&tiny).unwrap();
    let chat = |e: &Engine, model: &str, ids: Vec<u32>| {
        let mut r = Request::new(model, Input::Tokens(ids));
        r.max_tokens = Some(16);
        r.ignore_eos = true;
        r.sampling.temperature = Some(0.0);
        e.chat_blocking(r).and_then(|g| g.blocking_collect()).unwrap()
    };
    let turn1 = probe_tokens(BLOCK + 20, 3);
    let turn2 = {
        let e = Engine::new(Registry::load(&toml).unwrap(), EngineConfig::default());
        let reply = chat(&e, "a", turn1.clone());
        join(&[&turn1, &reply.tokens, &text(&tok, "\nAnd?")])
    };
    assert!(!files(&tmp.path().join("cache"), "e").is_empty());
    let e = Engine::new(Registry::load(&toml).unwrap(), EngineConfig::default());
    let warm = chat(&e, "a", turn2.clone());
    let cold = chat(&e, "b", turn2);
    assert_eq!(warm.tokens, cold.tokens);
    assert!(warm.stats.cached_tokens > turn1.len(), "{:?}", warm.stats);
    let stats = e.stats();
    let a = stats.models.iter().find(|m| m.id == "a").unwrap();
    let d = a.prefix_cache.disk.as_ref().expect("model a has an SSD tier");
    assert_eq!((d.hits, d.off.as_deref()), (1, None), "{d:?}");
    assert!(stats.models.iter().find(|m| m.id == "b").unwrap().prefix_cache.disk.is_none());
}

/// Distinct prompts never take the folder past its cap (another file in it counts too), the
/// newest stays usable after a restart, and a tier opened with a smaller cap (another model
/// sharing the folder, a changed setting) evicts down to it first.
#[test]
fn the_folder_stays_under_its_cap() {
    let m = tiny();
    let dir = tempdir();
    let one = {
        let probe = tempdir();
        let mut c = on_disk(&disk_settings(probe.path(), 1 << 30));
        run(&m, Some(&mut c), &Prompt::text(probe_tokens(150, 0)), &opts(4, true));
        folder_bytes(probe.path())
    };
    std::fs::write(dir.path().join("notes.txt"), vec![b'x'; 1000]).unwrap();
    let cap = one * 5 / 2 + 1000;
    let settings = disk_settings(dir.path(), cap);
    let mut cache = on_disk(&settings);
    let mut last = Prompt::default();
    for i in 0..8 {
        last = Prompt::text(probe_tokens(150, 7 * i + 1));
        run(&m, Some(&mut cache), &last, &opts(4, true));
        let bytes = folder_bytes(dir.path());
        assert!(bytes <= cap, "prompt {i}: {bytes} bytes in a folder capped at {cap}");
    }
    let d = disk_stats(&cache);
    assert!(d.evictions > 0 && d.bytes <= cap, "{d:?}");
    assert!(dir.path().join("notes.txt").exists(), "only the tier's own files are evicted");
    let mut restarted = on_disk(&settings);
    let again = run(&m, Some(&mut restarted), &last, &opts(2, true));
    assert_eq!((again.stats.cached_tokens, disk_stats(&restarted).hits), (last.ids.len(), 1));
    let smaller = disk_settings(dir.path(), one + 1000);
    let trimmed = on_disk(&smaller);
    assert!(folder_bytes(dir.path()) <= one + 1000 && disk_stats(&trimmed).evictions > 0);
}

/// A flipped byte (in an entry, in a block), a truncated file, another model's file under this
/// model's name: each is detected, logged, deleted and ignored, and the output is the cold run's.
/// Another model's files under their own names are never read.
#[test]
fn a_bad_cache_file_is_ignored() {
    let m = tiny();
    let tok = Tokenizer::from_dir(&tiny_model_dir()).unwrap();
    let written = tempdir();
    let (turn2, _) = first_turn(&m, &tok, &disk_settings(written.path(), 1 << 30), true);
    let cold = run(&m, None, &turn2, &scored(16, true));
    let flip = |p: &std::path::Path, at: usize| {
        let mut b = std::fs::read(p).unwrap();
        let i = b.len() - 1 - at;
        b[i] ^= 0x10;
        std::fs::write(p, b).unwrap();
    };
    type Damage = Box<dyn Fn(&std::path::Path)>;
    let cases: Vec<(&str, Damage)> = vec![
        ("a flipped byte in an entry", Box::new(move |d| files(d, "e").iter().for_each(|p| flip(p, 3)))),
        ("a flipped byte in each block", Box::new(move |d| files(d, "b").iter().for_each(|p| flip(p, 100)))),
        (
            "a truncated entry",
            Box::new(|d| {
                for p in files(d, "e") {
                    let b = std::fs::read(&p).unwrap();
                    std::fs::write(&p, &b[..b.len() / 2]).unwrap();
                }
            }),
        ),
        (
            "another model's files under this model's names",
            Box::new(|d| {
                // Another identity in every header: the same names, the same tensors.
                let id = model_identity(&tiny_model_dir(), None).unwrap().into_bytes();
                for p in std::fs::read_dir(d).unwrap().flatten().map(|e| e.path()) {
                    let mut bytes = std::fs::read(&p).unwrap();
                    let at = bytes.windows(id.len()).position(|w| w == id).expect("the header names the model");
                    bytes[at..at + id.len()].fill(b'0');
                    std::fs::write(&p, bytes).unwrap();
                }
            }),
        ),
    ];
    for (what, damage) in cases {
        let dir = tempdir();
        copy_dir(written.path(), dir.path());
        damage(dir.path());
        let mut cache = on_disk(&disk_settings(dir.path(), 1 << 30));
        let warm = run(&m, Some(&mut cache), &turn2, &scored(16, true));
        same(&warm, &cold, what);
        let d = disk_stats(&cache);
        assert!(d.rejected >= 1 && d.hits == 0 && d.off.is_none(), "{what}: {d:?}");
    }
    // Another model's own files: not this model's names, never read.
    let dir = tempdir();
    copy_dir(written.path(), dir.path());
    let settings = disk_settings(dir.path(), 1 << 30);
    let mut other = PrefixCache::with_disk(1 << 30, Some(Disk::open(&settings, Ok("f".repeat(64)))));
    let warm = run(&m, Some(&mut other), &turn2, &scored(16, true));
    same(&warm, &cold, "another model's folder");
    let d = disk_stats(&other);
    // Its own entries are the two this turn wrote.
    assert_eq!((d.hits, d.rejected, d.entries), (0, 0, 2), "{d:?}");
}

/// A folder that cannot be written (here: under a regular file, which even root cannot create a
/// folder in; and a read-only folder where the user is not root) turns the tier off with the reason
/// in its stats (and the log); the memory tier goes on, output unchanged. A write budget spent
/// writes nothing more.
#[test]
fn an_unwritable_folder_or_a_spent_budget_falls_back() {
    let m = tiny();
    let tmp = tempdir();
    std::fs::write(tmp.path().join("file"), b"").unwrap();
    let mut folders = vec![(tmp.path().join("file").join("cache"), "cannot create the folder")];
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let ro = tmp.path().join("ro");
        std::fs::create_dir(&ro).unwrap();
        std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o555)).unwrap();
        // Root writes into a read-only folder anyway: check only where the mode holds.
        if std::fs::write(ro.join("probe"), b"").is_err() {
            folders.push((ro, "not writable"));
        }
    }
    let prompt = Prompt::text(probe_tokens(2 * BLOCK + 5, 9));
    let cold = run(&m, None, &prompt, &opts(8, false));
    for (dir, reason) in folders {
        let mut cache = on_disk(&disk_settings(&dir, 1 << 30));
        let off = disk_stats(&cache).off.unwrap_or_default();
        assert!(off.contains(reason), "{}: {off}", dir.display());
        assert_eq!(run(&m, Some(&mut cache), &prompt, &opts(8, false)).tokens, cold.tokens);
        let again = run(&m, Some(&mut cache), &prompt, &opts(8, false));
        assert_eq!((again.tokens, again.stats.cached_tokens), (cold.tokens.clone(), prompt.ids.len()));
        assert_eq!(disk_stats(&cache).bytes_written, 0);
    }
    let dir = tempdir();
    let settings = PrefixCacheDisk { write_bytes_per_minute: 1000, ..disk_settings(dir.path(), 1 << 30) };
    let mut cache = on_disk(&settings);
    assert_eq!(run(&m, Some(&mut cache), &prompt, &opts(8, false)).tokens, cold.tokens);
    let d = disk_stats(&cache);
    assert!(d.skipped > 0 && d.bytes_written <= 1000, "{d:?}");
    assert!(files(dir.path(), "e").is_empty());
}
