use super::*;
use crate::cache::{KvCache, LayerCache, LinearState};

/// A two-layer sequence state (one attention, one linear layer) after `len` positions whose rows
/// carry `seed`, so that restored rows can be told apart.
fn snapshot(len: usize, seed: f32, mtp: bool) -> Snapshot {
    let rows = |n: usize, s: f32| {
        let data: Vec<f32> = (0..n * 2).map(|i| s * 1000.0 + i as f32).collect();
        Array::from_slice(&data, &[1, 1, n as i32, 2]).unwrap()
    };
    let mut kv = KvCache::default();
    kv.update(&rows(len, seed), &rows(len, -seed)).unwrap();
    let linear = LinearState::with_state(rows(3, seed), rows(4, seed));
    let mut head = KvCache::default();
    if len > 1 {
        head.update(&rows(len - 1, seed + 0.5), &rows(len - 1, seed + 0.5)).unwrap();
    }
    let cache = [LayerCache::Kv(kv), LayerCache::Linear(linear)];
    Snapshot::take(&cache, mtp.then_some(&head), &rows(1, seed), len, BLOCK).unwrap()
}

fn ids(n: usize, salt: u64) -> Vec<u64> {
    (0..n as u64).map(|i| i * 7 + salt).collect()
}

fn keys(s: &Snapshot) -> Vec<f32> {
    let LayerSnapshot::Kv(rows) = &s.layers[0] else { panic!("layer 0 is attention") };
    mlx::concatenate(&rows.keys.iter().collect::<Vec<_>>(), 2).unwrap().to_f32_vec().unwrap()
}

#[test]
fn the_longest_stored_prefix_is_found_and_only_at_its_exact_length() {
    let mut cache = PrefixCache::new(1 << 30);
    let seq = ids(300, 1);
    // Rows follow the positions, as a model's would: the two snapshots share their first block.
    cache.insert(&seq[..100], snapshot(100, 1.0, false));
    cache.insert(&seq[..200], snapshot(200, 1.0, false));
    assert_eq!(cache.stats().blocks, 3);
    // A prompt going past both takes the longer; one that stops between them the shorter.
    let hit = cache.lookup(&seq[..250], false).unwrap();
    assert_eq!((hit.len, keys(&hit)), (200, keys(&snapshot(200, 1.0, false))));
    assert_eq!(cache.lookup(&seq[..199], false).unwrap().len, 100);
    assert_eq!(cache.lookup(&seq[..200], false).unwrap().len, 200, "a whole-prompt hit");
    // A different token inside the tail (mid block) or in a whole block breaks the match there.
    let mut edited = seq.clone();
    edited[150] += 1;
    assert_eq!(cache.lookup(&edited[..250], false).unwrap().len, 100);
    edited[10] += 1;
    assert!(cache.lookup(&edited[..250], false).is_none());
    // A state taken without the MTP head does not serve a request that drafts.
    assert!(cache.lookup(&seq[..250], true).is_none());
    let s = cache.stats();
    assert_eq!((s.lookups, s.hits, s.entries), (6, 4, 2));
    assert_eq!(s.cached_tokens, 200 + 100 + 200 + 100);
}

#[test]
fn entries_of_one_conversation_share_their_blocks() {
    let mut cache = PrefixCache::new(1 << 30);
    let seq = ids(300, 3);
    let one = snapshot(200, 1.0, true);
    let alone = one.bytes();
    cache.insert(&seq[..200], one);
    cache.insert(&seq[..260], snapshot(260, 1.0, true));
    let s = cache.stats();
    // Blocks 0..3 are kept once: the second entry adds one block and its own state.
    assert_eq!(s.blocks, 4);
    assert!(s.bytes < 2 * alone as u64, "{} bytes for two entries of {alone}", s.bytes);
    let hit = cache.lookup(&seq, true).unwrap();
    assert_eq!(hit.len, 260);
    assert_eq!(hit.mtp.as_ref().unwrap().len(), 259);
}

/// Under a loop of distinct prompts the bytes never pass the cap, the least recently used entry
/// goes first, and what stays is still found.
#[test]
fn the_cap_holds_and_eviction_is_least_recently_used() {
    let one = {
        let mut probe = PrefixCache::new(u64::MAX);
        probe.insert(&ids(130, 0), snapshot(130, 0.0, true));
        probe.stats().bytes
    };
    let mut cache = PrefixCache::new(3 * one + one / 2);
    for i in 0..20u64 {
        cache.insert(&ids(130, 1000 * (i + 1)), snapshot(130, i as f32, true));
        assert!(cache.stats().bytes <= cache.stats().cap_bytes, "after insert {i}");
        // The first prompt stays in use, so it is never the least recent.
        assert!(cache.lookup(&ids(130, 1000), true).is_some(), "after insert {i}");
    }
    let s = cache.stats();
    assert_eq!(s.entries, 3);
    assert_eq!(s.evictions, 17);
    assert!(cache.lookup(&ids(130, 20_000), true).is_some(), "the newest entry stays");
    assert!(cache.lookup(&ids(130, 2000), true).is_none(), "an old entry went");
    // Larger than the whole cap: not kept, nothing evicted for it.
    let mut small = PrefixCache::new(one / 2);
    small.insert(&ids(130, 5), snapshot(130, 5.0, true));
    assert_eq!((small.stats().entries, small.stats().bytes), (0, 0));
    let mut off = PrefixCache::new(0);
    off.insert(&ids(130, 5), snapshot(130, 5.0, true));
    assert!(off.lookup(&ids(130, 5), true).is_none());
    assert_eq!(off.stats().lookups, 0);
}

#[test]
fn image_pads_are_keyed_by_the_image() {
    use crate::model::vision_input::ImageInput;
    let image = |v: f32| ImageInput {
        pixel_values: vec![v; 4 * 6],
        grid_thw: [1, 2, 2],
        patch_dim: 6,
        merge_size: 2,
        source: "test".into(),
    };
    let prompt = |v: f32| Prompt { ids: vec![1, 2, 9, 3], images: vec![image(v)] };
    let a = identities(&prompt(0.5), Some(9)).unwrap();
    let b = identities(&prompt(0.25), Some(9)).unwrap();
    assert_eq!((a[..2].to_vec(), a[3]), (vec![1, 2], 3));
    assert!(a[2] >= 1 << 63 && a[2] != b[2]);
    assert_eq!(a, identities(&prompt(0.5), Some(9)).unwrap());
    // Pads that do not match the images: no key.
    assert!(identities(&Prompt { ids: vec![9, 9], images: vec![image(0.5)] }, Some(9)).is_none());
    assert!(identities(&prompt(0.5), None).is_none());
}
