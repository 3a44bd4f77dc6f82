//! The SSD tier of the prefix cache (docs/MODEL.md §4.6): the memory tier's blocks and entries as
//! files in one folder, so that a conversation's state outlives the process and the model's unload.
//!
//! Three kinds of file, each a safetensors file named `<model>-<kind>-<key>.safetensors`: a block's
//! KV rows of every attention layer and its 64 identities (`b`), the MTP head's rows of a block
//! (`m`), and an entry (`e`): the linear-attention state, the last hidden state, the rows past the
//! last whole block and the names of its blocks. A block is written once, by the first entry that
//! holds it, so a turn writes its new tokens' rows and one entry's own state, not the history.
//!
//! Every file's header carries the format version, the model's identity (a hash of its config and
//! weight files' headers), the token count and a SHA-256 of its tensors; a file that fails any of
//! these checks is logged, deleted and treated as absent. Files are written to a temporary file in
//! the folder and renamed. The folder's cap holds before every write: all regular files in it count
//! (every model's), and this tier's files go least recently used first (by mtime, which a hit or a
//! reuse renews).

use std::collections::{HashMap, HashSet};
use std::fs;
use std::io::{self, Read, Seek};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use mlx::{Array, Dtype};
use serde::Serialize;
use sha2::{Digest, Sha256};
use ts_rs::TS;

use super::{entry_key, Key, BLOCK};
use crate::cache::snapshot::{LayerSnapshot, Rows};
use crate::cache::Snapshot;
use crate::registry::PrefixCacheDisk;

const FORMAT: &str = "tandem-prefix-cache";
const VERSION: &str = "1";
const SUFFIX: &str = ".safetensors";
/// A temporary file this old is a crashed write's: it counts against the cap and may be removed.
const STALE_TEMP: Duration = Duration::from_secs(600);
/// A header larger than this is not one of ours (an entry's names its blocks: 32 bytes each).
const MAX_HEADER: u64 = 64 << 20;

/// Held while a tier scans, evicts or writes: models loaded together may share a folder and its cap.
static FOLDER: Mutex<()> = Mutex::new(());

/// What `/api/stats` shows of a model's SSD tier.
#[derive(Debug, Clone, Default, Serialize, PartialEq, TS)]
pub struct DiskStats {
    pub dir: String,
    pub cap_bytes: u64,
    /// Bytes in the folder (every model's files), as of this tier's last scan or write.
    pub bytes: u64,
    /// Bytes allowed per minute (a write that would pass it waits for a later turn).
    pub write_bytes_per_minute: u64,
    /// This model's entries in the folder.
    pub entries: usize,
    /// Lookups served from the disk (counted in the cache's hits too).
    pub hits: u64,
    pub bytes_written: u64,
    /// What the last stored snapshot wrote.
    pub last_write_bytes: u64,
    /// Writes not made: the budget or the cap had no room.
    pub skipped: u64,
    /// Files found corrupt, truncated or of another model, deleted and ignored.
    pub rejected: u64,
    pub evictions: u64,
    /// Why the tier is off (it then neither reads nor writes), e.g. a read-only folder.
    pub off: Option<String>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Entry,
    Block,
    Head,
}

impl Kind {
    fn letter(self) -> char {
        match self {
            Kind::Entry => 'e',
            Kind::Block => 'b',
            Kind::Head => 'm',
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Entry => "entry",
            Kind::Block => "block",
            Kind::Head => "mtp-block",
        }
    }
}

/// An entry on disk, as the index knows it (from its header).
struct Indexed {
    key: Key,
    tail: Vec<u64>,
    mtp: bool,
}

/// A file's header fields and its tensors by name.
type Decoded = (HashMap<String, String>, HashMap<String, Array>);

/// Why a load failed: a file that is gone (evicted: not an error) or one that is bad.
enum Fail {
    Missing(String),
    Bad(PathBuf, String),
}

pub struct Disk {
    dir: PathBuf,
    cap: u64,
    identity: String,
    /// The identity's first 12 hex digits: this model's file names start with it.
    prefix: String,
    per_second: f64,
    allowance: f64,
    refilled: Instant,
    /// This model's entries by the name of their last whole block.
    index: HashMap<Key, Vec<Indexed>>,
    stats: DiskStats,
}

impl Disk {
    /// The tier in `settings.dir` for the model of `identity` ([`model_identity`]; an error turns
    /// the tier off). Counts what the folder holds and evicts down to the cap. Never fails: a
    /// folder it cannot create or write leaves the tier off, with the reason logged and in its stats.
    pub fn open(settings: &PrefixCacheDisk, identity: Result<String, String>) -> Disk {
        let per_minute = settings.write_bytes_per_minute;
        let mut disk = Disk {
            dir: settings.dir.clone(),
            cap: settings.cap_bytes,
            prefix: String::new(),
            identity: String::new(),
            per_second: per_minute as f64 / 60.0,
            allowance: per_minute as f64,
            refilled: Instant::now(),
            index: HashMap::new(),
            stats: DiskStats {
                dir: settings.dir.display().to_string(),
                cap_bytes: settings.cap_bytes,
                write_bytes_per_minute: per_minute,
                ..Default::default()
            },
        };
        let started = identity.and_then(|id| {
            disk.prefix = id.chars().take(12).collect();
            disk.identity = id;
            disk.start()
        });
        if let Err(why) = started {
            disk.turn_off(why);
        } else {
            tracing::info!(
                dir = %disk.dir.display(),
                cap = disk.cap,
                bytes = disk.stats.bytes,
                entries = disk.stats.entries,
                "prefix cache: SSD tier ready"
            );
        }
        disk
    }

    fn start(&mut self) -> Result<(), String> {
        let dir = self.dir.display().to_string();
        fs::create_dir_all(&self.dir).map_err(|e| format!("cannot create the folder {dir}: {e}"))?;
        let probe = self.dir.join(format!(".probe-{}", std::process::id()));
        crate::atomic_file::write_atomic(&probe, b"")
            .and_then(|()| fs::remove_file(&probe))
            .map_err(|e| format!("the folder {dir} is not writable: {e}"))?;
        let _folder = FOLDER.lock().unwrap_or_else(|p| p.into_inner());
        let listing = fs::read_dir(&self.dir).map_err(|e| format!("cannot list the folder {dir}: {e}"))?;
        for item in listing.flatten() {
            let name = item.file_name().to_string_lossy().into_owned();
            let Some((Kind::Entry, key)) = self.ours(&name) else { continue };
            match self.read_index(&item.path(), &key) {
                Ok(indexed) => self.add(indexed),
                Err(why) => self.reject(&item.path(), &why),
            }
        }
        self.make_room(0, &HashSet::new())
    }

    fn turn_off(&mut self, why: String) {
        tracing::warn!("prefix cache: the SSD tier is off: {why}; the memory tier goes on alone");
        self.stats.off = Some(why);
        self.index.clear();
        self.stats.entries = 0;
    }

    pub fn stats(&self) -> DiskStats {
        self.stats.clone()
    }

    fn add(&mut self, indexed: (Key, Indexed)) {
        let (last, e) = indexed;
        let list = self.index.entry(last).or_default();
        list.retain(|x| x.key != e.key);
        list.push(e);
        self.stats.entries = self.index.values().map(Vec::len).sum();
    }

    fn unindex(&mut self, key: &Key) {
        self.index.retain(|_, list| {
            list.retain(|x| x.key != *key);
            !list.is_empty()
        });
        self.stats.entries = self.index.values().map(Vec::len).sum();
    }

    fn path(&self, kind: Kind, key: &Key) -> PathBuf {
        self.dir.join(format!("{}-{}-{}{SUFFIX}", self.prefix, kind.letter(), hex(key)))
    }

    /// The kind and key of one of this model's files.
    fn ours(&self, name: &str) -> Option<(Kind, Key)> {
        let (kind, key) = parse_name(name)?;
        (name.starts_with(&self.prefix) && name.as_bytes().get(12) == Some(&b'-')).then_some((kind, key))
    }

    /// A bad file: logged, deleted (it would fail every time), and forgotten.
    fn reject(&mut self, path: &Path, why: &str) {
        tracing::warn!(file = %path.display(), "prefix cache: ignoring a bad SSD cache file: {why}");
        self.stats.rejected += 1;
        if let Some((Kind::Entry, key)) = path.file_name().and_then(|n| self.ours(&n.to_string_lossy())) {
            self.unindex(&key);
        }
        let _ = fs::remove_file(path);
    }

    /// An entry file's index record, from its header alone.
    fn read_index(&self, path: &Path, key: &Key) -> Result<(Key, Indexed), String> {
        let meta = read_header(path)?;
        check_meta(&meta, &self.identity, Kind::Entry, key)?;
        let last = meta.get("last_block").and_then(|s| unhex(s)).ok_or("no `last_block` in the header")?;
        let tail = parse_ids(meta.get("tail").map_or("", String::as_str)).ok_or("a bad `tail` in the header")?;
        let len: usize = meta.get("len").and_then(|s| s.parse().ok()).ok_or("no `len` in the header")?;
        if len % BLOCK != tail.len() || len == 0 {
            return Err(format!("`len` {len} does not fit a tail of {} positions", tail.len()));
        }
        if entry_key(&last, &tail) != *key {
            return Err("the file's name is not its content's key".into());
        }
        let mtp = meta.get("mtp").is_some_and(|s| s == "1");
        Ok((last, Indexed { key: *key, tail, mtp }))
    }

    /// The longest entry on disk for `ids` (whose chained block names are `chain`) longer than
    /// `beat` positions, with the MTP head's state when `mtp`. A hit renews its files' mtimes.
    pub fn lookup(&mut self, ids: &[u64], chain: &[Key], mtp: bool, beat: usize) -> Option<Snapshot> {
        if self.stats.off.is_some() {
            return None;
        }
        for b in (0..chain.len()).rev() {
            if b * BLOCK + BLOCK <= beat {
                break;
            }
            let Some(list) = self.index.get(&chain[b]) else { continue };
            let mut candidates: Vec<(Key, usize)> = list
                .iter()
                .filter(|e| {
                    let len = b * BLOCK + e.tail.len();
                    len > beat && len <= ids.len() && e.tail == ids[b * BLOCK..len] && (!mtp || e.mtp)
                })
                .map(|e| (e.key, e.tail.len()))
                .collect();
            candidates.sort_by_key(|c| std::cmp::Reverse(c.1));
            for (key, _) in candidates {
                let t = Instant::now();
                match self.load(&key, ids, chain, b) {
                    Ok((snapshot, files)) => {
                        for f in &files {
                            touch(f);
                        }
                        self.stats.hits += 1;
                        tracing::debug!(
                            len = snapshot.len,
                            files = files.len(),
                            ms = t.elapsed().as_secs_f64() * 1e3,
                            "prefix cache: restored from the SSD tier"
                        );
                        return Some(snapshot);
                    }
                    Err(Fail::Missing(why)) => {
                        // Part of it was evicted (by this tier or a model sharing the folder).
                        tracing::debug!("prefix cache: an SSD entry is incomplete ({why}); dropped");
                        self.unindex(&key);
                        let _ = fs::remove_file(self.path(Kind::Entry, &key));
                    }
                    Err(Fail::Bad(path, why)) => {
                        self.reject(&path, &why);
                        self.unindex(&key);
                    }
                }
            }
        }
        None
    }

    /// Entry `key` (over `b` whole blocks) as a snapshot, and the files it was read from.
    fn load(&self, key: &Key, ids: &[u64], chain: &[Key], b: usize) -> Result<(Snapshot, Vec<PathBuf>), Fail> {
        let entry_path = self.path(Kind::Entry, key);
        let (meta, mut t) = self.read(&entry_path, Kind::Entry, key)?;
        let bad = |why: String| Fail::Bad(entry_path.clone(), why);
        let field = |k: &str| meta.get(k).cloned().ok_or_else(|| bad(format!("no `{k}` in the header")));
        let len: usize = field("len")?.parse().map_err(|_| bad("a bad `len`".into()))?;
        if len / BLOCK != b || len > ids.len() {
            return Err(bad(format!("`len` {len} is not this prefix's")));
        }
        let names = t.remove("blocks");
        let names = match names {
            Some(a) => a.to_bytes().map_err(|e| bad(e.to_string()))?,
            None if b == 0 => Vec::new(),
            None => return Err(bad("no `blocks` tensor".into())),
        };
        if names.len() != b * 16 || names.chunks_exact(16).zip(&chain[1..=b]).any(|(n, c)| n != c) {
            return Err(bad("its blocks are not this prefix's".into()));
        }
        let kinds: Vec<String> = field("layers")?.split(',').map(str::to_owned).collect();
        let ropes: Vec<i32> = field("rope")?.split(',').map(|s| s.parse().unwrap_or(0)).collect();
        let n_kv = kinds.iter().filter(|k| *k == "kv").count();
        let mtp = field("mtp")? == "1";
        let mut files = vec![entry_path.clone()];
        // Every attention layer's block rows, in layer order; then the head's.
        let mut kv: Vec<(Vec<Array>, Vec<Array>)> = vec![(Vec::new(), Vec::new()); n_kv];
        let mut head: (Vec<Array>, Vec<Array>) = (Vec::new(), Vec::new());
        for (i, name) in chain[1..=b].iter().enumerate() {
            let path = self.path(Kind::Block, name);
            let (_, mut bt) = self.read(&path, Kind::Block, name)?;
            let block_ids = bt.remove("ids").and_then(|a| a.to_bytes().ok()).unwrap_or_default();
            let expected: Vec<u8> = ids[i * BLOCK..(i + 1) * BLOCK].iter().flat_map(|v| v.to_le_bytes()).collect();
            if block_ids != expected {
                return Err(Fail::Bad(path, "its identities are not this prefix's".into()));
            }
            for (j, (keys, values)) in kv.iter_mut().enumerate() {
                let (Some(k), Some(v)) = (bt.remove(&format!("k.{j}")), bt.remove(&format!("v.{j}"))) else {
                    return Err(Fail::Bad(path, format!("no rows for attention layer {j}")));
                };
                if k.ndim() != 4 || k.dim(2) as usize != BLOCK || k.shape() != v.shape() {
                    return Err(Fail::Bad(path, format!("rows of shape {:?} for a block", k.shape())));
                }
                keys.push(k);
                values.push(v);
            }
            files.push(path);
            if mtp {
                let path = self.path(Kind::Head, name);
                let (_, mut ht) = self.read(&path, Kind::Head, name)?;
                let (Some(k), Some(v)) = (ht.remove("k"), ht.remove("v")) else {
                    return Err(Fail::Bad(path, "no rows".into()));
                };
                let rows = if i == 0 { BLOCK - 1 } else { BLOCK };
                if k.ndim() != 4 || k.dim(2) as usize != rows || k.shape() != v.shape() {
                    return Err(Fail::Bad(path, format!("rows of shape {:?} for a block", k.shape())));
                }
                head.0.push(k);
                head.1.push(v);
                files.push(path);
            }
        }
        let mut layers = Vec::with_capacity(kinds.len());
        let mut kv = kv.into_iter();
        for (l, kind) in kinds.iter().enumerate() {
            layers.push(match kind.as_str() {
                "kv" => {
                    let (mut keys, mut values) = kv.next().unwrap_or_default();
                    if let (Some(k), Some(v)) = (t.remove(&format!("layer.{l}.k")), t.remove(&format!("layer.{l}.v"))) {
                        keys.push(k);
                        values.push(v);
                    }
                    let rows = Rows { keys, values, rope_delta: ropes.get(l).copied().unwrap_or(0) };
                    if rows.len() != len {
                        return Err(bad(format!("attention layer {l} holds {} positions of {len}", rows.len())));
                    }
                    LayerSnapshot::Kv(rows)
                }
                "lin" => {
                    let (Some(conv), Some(ssm)) =
                        (t.remove(&format!("layer.{l}.conv")), t.remove(&format!("layer.{l}.ssm")))
                    else {
                        return Err(bad(format!("no state for linear layer {l}")));
                    };
                    LayerSnapshot::Linear { conv, ssm }
                }
                other => return Err(bad(format!("an unknown layer kind `{other}`"))),
            });
        }
        let mtp = if mtp {
            let (mut keys, mut values) = head;
            if let (Some(k), Some(v)) = (t.remove("mtp.k"), t.remove("mtp.v")) {
                keys.push(k);
                values.push(v);
            }
            let rope_delta = meta.get("mtp_rope").and_then(|s| s.parse().ok()).unwrap_or(0);
            let rows = Rows { keys, values, rope_delta };
            if rows.len() + 1 != len {
                return Err(bad(format!("the MTP head holds {} entries of {}", rows.len(), len - 1)));
            }
            Some(rows)
        } else {
            None
        };
        let last_hidden = t.remove("hidden").ok_or_else(|| bad("no `hidden` tensor".into()))?;
        Ok((Snapshot { len, block: BLOCK, layers, mtp, last_hidden }, files))
    }

    /// A file's tensors, checked: `Missing` when it is not there, `Bad` when it fails a check.
    fn read(&self, path: &Path, kind: Kind, key: &Key) -> Result<Decoded, Fail> {
        let bytes = match fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(Fail::Missing(format!("{} is gone", path.display())))
            }
            Err(e) => return Err(Fail::Bad(path.to_owned(), format!("cannot read it: {e}"))),
        };
        decode(&bytes, &self.identity, kind, key).map_err(|why| Fail::Bad(path.to_owned(), why))
    }

    /// Writes what the folder lacks of `snapshot` (the state after `ids`, whose chained block names
    /// are `chain`): its new blocks, then its entry, as far as the write budget and the cap allow.
    /// Returns the bytes written.
    pub fn store(&mut self, ids: &[u64], chain: &[Key], snapshot: &Snapshot) -> u64 {
        if self.stats.off.is_some() || snapshot.block != BLOCK || ids.len() != snapshot.len || snapshot.len == 0 {
            return 0;
        }
        let whole = snapshot.len / BLOCK;
        let tail = &ids[whole * BLOCK..];
        let key = entry_key(&chain[whole], tail);
        let has_mtp = snapshot.has_mtp();
        let present = self.index.get(&chain[whole]).and_then(|l| l.iter().find(|e| e.key == key)).map(|e| e.mtp);
        let _folder = FOLDER.lock().unwrap_or_else(|p| p.into_inner());
        let mut reused = Vec::new();
        if present.is_some_and(|m| m || !has_mtp) && self.path(Kind::Entry, &key).exists() {
            reused.push(self.path(Kind::Entry, &key));
            for name in &chain[1..=whole] {
                reused.push(self.path(Kind::Block, name));
                if has_mtp {
                    reused.push(self.path(Kind::Head, name));
                }
            }
            reused.iter().for_each(|p| touch(p));
            self.stats.last_write_bytes = 0;
            return 0;
        }
        if present == Some(false) && has_mtp {
            // The same prefix again, now with the MTP head's state: the entry is written anew.
            self.unindex(&key);
            let _ = fs::remove_file(self.path(Kind::Entry, &key));
        }
        self.refill();
        let mut pending: Vec<(PathBuf, Vec<u8>)> = Vec::new();
        let mut planned = 0usize;
        let mut complete = true;
        let mut plan = |path: PathBuf, encode: &dyn Fn() -> Result<Vec<u8>, String>, pending: &mut Vec<_>| {
            if path.exists() {
                reused.push(path);
                return true;
            }
            match encode() {
                Ok(bytes) if (planned + bytes.len()) as f64 <= self.allowance => {
                    planned += bytes.len();
                    pending.push((path, bytes));
                    true
                }
                Ok(_) => false,
                Err(why) => {
                    tracing::warn!("prefix cache: cannot encode a snapshot for the SSD tier: {why}");
                    false
                }
            }
        };
        for (b, name) in chain[1..=whole].iter().enumerate() {
            let start = b as u64 * BLOCK as u64;
            let ok = plan(
                self.path(Kind::Block, name),
                &|| encode_block(snapshot, b, &ids[b * BLOCK..(b + 1) * BLOCK], &self.identity, name, start),
                &mut pending,
            ) && (!has_mtp
                || plan(
                    self.path(Kind::Head, name),
                    &|| encode_head(snapshot, b, &self.identity, name, start),
                    &mut pending,
                ));
            if !ok {
                complete = false;
                break;
            }
        }
        if complete {
            complete = plan(
                self.path(Kind::Entry, &key),
                &|| encode_entry(snapshot, &chain[1..=whole], &chain[whole], tail, &self.identity, &key),
                &mut pending,
            );
        }
        if !complete {
            self.stats.skipped += 1;
            tracing::debug!(
                len = snapshot.len,
                allowance = self.allowance,
                "prefix cache: the SSD write budget is spent; the rest waits for a later turn"
            );
        }
        let need: u64 = pending.iter().map(|(_, b)| b.len() as u64).sum();
        let keep: HashSet<PathBuf> = reused.iter().chain(pending.iter().map(|(p, _)| p)).cloned().collect();
        if let Err(why) = self.make_room(need, &keep) {
            self.stats.skipped += 1;
            tracing::debug!("prefix cache: not written to the SSD tier: {why}");
            return 0;
        }
        reused.iter().for_each(|p| touch(p));
        let mut written = 0u64;
        for (path, bytes) in &pending {
            if let Err(e) = crate::atomic_file::write_atomic(path, bytes) {
                self.stats.bytes = self.stats.bytes.saturating_sub(need - written);
                let why = format!("cannot write {}: {e}", path.display());
                if matches!(e.kind(), io::ErrorKind::PermissionDenied | io::ErrorKind::ReadOnlyFilesystem) {
                    self.turn_off(why);
                } else {
                    // A full disk, say: this write is lost, later ones may find room.
                    tracing::warn!("prefix cache: {why}; the SSD tier skips this snapshot");
                    self.stats.skipped += 1;
                }
                break;
            }
            written += bytes.len() as u64;
            if path.file_name().is_some_and(|n| n.to_string_lossy().contains("-e-")) {
                let tail = tail.to_vec();
                self.add((chain[whole], Indexed { key, tail, mtp: has_mtp }));
            }
        }
        self.allowance -= written as f64;
        self.stats.bytes_written += written;
        self.stats.last_write_bytes = written;
        written
    }

    fn refill(&mut self) {
        let now = Instant::now();
        let burst = self.stats.write_bytes_per_minute as f64;
        self.allowance = (self.allowance + self.per_second * (now - self.refilled).as_secs_f64()).min(burst);
        self.refilled = now;
    }

    /// Evicts this tier's least recently used files (never those in `keep`) until the folder has
    /// room for `need` more bytes under the cap. Call with [`FOLDER`] held.
    fn make_room(&mut self, need: u64, keep: &HashSet<PathBuf>) -> Result<(), String> {
        let listing = fs::read_dir(&self.dir).map_err(|e| format!("cannot list {}: {e}", self.dir.display()))?;
        let mut total = 0u64;
        let mut evictable: Vec<(SystemTime, u64, PathBuf)> = Vec::new();
        let now = SystemTime::now();
        for item in listing.flatten() {
            let Ok(meta) = item.metadata() else { continue };
            if !meta.is_file() {
                continue;
            }
            total += meta.len();
            let name = item.file_name().to_string_lossy().into_owned();
            let mtime = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            let stale_temp = name.starts_with('.')
                && name.ends_with(".tmp")
                && name.contains(SUFFIX)
                && now.duration_since(mtime).unwrap_or_default() > STALE_TEMP;
            let path = item.path();
            if (stale_temp || parse_name(&name).is_some()) && !keep.contains(&path) {
                evictable.push((if stale_temp { SystemTime::UNIX_EPOCH } else { mtime }, meta.len(), path));
            }
        }
        evictable.sort();
        let mut evictable = evictable.into_iter();
        while total + need > self.cap {
            let Some((_, size, path)) = evictable.next() else {
                self.stats.bytes = total;
                return Err(format!("{need} bytes do not fit under the cap of {} bytes ({total} held)", self.cap));
            };
            match fs::remove_file(&path) {
                Ok(()) => {
                    total -= size;
                    self.stats.evictions += 1;
                    if let Some((Kind::Entry, key)) = path.file_name().and_then(|n| self.ours(&n.to_string_lossy())) {
                        self.unindex(&key);
                    }
                }
                Err(e) => tracing::debug!(file = %path.display(), "prefix cache: cannot evict: {e}"),
            }
        }
        self.stats.bytes = total + need;
        Ok(())
    }
}

/// Renews a file's mtime: the tier evicts by it.
fn touch(path: &Path) {
    if let Ok(f) = fs::File::options().write(true).open(path) {
        let _ = f.set_modified(SystemTime::now());
    }
}

/// The identity of the model in `dir` loaded with `dtype`: a SHA-256 of its config.json and of each
/// weight file's name, size, header and a sample of its data, so that another checkpoint of the
/// same shape (a fine-tune) never reads this one's state. Cheap: a few reads per file.
pub fn model_identity(dir: &Path, dtype: Option<Dtype>) -> Result<String, String> {
    let mut h = Sha256::new();
    h.update(FORMAT);
    h.update(format!("{dtype:?}"));
    let config = dir.join("config.json");
    h.update(fs::read(&config).map_err(|e| format!("cannot read {}: {e}", config.display()))?);
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .map_err(|e| format!("cannot list {}: {e}", dir.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    for path in files {
        let sample = || -> io::Result<Vec<u8>> {
            let mut f = fs::File::open(&path)?;
            let len = f.metadata()?.len();
            let mut n = [0u8; 8];
            f.read_exact(&mut n)?;
            let header = u64::from_le_bytes(n).min(MAX_HEADER);
            let mut out = len.to_le_bytes().to_vec();
            (&mut f).take(header).read_to_end(&mut out)?;
            f.seek(io::SeekFrom::Start(len / 2))?;
            f.take(64 << 10).read_to_end(&mut out)?;
            Ok(out)
        };
        h.update(path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default());
        h.update(sample().map_err(|e| format!("cannot read {}: {e}", path.display()))?);
    }
    Ok(hex(&h.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Key> {
    if s.len() != 32 {
        return None;
    }
    let mut k = [0; 16];
    for (i, byte) in k.iter_mut().enumerate() {
        *byte = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(k)
}

/// `<12 hex>-<kind>-<32 hex>.safetensors`: the kind and key.
fn parse_name(name: &str) -> Option<(Kind, Key)> {
    let stem = name.strip_suffix(SUFFIX)?;
    let (model, rest) = stem.split_once('-')?;
    let (kind, key) = rest.split_once('-')?;
    if model.len() != 12 || !model.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let kind = match kind {
        "e" => Kind::Entry,
        "b" => Kind::Block,
        "m" => Kind::Head,
        _ => return None,
    };
    Some((kind, unhex(key)?))
}

fn parse_ids(s: &str) -> Option<Vec<u64>> {
    if s.is_empty() {
        return Some(Vec::new());
    }
    s.split(',').map(|x| x.parse().ok()).collect()
}

/// A safetensors file's `__metadata__`, read from its header alone.
fn read_header(path: &Path) -> Result<HashMap<String, String>, String> {
    let mut f = fs::File::open(path).map_err(|e| format!("cannot open it: {e}"))?;
    let mut n = [0u8; 8];
    f.read_exact(&mut n).map_err(|_| "truncated: no header".to_string())?;
    let n = u64::from_le_bytes(n);
    if n > MAX_HEADER {
        return Err(format!("a header of {n} bytes"));
    }
    let mut header = Vec::new();
    f.take(n).read_to_end(&mut header).map_err(|e| format!("cannot read the header: {e}"))?;
    if header.len() as u64 != n {
        return Err("truncated inside the header".into());
    }
    #[derive(serde::Deserialize)]
    struct Header {
        #[serde(rename = "__metadata__", default)]
        metadata: HashMap<String, String>,
    }
    let h: Header = serde_json::from_slice(&header).map_err(|e| format!("a bad header: {e}"))?;
    Ok(h.metadata)
}

/// The header's fields every file carries, checked against what its reader expects.
fn check_meta(meta: &HashMap<String, String>, identity: &str, kind: Kind, key: &Key) -> Result<(), String> {
    let get = |k: &str| meta.get(k).map_or("", String::as_str);
    if get("format") != FORMAT {
        return Err(format!("not a prefix cache file (format `{}`)", get("format")));
    }
    if get("version") != VERSION {
        return Err(format!("format version `{}`, this build reads {VERSION}", get("version")));
    }
    if get("model") != identity {
        return Err("written for another model (or another build of its weights)".into());
    }
    if get("kind") != kind.name() || get("key") != hex(key) {
        return Err(format!("a {} `{}` where a {} `{}` belongs", get("kind"), get("key"), kind.name(), hex(key)));
    }
    Ok(())
}

fn st_dtype(d: Dtype) -> Result<safetensors::Dtype, String> {
    serde_json::from_value(serde_json::Value::String(d.safetensors_name().into()))
        .map_err(|_| format!("dtype {d:?} has no safetensors name"))
}

/// The checksum over tensors in name order: each one's name, dtype, shape and bytes.
fn checksum<'a>(tensors: impl Iterator<Item = (&'a str, String, &'a [usize], &'a [u8])>) -> String {
    let mut h = Sha256::new();
    for (name, dtype, shape, data) in tensors {
        h.update((name.len() as u64).to_le_bytes());
        h.update(name);
        h.update(dtype);
        h.update((shape.len() as u64).to_le_bytes());
        shape.iter().for_each(|d| h.update((*d as u64).to_le_bytes()));
        h.update((data.len() as u64).to_le_bytes());
        h.update(data);
    }
    hex(&h.finalize()[..16])
}

struct Plain {
    name: String,
    dtype: Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

fn plain(name: impl Into<String>, a: &Array) -> Result<Plain, String> {
    let data = a.to_bytes().map_err(|e| e.to_string())?;
    let shape = a.shape().iter().map(|&d| d.max(0) as usize).collect();
    Ok(Plain { name: name.into(), dtype: a.dtype(), shape, data })
}

fn plain_bytes(name: &str, data: Vec<u8>, dtype: Dtype, n: usize) -> Plain {
    Plain { name: name.into(), dtype, shape: vec![n], data }
}

/// A safetensors file of `tensors` with the common header fields, `extra` and the checksum.
fn encode(
    mut tensors: Vec<Plain>,
    identity: &str,
    kind: Kind,
    key: &Key,
    tokens: usize,
    extra: Vec<(&str, String)>,
) -> Result<Vec<u8>, String> {
    tensors.sort_by(|a, b| a.name.cmp(&b.name));
    let sum = checksum(
        tensors.iter().map(|t| (t.name.as_str(), t.dtype.safetensors_name().to_owned(), &t.shape[..], &t.data[..])),
    );
    let mut meta: HashMap<String, String> = [
        ("format", FORMAT.to_owned()),
        ("version", VERSION.to_owned()),
        ("model", identity.to_owned()),
        ("kind", kind.name().to_owned()),
        ("key", hex(key)),
        ("tokens", tokens.to_string()),
        ("checksum", sum),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    meta.extend(extra.into_iter().map(|(k, v)| (k.to_owned(), v)));
    let views = tensors
        .iter()
        .map(|t| {
            let view = safetensors::tensor::TensorView::new(st_dtype(t.dtype)?, t.shape.clone(), &t.data)
                .map_err(|e| e.to_string())?;
            Ok((t.name.clone(), view))
        })
        .collect::<Result<Vec<_>, String>>()?;
    safetensors::serialize(views, Some(meta)).map_err(|e| e.to_string())
}

/// A file's header fields and tensors, after every check: its container, header, checksum.
fn decode(bytes: &[u8], identity: &str, kind: Kind, key: &Key) -> Result<Decoded, String> {
    let st = safetensors::SafeTensors::deserialize(bytes).map_err(|e| format!("not a whole safetensors file: {e}"))?;
    let (_, header) = safetensors::SafeTensors::read_metadata(bytes).map_err(|e| e.to_string())?;
    let meta = header.metadata().clone().unwrap_or_default();
    check_meta(&meta, identity, kind, key)?;
    let mut tensors = st.tensors();
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    let sum = checksum(tensors.iter().map(|(n, v)| (n.as_str(), format!("{:?}", v.dtype()), v.shape(), v.data())));
    if meta.get("checksum") != Some(&sum) {
        return Err("its checksum does not match its contents".into());
    }
    let mut out = HashMap::new();
    for (name, view) in tensors {
        let dtype = Dtype::from_safetensors_name(&format!("{:?}", view.dtype()))
            .ok_or_else(|| format!("tensor `{name}` has dtype {:?}", view.dtype()))?;
        let shape: Vec<i32> = view.shape().iter().map(|&d| d as i32).collect();
        let a = Array::from_bytes(view.data(), &shape, dtype).map_err(|e| format!("tensor `{name}`: {e}"))?;
        out.insert(name, a);
    }
    Ok((meta, out))
}

fn kv_rows(snapshot: &Snapshot) -> impl Iterator<Item = &Rows> {
    snapshot.layers.iter().filter_map(|l| match l {
        LayerSnapshot::Kv(rows) => Some(rows),
        LayerSnapshot::Linear { .. } => None,
    })
}

fn encode_block(
    snapshot: &Snapshot,
    b: usize,
    ids: &[u64],
    identity: &str,
    key: &Key,
    start: u64,
) -> Result<Vec<u8>, String> {
    let mut tensors =
        vec![plain_bytes("ids", ids.iter().flat_map(|v| v.to_le_bytes()).collect(), Dtype::U64, ids.len())];
    for (j, rows) in kv_rows(snapshot).enumerate() {
        let (Some(k), Some(v)) = (rows.keys.get(b), rows.values.get(b)) else {
            return Err(format!("attention layer {j} has no block {b}"));
        };
        tensors.push(plain(format!("k.{j}"), k)?);
        tensors.push(plain(format!("v.{j}"), v)?);
    }
    encode(tensors, identity, Kind::Block, key, start as usize + BLOCK, Vec::new())
}

fn encode_head(snapshot: &Snapshot, b: usize, identity: &str, key: &Key, start: u64) -> Result<Vec<u8>, String> {
    let rows = snapshot.mtp.as_ref().ok_or("no MTP rows")?;
    let (Some(k), Some(v)) = (rows.keys.get(b), rows.values.get(b)) else {
        return Err(format!("the MTP head has no block {b}"));
    };
    encode(vec![plain("k", k)?, plain("v", v)?], identity, Kind::Head, key, start as usize + BLOCK, Vec::new())
}

fn encode_entry(
    snapshot: &Snapshot,
    blocks: &[Key],
    last: &Key,
    tail: &[u64],
    identity: &str,
    key: &Key,
) -> Result<Vec<u8>, String> {
    let whole = blocks.len();
    let mut tensors = vec![plain("hidden", &snapshot.last_hidden)?];
    if whole > 0 {
        tensors.push(plain_bytes("blocks", blocks.concat(), Dtype::U8, whole * 16));
    }
    let (mut kinds, mut ropes) = (Vec::new(), Vec::new());
    for (l, layer) in snapshot.layers.iter().enumerate() {
        match layer {
            LayerSnapshot::Kv(rows) => {
                kinds.push("kv");
                ropes.push(rows.rope_delta.to_string());
                if let (Some(k), Some(v)) = (rows.keys.get(whole), rows.values.get(whole)) {
                    tensors.push(plain(format!("layer.{l}.k"), k)?);
                    tensors.push(plain(format!("layer.{l}.v"), v)?);
                }
            }
            LayerSnapshot::Linear { conv, ssm } => {
                kinds.push("lin");
                ropes.push("0".into());
                tensors.push(plain(format!("layer.{l}.conv"), conv)?);
                tensors.push(plain(format!("layer.{l}.ssm"), ssm)?);
            }
        }
    }
    let mut extra = vec![
        ("len", snapshot.len.to_string()),
        ("last_block", hex(last)),
        ("tail", tail.iter().map(u64::to_string).collect::<Vec<_>>().join(",")),
        ("layers", kinds.join(",")),
        ("rope", ropes.join(",")),
        ("mtp", if snapshot.has_mtp() { "1" } else { "0" }.to_owned()),
    ];
    if let Some(rows) = &snapshot.mtp {
        extra.push(("mtp_rope", rows.rope_delta.to_string()));
        if let (Some(k), Some(v)) = (rows.keys.get(whole), rows.values.get(whole)) {
            tensors.push(plain("mtp.k", k)?);
            tensors.push(plain("mtp.v", v)?);
        }
    }
    encode(tensors, identity, Kind::Entry, key, snapshot.len, extra)
}
