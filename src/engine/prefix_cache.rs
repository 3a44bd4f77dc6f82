//! The prefix cache of one loaded model (docs/MODEL.md §4.6): snapshots of a sequence's state keyed
//! by the positions they cover, so that a request whose prompt starts with a cached sequence (the
//! next turn of a chat resends the whole history) restores it and prefills only the rest.
//!
//! A position's identity is its token id, or for an image pad a hash of the image's pixels, so two
//! images never share an entry. KV rows are kept per block of [`BLOCK`] positions, once for every
//! entry whose prefix holds the block (a block is named by a hash chained over everything before
//! it); the linear-attention states and the rows past the last whole block belong to one entry,
//! usable only at exactly its length. The byte cap holds after every insertion: the least recently
//! used entry goes first, and a block with the last entry that holds it.

use std::collections::HashMap;

use mlx::Array;
use serde::Serialize;
use sha2::{Digest, Sha256};
use ts_rs::TS;

use crate::cache::snapshot::{LayerSnapshot, Rows};
use crate::cache::Snapshot;
use crate::generate::{GenerateOptions, Kept, Prompt, Resume};
use crate::model::Qwen35;
use crate::registry::ModelEntry;

/// Positions per KV block: small enough that a hit rarely ends far from a block, large enough
/// that the per-block bookkeeping and a restore's concatenation stay cheap.
pub const BLOCK: usize = 64;

/// A long prompt is also snapshotted inside its prefill every this many tokens (a multiple of
/// [`BLOCK`]), so that a prompt sharing only its start with it (an edited message, a new question
/// after the same documents) resumes from the last boundary before they differ. Each such snapshot
/// adds its own linear-attention state (KV blocks are shared), so boundaries are far apart.
pub const SNAPSHOT_EVERY: usize = 32 * BLOCK;

/// The cap when none is set: 2 GiB, or an eighth of the machine's memory when that is less.
pub const DEFAULT_CAP: u64 = 2 << 30;

/// `TANDEM_PREFIX_CACHE_BYTES` overrides the cap of every model (0 turns the cache off).
pub const CAP_ENV: &str = "TANDEM_PREFIX_CACHE_BYTES";

pub mod disk;

pub use disk::{model_identity, Disk, DiskStats};

/// What `/api/stats` shows of one model's prefix cache.
#[derive(Debug, Clone, Default, Serialize, PartialEq, TS)]
pub struct PrefixCacheStats {
    /// The byte cap (0: the cache is off).
    pub cap_bytes: u64,
    pub bytes: u64,
    pub entries: usize,
    pub blocks: usize,
    pub lookups: u64,
    pub hits: u64,
    /// hits / lookups (0 before the first lookup).
    pub hit_rate: f64,
    /// Prompt tokens restored instead of prefilled, over all hits.
    pub cached_tokens: u64,
    pub evictions: u64,
    /// The SSD tier, when models.toml gives the model one.
    pub disk: Option<DiskStats>,
}

type Key = [u8; 16];

/// The chain's start: the name of the empty prefix.
const ROOT: Key = [0; 16];

struct Block {
    ids: Vec<u64>,
    /// Keys and values of each attention layer, in layer order.
    kv: Vec<(Array, Array)>,
    /// The MTP head's entries whose next token lies in this block.
    mtp: Option<(Array, Array)>,
    refs: usize,
    bytes: usize,
}

struct Entry {
    /// The chained names of its whole blocks.
    blocks: Vec<Key>,
    /// Identities past the last whole block.
    tail: Vec<u64>,
    /// The snapshot without its whole blocks' rows.
    own: Snapshot,
    used: u64,
    bytes: usize,
}

pub struct PrefixCache {
    cap: u64,
    blocks: HashMap<Key, Block>,
    entries: HashMap<Key, Entry>,
    /// Entries by the name of their last whole block (ROOT for none).
    by_blocks: HashMap<Key, Vec<Key>>,
    bytes: u64,
    tick: u64,
    stats: PrefixCacheStats,
    disk: Option<Disk>,
    /// Snapshots inside a prompt every this many tokens (0: only at the ends).
    every: usize,
}

impl PrefixCache {
    pub fn new(cap: u64) -> PrefixCache {
        PrefixCache::with_disk(cap, None)
    }

    /// A cache of `cap` bytes in memory over the SSD tier `disk` (used while `cap` is not 0).
    pub fn with_disk(cap: u64, disk: Option<Disk>) -> PrefixCache {
        PrefixCache {
            cap,
            blocks: HashMap::new(),
            entries: HashMap::new(),
            by_blocks: HashMap::new(),
            bytes: 0,
            tick: 0,
            stats: PrefixCacheStats { cap_bytes: cap, ..Default::default() },
            disk,
            every: SNAPSHOT_EVERY,
        }
    }

    /// Snapshots inside a prompt every `tokens` (rounded down to whole blocks; 0: only at the
    /// end of prefill and of the generation).
    pub fn snapshot_every(mut self, tokens: usize) -> PrefixCache {
        self.every = tokens / BLOCK * BLOCK;
        self
    }

    pub fn enabled(&self) -> bool {
        self.cap > 0
    }

    pub fn stats(&self) -> PrefixCacheStats {
        let s = &self.stats;
        PrefixCacheStats {
            cap_bytes: self.cap,
            bytes: self.bytes,
            entries: self.entries.len(),
            blocks: self.blocks.len(),
            hit_rate: if s.lookups > 0 { s.hits as f64 / s.lookups as f64 } else { 0.0 },
            disk: self.disk.as_ref().map(Disk::stats),
            ..s.clone()
        }
    }

    /// What a generation of `prompt` restores and keeps: the longest cached prefix (with the MTP
    /// head's state when the generation drafts) and, while the cache is on, snapshots to keep.
    /// Also returns the prompt's identities, for [`PrefixCache::keep`].
    pub fn resume(&mut self, model: &Qwen35, prompt: &Prompt, opts: &GenerateOptions) -> (Option<Vec<u64>>, Resume) {
        if !self.enabled() {
            return (None, Resume::default());
        }
        let Some(ids) = identities(prompt, model.vision().and_then(|v| v.config.image_token_id)) else {
            return (None, Resume::default());
        };
        let restored = self.lookup(&ids, opts.runs_mtp(model));
        let every = (self.every > 0).then_some(self.every);
        (Some(ids), Resume { restored, keep: Some(BLOCK), every })
    }

    /// Keeps what a generation of the prompt of identities `ids` snapshotted. The SSD tier writes
    /// the last (longest) first: the next turn resumes from it, and the write budget may not cover
    /// both.
    pub fn keep(&mut self, ids: &[u64], kept: Vec<Kept>) {
        let mut to_disk = Vec::new();
        for k in kept {
            // The snapshots cover the prompt, then generated tokens (text).
            let p = ids.len().min(k.tokens.len());
            let covered: Vec<u64> = ids[..p].iter().copied().chain(k.tokens[p..].iter().map(|&t| t as u64)).collect();
            if self.disk.is_some() {
                to_disk.push((covered.clone(), k.snapshot.clone()));
            }
            self.insert_memory(&covered, k.snapshot, k.inside);
        }
        for (covered, snapshot) in to_disk.iter().rev() {
            self.store(covered, snapshot);
        }
    }

    /// Writes `snapshot`, the state after `ids`, to the SSD tier (what it lacks of it).
    fn store(&mut self, ids: &[u64], snapshot: &Snapshot) -> u64 {
        match &mut self.disk {
            Some(disk) if self.cap > 0 => disk.store(ids, &chain(ids), snapshot),
            _ => 0,
        }
    }

    /// The longest cached prefix of `ids` (with the MTP head's state when `mtp`), as a snapshot
    /// that shares the stored arrays (restoring it copies them into new buffers).
    pub fn lookup(&mut self, ids: &[u64], mtp: bool) -> Option<Snapshot> {
        if !self.enabled() {
            return None;
        }
        self.stats.lookups += 1;
        let chain = chain(ids);
        let memory = self.lookup_memory(ids, &chain, mtp);
        let beat = memory.as_ref().map_or(0, |s| s.len);
        let from_disk = self.disk.as_mut().and_then(|d| d.lookup(ids, &chain, mtp, beat));
        let found = match from_disk {
            Some(snapshot) => {
                // Promoted: the next turn finds it in memory.
                self.insert_memory(&ids[..snapshot.len], snapshot.clone(), false);
                Some(snapshot)
            }
            None => memory,
        };
        if let Some(s) = &found {
            self.stats.hits += 1;
            self.stats.cached_tokens += s.len as u64;
        }
        found
    }

    /// The longest prefix of `ids` in memory, without counting the lookup.
    fn lookup_memory(&mut self, ids: &[u64], chain: &[Key], mtp: bool) -> Option<Snapshot> {
        for b in (0..chain.len()).rev() {
            let Some(candidates) = self.by_blocks.get(&chain[b]) else { continue };
            let best = candidates
                .iter()
                .filter_map(|k| self.entries.get(k).map(|e| (k, e)))
                .filter(|(_, e)| {
                    let len = b * BLOCK + e.tail.len();
                    len <= ids.len() && e.tail == ids[b * BLOCK..len] && (!mtp || e.own.has_mtp())
                })
                .filter(|(_, e)| {
                    // The names are hashes: the identities themselves decide.
                    e.blocks
                        .iter()
                        .enumerate()
                        .all(|(i, k)| self.blocks.get(k).is_some_and(|bl| bl.ids == ids[i * BLOCK..(i + 1) * BLOCK]))
                })
                .max_by_key(|(_, e)| e.tail.len())
                .map(|(k, _)| *k);
            let Some(key) = best else { continue };
            let snapshot = self.assemble(&key)?;
            self.tick += 1;
            if let Some(e) = self.entries.get_mut(&key) {
                e.used = self.tick;
            }
            return Some(snapshot);
        }
        None
    }

    /// Keeps `snapshot`, the state after `ids`, in memory and on the SSD tier.
    pub fn insert(&mut self, ids: &[u64], snapshot: Snapshot) {
        self.store(ids, &snapshot);
        self.insert_memory(ids, snapshot, false);
    }

    /// Keeps `snapshot` in memory, evicting the least recently used entries while the cache holds
    /// more than its cap. A snapshot larger than the cap alone is not kept. One taken `inside` a
    /// prompt's prefill counts as the least recently used of all until a lookup uses it, and makes
    /// room only by evicting other such snapshots: it never pushes out a turn's end.
    fn insert_memory(&mut self, ids: &[u64], snapshot: Snapshot, inside: bool) {
        if !self.enabled() || snapshot.block != BLOCK || ids.len() != snapshot.len || snapshot.len == 0 {
            return;
        }
        let chain = chain(ids);
        let whole = snapshot.len / BLOCK;
        let key = entry_key(&chain[whole], &ids[whole * BLOCK..]);
        self.tick += 1;
        if let Some(e) = self.entries.get_mut(&key) {
            if !inside {
                e.used = self.tick;
            }
            if e.own.has_mtp() || !snapshot.has_mtp() {
                return;
            }
            // The same prefix again, now with the MTP head's state: the new one replaces it.
            self.remove(&key);
        }
        // What this entry holds once every other one is gone: it must fit the cap alone.
        let own_bytes = snapshot.own_bytes() + (snapshot.len - whole * BLOCK) * 8;
        let mut footprint = own_bytes;
        for (b, name) in chain[1..=whole].iter().enumerate() {
            footprint += match self.blocks.get(name) {
                None => block_bytes(&snapshot, b),
                Some(bl) if bl.mtp.is_none() => bl.bytes + mtp_bytes(&snapshot, b),
                Some(bl) => bl.bytes,
            };
        }
        if footprint as u64 > self.cap {
            tracing::debug!(
                bytes = footprint,
                cap = self.cap,
                "prefix cache: a snapshot larger than the cap is not kept"
            );
            return;
        }
        for (b, name) in chain[1..=whole].iter().enumerate() {
            if let Some(bl) = self.blocks.get_mut(name) {
                bl.refs += 1;
                if bl.mtp.is_none() {
                    if let Some(rows) = &snapshot.mtp {
                        bl.mtp = Some((rows.keys[b].clone(), rows.values[b].clone()));
                        let n = mtp_bytes(&snapshot, b);
                        bl.bytes += n;
                        self.bytes += n as u64;
                    }
                }
                continue;
            }
            let kv = snapshot
                .layers
                .iter()
                .filter_map(|l| match l {
                    LayerSnapshot::Kv(rows) => Some((rows.keys[b].clone(), rows.values[b].clone())),
                    LayerSnapshot::Linear { .. } => None,
                })
                .collect();
            let mtp = snapshot.mtp.as_ref().map(|rows| (rows.keys[b].clone(), rows.values[b].clone()));
            let bytes = block_bytes(&snapshot, b);
            self.bytes += bytes as u64;
            let ids = ids[b * BLOCK..(b + 1) * BLOCK].to_vec();
            self.blocks.insert(*name, Block { ids, kv, mtp, refs: 1, bytes });
        }
        let own = without_blocks(snapshot, whole);
        let tail = ids[whole * BLOCK..].to_vec();
        self.bytes += own_bytes as u64;
        let used = if inside { 0 } else { self.tick };
        let entry = Entry { blocks: chain[1..=whole].to_vec(), tail, own, used, bytes: own_bytes };
        self.entries.insert(key, entry);
        self.by_blocks.entry(chain[whole]).or_default().push(key);
        while self.bytes > self.cap {
            let oldest = self
                .entries
                .iter()
                .filter(|(k, e)| **k != key && (!inside || e.used == 0))
                .min_by_key(|(_, e)| e.used)
                .map(|(k, _)| *k);
            let Some(oldest) = oldest else {
                if inside {
                    // No room without pushing out what turns kept: this one goes.
                    self.remove(&key);
                    self.stats.evictions += 1;
                }
                break;
            };
            self.remove(&oldest);
            self.stats.evictions += 1;
        }
    }

    /// Drops an entry, and the blocks no other entry holds.
    fn remove(&mut self, key: &Key) {
        let Some(e) = self.entries.remove(key) else { return };
        self.bytes -= e.bytes as u64;
        let last = e.blocks.last().copied().unwrap_or(ROOT);
        if let Some(list) = self.by_blocks.get_mut(&last) {
            list.retain(|k| k != key);
            if list.is_empty() {
                self.by_blocks.remove(&last);
            }
        }
        for name in &e.blocks {
            if let Some(bl) = self.blocks.get_mut(name) {
                bl.refs -= 1;
                if bl.refs == 0 {
                    self.bytes -= bl.bytes as u64;
                    self.blocks.remove(name);
                }
            }
        }
    }

    /// An entry's snapshot with its blocks' rows put back in front.
    fn assemble(&self, key: &Key) -> Option<Snapshot> {
        let e = self.entries.get(key)?;
        let blocks: Vec<&Block> = e.blocks.iter().map(|k| self.blocks.get(k)).collect::<Option<_>>()?;
        let mut snap = e.own.clone();
        let mut kv_layer = 0;
        for l in &mut snap.layers {
            if let LayerSnapshot::Kv(rows) = l {
                let (keys, values) = blocks.iter().map(|b| b.kv[kv_layer].clone()).unzip();
                prepend(rows, keys, values);
                kv_layer += 1;
            }
        }
        if let Some(rows) = &mut snap.mtp {
            let (keys, values) = blocks.iter().map(|b| b.mtp.clone()).collect::<Option<Vec<_>>>()?.into_iter().unzip();
            prepend(rows, keys, values);
        }
        Some(snap)
    }
}

fn prepend(rows: &mut Rows, mut keys: Vec<Array>, mut values: Vec<Array>) {
    keys.append(&mut rows.keys);
    values.append(&mut rows.values);
    rows.keys = keys;
    rows.values = values;
}

/// `snapshot` without the rows of its first `whole` blocks (which the blocks keep).
fn without_blocks(mut snapshot: Snapshot, whole: usize) -> Snapshot {
    let cut = |rows: &mut Rows| {
        rows.keys.drain(..whole.min(rows.keys.len()));
        rows.values.drain(..whole.min(rows.values.len()));
    };
    for l in &mut snapshot.layers {
        if let LayerSnapshot::Kv(rows) = l {
            cut(rows);
        }
    }
    if let Some(rows) = &mut snapshot.mtp {
        cut(rows);
    }
    snapshot
}

fn pair_bytes(rows: &Rows, b: usize) -> usize {
    rows.keys.get(b).map_or(0, Array::nbytes) + rows.values.get(b).map_or(0, Array::nbytes)
}

fn mtp_bytes(snapshot: &Snapshot, b: usize) -> usize {
    snapshot.mtp.as_ref().map_or(0, |rows| pair_bytes(rows, b))
}

/// Block `b`'s rows in every attention layer and the head, and its identities.
fn block_bytes(snapshot: &Snapshot, b: usize) -> usize {
    let kv: usize = snapshot
        .layers
        .iter()
        .map(|l| match l {
            LayerSnapshot::Kv(rows) => pair_bytes(rows, b),
            LayerSnapshot::Linear { .. } => 0,
        })
        .sum();
    kv + mtp_bytes(snapshot, b) + BLOCK * 8
}

/// The names of the prefixes of `ids` that end at a block boundary: `[ROOT, after block 0, ...]`.
fn chain(ids: &[u64]) -> Vec<Key> {
    let mut names = vec![ROOT];
    for block in ids.chunks_exact(BLOCK) {
        let mut h = Sha256::new();
        h.update(names[names.len() - 1]);
        for id in block {
            h.update(id.to_le_bytes());
        }
        names.push(truncate(h.finalize().as_slice()));
    }
    names
}

fn entry_key(blocks: &Key, tail: &[u64]) -> Key {
    let mut h = Sha256::new();
    h.update(b"entry");
    h.update(blocks);
    h.update((tail.len() as u64).to_le_bytes());
    for id in tail {
        h.update(id.to_le_bytes());
    }
    truncate(h.finalize().as_slice())
}

fn truncate(digest: &[u8]) -> Key {
    let mut k = [0; 16];
    k.copy_from_slice(&digest[..16]);
    k
}

/// Each position's identity: its token id, or for an image pad (`image_id`) a hash of that image's
/// pixels with the top bit set (token ids are 32-bit, so the two never meet). None when the pads
/// and the images do not line up, which the cache then leaves alone.
pub fn identities(prompt: &Prompt, image_id: Option<u32>) -> Option<Vec<u64>> {
    let mut out: Vec<u64> = prompt.ids.iter().map(|&t| t as u64).collect();
    if prompt.images.is_empty() {
        return Some(out);
    }
    let image_id = image_id?;
    let mut images = prompt.images.iter();
    let mut i = 0;
    while i < out.len() {
        if prompt.ids[i] != image_id {
            i += 1;
            continue;
        }
        let image = images.next()?;
        let n = image.tokens();
        if n == 0 || i + n > out.len() || prompt.ids[i..i + n].iter().any(|&t| t != image_id) {
            return None;
        }
        let mut h = Sha256::new();
        h.update(image.grid_thw.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>());
        h.update((image.patch_dim as u64).to_le_bytes());
        h.update(image.merge_size.to_le_bytes());
        for v in &image.pixel_values {
            h.update(v.to_le_bytes());
        }
        let digest = h.finalize();
        let mut word = [0; 8];
        word.copy_from_slice(&digest[..8]);
        let identity = u64::from_le_bytes(word) | 1 << 63;
        out[i..i + n].iter_mut().for_each(|x| *x = identity);
        i += n;
    }
    images.next().is_none().then_some(out)
}

/// The cap: [`CAP_ENV`] when set (bytes; 0 turns the cache off), else the model's
/// `prefix_cache_bytes` in models.toml, else [`DEFAULT_CAP`] or an eighth of the machine's memory,
/// whichever is less.
pub fn cap(setting: Option<u64>) -> u64 {
    if let Some(v) = std::env::var_os(CAP_ENV) {
        match v.to_str().and_then(|s| s.trim().parse::<u64>().ok()) {
            Some(n) => return n,
            None => tracing::warn!("{CAP_ENV}={v:?} is not a number of bytes; ignored"),
        }
    }
    if let Some(n) = setting {
        return n;
    }
    let mut system = sysinfo::System::new();
    system.refresh_memory();
    match system.total_memory() {
        0 => DEFAULT_CAP,
        total => DEFAULT_CAP.min(total / 8),
    }
}

/// The prefix cache of the model of `entry`, loaded with `dtype`: the memory tier of [`cap`] bytes,
/// over the SSD tier models.toml gives the model (`prefix_cache_disk`), which needs the memory tier on.
pub fn for_model(entry: &ModelEntry, dtype: Option<mlx::Dtype>) -> PrefixCache {
    let cap = cap(entry.prefix_cache_bytes);
    let disk = match &entry.prefix_cache_disk {
        Some(settings) if cap > 0 => Some(Disk::open(settings, model_identity(&entry.path, dtype))),
        _ => None,
    };
    PrefixCache::with_disk(cap, disk)
}

#[cfg(test)]
mod tests;
