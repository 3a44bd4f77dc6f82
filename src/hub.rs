//! Hugging Face downloads (`tandem pull`): a repo's files at a pinned commit into the standard Hub cache
//! (`$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`), laid out as the Hub's own
//! clients lay it out, so models fetched by other tools are found and never downloaded twice:
//!
//! ```text
//! models--ORG--NAME/blobs/<sha256 of an LFS file, or the git blob id of a small one>
//! models--ORG--NAME/snapshots/<commit>/<path>  -> ../../blobs/<id>   (relative symlinks)
//! models--ORG--NAME/refs/<revision>            the commit a branch or tag named
//! ```
//!
//! What the Hub answers is checked, not trusted: the listing (`GET /api/models/REPO/revision/REV?blobs=true`)
//! pins the commit and gives each file's size and, for LFS files, its sha256; a file is written to
//! `blobs/<id>.incomplete`, resumed from where it stopped with an HTTP Range request, and becomes visible
//! (its blob renamed, its snapshot link made) only once its size and checksum match. A cancelled or broken
//! pull therefore leaves no partial model in the snapshot, only `.incomplete` files that the next pull
//! resumes. `HF_ENDPOINT`, `HF_TOKEN` (or the token file the Hub's CLI writes) and `HF_HUB_OFFLINE` are
//! honoured.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Where the Hub is and who asks.
#[derive(Clone)]
pub struct HubConfig {
    /// `HF_ENDPOINT`, default `https://huggingface.co` (no trailing slash).
    pub endpoint: String,
    /// `HF_TOKEN`, else the token file in `HF_HOME` (`~/.cache/huggingface/token`).
    pub token: Option<String>,
    /// The hub cache folder (see the module's text).
    pub cache: PathBuf,
    /// `HF_HUB_OFFLINE=1`: only what the cache holds.
    pub offline: bool,
}

/// Never prints the token.
impl std::fmt::Debug for HubConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HubConfig")
            .field("endpoint", &self.endpoint)
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .field("cache", &self.cache)
            .field("offline", &self.offline)
            .finish()
    }
}

impl HubConfig {
    pub fn from_env() -> HubConfig {
        let var = |k: &str| std::env::var(k).ok().map(|v| v.trim().to_owned()).filter(|v| !v.is_empty());
        let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_default();
        let hf_home = var("HF_HOME").map(PathBuf::from).unwrap_or_else(|| home.join(".cache/huggingface"));
        let cache = var("HF_HUB_CACHE").map(PathBuf::from).unwrap_or_else(|| hf_home.join("hub"));
        let token = var("HF_TOKEN").or_else(|| {
            fs::read_to_string(hf_home.join("token")).ok().map(|t| t.trim().to_owned()).filter(|t| !t.is_empty())
        });
        let offline = var("HF_HUB_OFFLINE")
            .is_some_and(|v| matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on"));
        let endpoint = var("HF_ENDPOINT").unwrap_or_else(|| "https://huggingface.co".into());
        HubConfig { endpoint: endpoint.trim_end_matches('/').to_owned(), token, cache, offline }
    }
}

/// `ORG/NAME[@REVISION]` (revision: a branch, tag or commit; default `main`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ts_rs::TS)]
pub struct RepoRef {
    pub repo: String,
    pub revision: String,
}

impl FromStr for RepoRef {
    type Err = HubError;
    fn from_str(s: &str) -> Result<RepoRef, HubError> {
        let (repo, revision) = match s.trim().split_once('@') {
            Some((r, rev)) => (r, rev),
            None => (s.trim(), "main"),
        };
        let bad = |why: &str| HubError::InvalidRepo { given: s.to_owned(), why: why.to_owned() };
        let parts: Vec<&str> = repo.split('/').collect();
        let part_ok = |p: &str| {
            !p.is_empty()
                && p.len() <= 96
                && !p.starts_with(['.', '-'])
                && p.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        };
        if parts.len() != 2 || !parts.iter().all(|p| part_ok(p)) || repo.contains("..") {
            return Err(bad("expected ORG/NAME of letters, digits, '-', '_' and '.'"));
        }
        let rev_ok = !revision.is_empty()
            && revision.len() <= 255
            && !revision.contains("..")
            && revision.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'));
        if !rev_ok {
            return Err(bad("the revision after '@' must be a branch, tag or commit"));
        }
        Ok(RepoRef { repo: repo.to_owned(), revision: revision.to_owned() })
    }
}

impl std::fmt::Display for RepoRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{}", self.repo, self.revision)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error("`{given}` is not a Hugging Face model repo: {why}")]
    InvalidRepo { given: String, why: String },
    #[error("{repo}: the Hub refused access (HTTP {status}): {}", if *token { "the token (HF_TOKEN) does not grant it; for a gated model, accept its terms on the model's page first" } else { "it is gated or private; accept its terms on the model's page and set HF_TOKEN to a token of yours" })]
    Unauthorized { repo: String, status: u16, token: bool },
    #[error("{repo}: no such repo or revision `{revision}` on {endpoint}")]
    NotFound { repo: String, revision: String, endpoint: String },
    #[error("{url}: HTTP {status}")]
    Http { url: String, status: u16 },
    #[error("{url}: {message}")]
    Network { url: String, message: String },
    #[error("{url}: the Hub's answer is not what a model listing looks like: {message}")]
    BadListing { url: String, message: String },
    #[error("{}: {error}", path.display())]
    Io { path: PathBuf, error: io::Error },
    #[error("{file}: the download's sha256 is {got}, the Hub lists {expected}: the file was corrupted on the way and is not kept; pull again")]
    Checksum { file: String, expected: String, got: String },
    #[error("{file}: {got} bytes arrived where the Hub lists {expected}; the file is not kept")]
    Size { file: String, expected: u64, got: u64 },
    #[error("{repo}: {need} bytes to download but {} has {available} bytes free", dir.display())]
    DiskSpace { repo: String, dir: PathBuf, need: u64, available: u64 },
    #[error("{repo}@{revision} is not in the cache ({}) and HF_HUB_OFFLINE is set", cache.display())]
    Offline { repo: String, revision: String, cache: PathBuf },
    #[error("no file of {repo} matches {patterns:?}")]
    NothingMatches { repo: String, patterns: Vec<String> },
    #[error("`{0}` is not a valid --include pattern")]
    BadPattern(String),
    #[error("the download was cancelled")]
    Cancelled,
    #[error("HF_HUB_OFFLINE is set: the Hub cannot be searched")]
    OfflineSearch,
    #[error("`{0}` is not a search: give a few letters of a repo's name (at most 200)")]
    BadQuery(String),
}

impl HubError {
    fn io(path: &Path, error: io::Error) -> HubError {
        HubError::Io { path: path.to_owned(), error }
    }
}

/// One file of a repo at a commit, as the Hub lists it.
#[derive(Debug, Clone, PartialEq, Serialize, ts_rs::TS)]
pub struct RemoteFile {
    pub path: String,
    pub size: u64,
    /// The sha256 of an LFS file (weights); None for a small file kept in git.
    pub sha256: Option<String>,
    /// The blob's name in the cache: the sha256 of an LFS file, else the git blob id.
    #[serde(skip)]
    #[ts(skip)]
    blob: String,
}

/// What a pull reports as it goes (the engine's download jobs send these as server-sent events).
#[derive(Debug, Clone, PartialEq, Serialize, ts_rs::TS)]
#[serde(tag = "event", rename_all = "snake_case")]
#[ts(rename = "PullEvent")]
pub enum PullEvent {
    /// The listing: the commit the revision names and the files to fetch (`cached_bytes` already here).
    Listed { commit: String, files: Vec<RemoteFile>, total_bytes: u64, cached_bytes: u64 },
    /// Bytes of `file` so far; `done` counts every file of the pull (the cached ones too).
    Progress { file: String, file_done: u64, file_size: u64, done: u64, total: u64 },
    /// A file verified and visible in the snapshot.
    FileDone { file: String, downloaded: bool },
}

/// The events' answer: go on, or stop (what was written stays as `.incomplete`, for a resume).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Control {
    #[default]
    Continue,
    Cancel,
}

#[derive(Debug, Clone, Default)]
pub struct PullOptions {
    /// Glob patterns over the repo's paths (`*.safetensors`, `config.json`); empty takes every file.
    pub include: Vec<String>,
    /// Test hook: the free space the disk check sees, instead of the disk's.
    #[doc(hidden)]
    pub free_space: Option<u64>,
}

/// A finished pull.
#[derive(Debug, Clone, PartialEq, Serialize, ts_rs::TS)]
pub struct Pulled {
    pub repo: String,
    pub revision: String,
    pub commit: String,
    /// `snapshots/<commit>` in the cache: the model folder.
    pub snapshot: PathBuf,
    pub files: usize,
    pub downloaded_bytes: u64,
    pub cached_bytes: u64,
}

/// The cache folder of `repo`.
pub fn repo_dir(cache: &Path, repo: &str) -> PathBuf {
    cache.join(format!("models--{}", repo.replace('/', "--")))
}

/// Fetches `r` into the cache (see the module's text) and returns its snapshot.
pub fn pull(
    cfg: &HubConfig,
    r: &RepoRef,
    opts: &PullOptions,
    on_event: &mut dyn FnMut(PullEvent) -> Control,
) -> Result<Pulled, HubError> {
    let patterns = opts
        .include
        .iter()
        .map(|p| glob::Pattern::new(p).map_err(|_| HubError::BadPattern(p.clone())))
        .collect::<Result<Vec<_>, _>>()?;
    let dir = repo_dir(&cfg.cache, &r.repo);
    if cfg.offline {
        return offline(cfg, r, &dir, &patterns);
    }
    let agent = agent();
    let Listing { commit, files: listed, .. } = listing(cfg, &agent, r)?;
    let files: Vec<RemoteFile> =
        listed.into_iter().filter(|f| patterns.is_empty() || patterns.iter().any(|p| p.matches(&f.path))).collect();
    if files.is_empty() {
        return Err(HubError::NothingMatches { repo: r.repo.clone(), patterns: opts.include.clone() });
    }
    let blobs = dir.join("blobs");
    fs::create_dir_all(&blobs).map_err(|e| HubError::io(&blobs, e))?;
    let have = |f: &RemoteFile| fs::metadata(blobs.join(&f.blob)).is_ok_and(|m| m.len() == f.size);
    let partial = |f: &RemoteFile| fs::metadata(incomplete(&blobs, f)).map_or(0, |m| m.len().min(f.size));
    let total: u64 = files.iter().map(|f| f.size).sum();
    let cached: u64 = files.iter().filter(|f| have(f)).map(|f| f.size).sum();
    let need: u64 = files.iter().filter(|f| !have(f)).map(|f| f.size - partial(f)).sum();
    let available = match opts.free_space {
        Some(v) => v,
        None => fs4::available_space(&blobs).map_err(|e| HubError::io(&blobs, e))?,
    };
    if need > available {
        return Err(HubError::DiskSpace { repo: r.repo.clone(), dir: blobs, need, available });
    }
    if on_event(PullEvent::Listed {
        commit: commit.clone(),
        files: files.clone(),
        total_bytes: total,
        cached_bytes: cached,
    }) == Control::Cancel
    {
        return Err(HubError::Cancelled);
    }
    let snapshot = dir.join("snapshots").join(&commit);
    let mut done = cached;
    let mut downloaded = 0;
    for f in &files {
        let blob = blobs.join(&f.blob);
        let fetched = !have(f);
        if fetched {
            let before = partial(f);
            fetch(cfg, &agent, r, &commit, f, &blobs, &mut |file_done| {
                on_event(PullEvent::Progress {
                    file: f.path.clone(),
                    file_done,
                    file_size: f.size,
                    done: done + file_done,
                    total,
                })
            })?;
            downloaded += f.size - before;
            done += f.size;
        }
        link(&snapshot, &f.path, &blob)?;
        if on_event(PullEvent::FileDone { file: f.path.clone(), downloaded: fetched }) == Control::Cancel {
            return Err(HubError::Cancelled);
        }
    }
    if r.revision != commit {
        let refs = dir.join("refs");
        fs::create_dir_all(&refs).map_err(|e| HubError::io(&refs, e))?;
        let path = refs.join(&r.revision);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).map_err(|e| HubError::io(parent, e))?;
        }
        crate::atomic_file::write_atomic(&path, commit.as_bytes()).map_err(|e| HubError::io(&path, e))?;
    }
    Ok(Pulled {
        repo: r.repo.clone(),
        revision: r.revision.clone(),
        commit,
        snapshot,
        files: files.len(),
        downloaded_bytes: downloaded,
        cached_bytes: cached,
    })
}

pub(crate) fn agent() -> ureq::Agent {
    let tls = ureq::tls::TlsConfig::builder().provider(ureq::tls::TlsProvider::NativeTls).build();
    ureq::Agent::config_builder()
        .tls_config(tls)
        .http_status_as_error(false)
        .timeout_connect(Some(Duration::from_secs(30)))
        // A stalled transfer fails (and resumes on the next pull) rather than hang.
        .timeout_per_read(Some(Duration::from_secs(60)))
        .user_agent(concat!("tandem/", env!("CARGO_PKG_VERSION")))
        .build()
        .into()
}

fn request(
    cfg: &HubConfig,
    agent: &ureq::Agent,
    url: &str,
    range_from: u64,
) -> Result<ureq::http::Response<ureq::Body>, HubError> {
    request_range(cfg, agent, url, range_from, None)
}

/// A GET of `url` with the token, from byte `from` (to `to`, inclusive, when given).
pub(crate) fn request_range(
    cfg: &HubConfig,
    agent: &ureq::Agent,
    url: &str,
    from: u64,
    to: Option<u64>,
) -> Result<ureq::http::Response<ureq::Body>, HubError> {
    let mut req = agent.get(url);
    if let Some(token) = &cfg.token {
        req = req.header("Authorization", &format!("Bearer {token}"));
    }
    match to {
        Some(to) => req = req.header("Range", &format!("bytes={from}-{to}")),
        None if from > 0 => req = req.header("Range", &format!("bytes={from}-")),
        None => {}
    }
    req.call().map_err(|e| HubError::Network { url: url.to_owned(), message: e.to_string() })
}

/// What the listing says of a repo at a revision.
pub(crate) struct Listing {
    pub commit: String,
    pub files: Vec<RemoteFile>,
    /// The model card's `base_model` (the first, when it names several): where a conversion came from.
    pub base_model: Option<String>,
}

/// The Hub's answer to a request about `r`, as an error when it is not a 200.
pub(crate) fn check_status(cfg: &HubConfig, r: &RepoRef, url: &str, status: u16) -> Result<(), HubError> {
    match status {
        200 | 206 => Ok(()),
        401 | 403 => Err(HubError::Unauthorized { repo: r.repo.clone(), status, token: cfg.token.is_some() }),
        404 => Err(HubError::NotFound {
            repo: r.repo.clone(),
            revision: r.revision.clone(),
            endpoint: cfg.endpoint.clone(),
        }),
        status => Err(HubError::Http { url: url.to_owned(), status }),
    }
}

/// `?blobs=true` listing: the commit and every file with its size and (LFS) sha256.
pub(crate) fn listing(cfg: &HubConfig, agent: &ureq::Agent, r: &RepoRef) -> Result<Listing, HubError> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Info {
        sha: String,
        siblings: Vec<Sibling>,
        #[serde(default)]
        card_data: Option<CardData>,
    }
    #[derive(Deserialize)]
    struct CardData {
        #[serde(default)]
        base_model: Option<serde_json::Value>,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Sibling {
        rfilename: String,
        size: Option<u64>,
        blob_id: Option<String>,
        lfs: Option<Lfs>,
    }
    #[derive(Deserialize)]
    struct Lfs {
        sha256: String,
        size: u64,
    }
    let url = format!("{}/api/models/{}/revision/{}?blobs=true", cfg.endpoint, r.repo, encode(&r.revision));
    let mut res = request(cfg, agent, &url, 0)?;
    check_status(cfg, r, &url, res.status().as_u16())?;
    let bad = |message: String| HubError::BadListing { url: url.clone(), message };
    let text = res.body_mut().read_to_string().map_err(|e| bad(e.to_string()))?;
    let info: Info = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let hex = |s: &str, n: usize| s.len() == n && s.chars().all(|c| c.is_ascii_hexdigit());
    if !hex(&info.sha, 40) {
        return Err(bad(format!("commit `{}` is not 40 hex digits", info.sha)));
    }
    let mut files = Vec::new();
    for s in info.siblings {
        // Paths become files under the snapshot: nothing absolute, nothing climbing out.
        let safe = !s.rfilename.is_empty()
            && !s.rfilename.starts_with('/')
            && s.rfilename.split('/').all(|c| !c.is_empty() && c != "." && c != "..")
            && !s.rfilename.contains('\\');
        if !safe {
            return Err(bad(format!("file name `{}`", s.rfilename)));
        }
        let (size, sha256, blob) = match (s.lfs, s.blob_id, s.size) {
            (Some(lfs), _, _) if hex(&lfs.sha256, 64) => {
                (lfs.size, Some(lfs.sha256.to_lowercase()), lfs.sha256.to_lowercase())
            }
            (None, Some(id), Some(size)) if hex(&id, 40) => (size, None, id.to_lowercase()),
            _ => return Err(bad(format!("`{}` has no size and blob id (is `blobs=true` supported?)", s.rfilename))),
        };
        files.push(RemoteFile { path: s.rfilename, size, sha256, blob });
    }
    let base_model = info.card_data.and_then(|c| c.base_model).and_then(|b| match b {
        serde_json::Value::String(s) => Some(s),
        serde_json::Value::Array(v) => v.into_iter().find_map(|x| x.as_str().map(str::to_owned)),
        _ => None,
    });
    let base_model = base_model.filter(|b| b.parse::<RepoRef>().is_ok());
    Ok(Listing { commit: info.sha.to_lowercase(), files, base_model })
}

fn incomplete(blobs: &Path, f: &RemoteFile) -> PathBuf {
    blobs.join(format!("{}.incomplete", f.blob))
}

/// Downloads `f` into `blobs/<id>.incomplete` (resuming what is there), checks it, renames it to its blob.
fn fetch(
    cfg: &HubConfig,
    agent: &ureq::Agent,
    r: &RepoRef,
    commit: &str,
    f: &RemoteFile,
    blobs: &Path,
    progress: &mut dyn FnMut(u64) -> Control,
) -> Result<(), HubError> {
    let part = incomplete(blobs, f);
    let mut have = fs::metadata(&part).map_or(0, |m| m.len());
    if have > f.size {
        fs::remove_file(&part).map_err(|e| HubError::io(&part, e))?;
        have = 0;
    }
    let url = resolve_url(cfg, &r.repo, commit, &f.path);
    let mut hasher = Sha256::new();
    if have == f.size {
        hash_file(&part, &mut hasher)?;
    } else {
        let mut res = request(cfg, agent, &url, have)?;
        let status = res.status().as_u16();
        let mut out = match status {
            206 if have > 0 => {
                hash_file(&part, &mut hasher)?;
                OpenOptions::new().append(true).open(&part).map_err(|e| HubError::io(&part, e))?
            }
            200 => {
                have = 0;
                File::create(&part).map_err(|e| HubError::io(&part, e))?
            }
            401 | 403 => {
                return Err(HubError::Unauthorized { repo: r.repo.clone(), status, token: cfg.token.is_some() })
            }
            404 => {
                return Err(HubError::NotFound {
                    repo: r.repo.clone(),
                    revision: commit.to_owned(),
                    endpoint: cfg.endpoint.clone(),
                })
            }
            _ => return Err(HubError::Http { url, status }),
        };
        let mut reader = res.body_mut().as_reader();
        let mut buf = vec![0u8; 1 << 20];
        let mut reported = have;
        if progress(have) == Control::Cancel {
            return Err(HubError::Cancelled);
        }
        loop {
            let n =
                reader.read(&mut buf).map_err(|e| HubError::Network { url: url.clone(), message: e.to_string() })?;
            if n == 0 {
                break;
            }
            if have + n as u64 > f.size {
                drop(out);
                let _ = fs::remove_file(&part);
                return Err(HubError::Size { file: f.path.clone(), expected: f.size, got: have + n as u64 });
            }
            out.write_all(&buf[..n]).map_err(|e| HubError::io(&part, e))?;
            hasher.update(&buf[..n]);
            have += n as u64;
            // Every 4 MiB and at the end: often enough for a live bar, not per read.
            if have - reported >= 4 << 20 || have == f.size {
                reported = have;
                if progress(have) == Control::Cancel {
                    out.flush().map_err(|e| HubError::io(&part, e))?;
                    return Err(HubError::Cancelled);
                }
            }
        }
        out.sync_all().map_err(|e| HubError::io(&part, e))?;
    }
    if have != f.size {
        // Left as it is: the next pull resumes it.
        return Err(HubError::Network {
            url,
            message: format!("the transfer ended after {have} of {} bytes; pull again to resume", f.size),
        });
    }
    if let Some(expected) = &f.sha256 {
        let got = hex(&hasher.finalize());
        if &got != expected {
            let _ = fs::remove_file(&part);
            return Err(HubError::Checksum { file: f.path.clone(), expected: expected.clone(), got });
        }
    }
    let blob = blobs.join(&f.blob);
    fs::rename(&part, &blob).map_err(|e| HubError::io(&blob, e))
}

fn hash_file(path: &Path, hasher: &mut Sha256) -> Result<(), HubError> {
    let mut file = File::open(path).map_err(|e| HubError::io(path, e))?;
    io::copy(&mut file, hasher).map_err(|e| HubError::io(path, e))?;
    Ok(())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The `resolve` URL of `path` in `repo` at `commit`.
pub(crate) fn resolve_url(cfg: &HubConfig, repo: &str, commit: &str, path: &str) -> String {
    format!("{}/{repo}/resolve/{commit}/{}", cfg.endpoint, path.split('/').map(encode).collect::<Vec<_>>().join("/"))
}

/// Percent-encodes one path segment (or a revision, whose `/` are encoded too).
pub(crate) fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `snapshots/<commit>/<path>` -> the blob, as a relative symlink (a copy where links are not possible).
fn link(snapshot: &Path, path: &str, blob: &Path) -> Result<(), HubError> {
    let target = snapshot.join(path);
    let parent = target.parent().unwrap_or(snapshot);
    fs::create_dir_all(parent).map_err(|e| HubError::io(parent, e))?;
    // From the link's folder up to the repo folder, then into blobs/.
    let depth = path.split('/').count() + 1;
    let relative: PathBuf =
        std::iter::repeat_n("..", depth).collect::<PathBuf>().join("blobs").join(blob.file_name().unwrap_or_default());
    if fs::symlink_metadata(&target).is_ok() {
        fs::remove_file(&target).map_err(|e| HubError::io(&target, e))?;
    }
    #[cfg(unix)]
    let made = std::os::unix::fs::symlink(&relative, &target);
    #[cfg(not(unix))]
    let made = fs::copy(blob, &target).map(|_| ());
    made.map_err(|e| HubError::io(&target, e))
}

/// Makes the pulled snapshot a model of the models folder: `models_dir/NAME` (the repo's name, or
/// `ORG--NAME` when a folder of that name is there already) as a symlink to the snapshot. A link from an
/// earlier pull of the same repo is re-pointed; a real folder is never replaced.
pub fn link_into_models(models_dir: &Path, pulled: &Pulled) -> Result<PathBuf, HubError> {
    fs::create_dir_all(models_dir).map_err(|e| HubError::io(models_dir, e))?;
    let (org, name) = pulled.repo.split_once('/').unwrap_or(("", pulled.repo.as_str()));
    let snapshot = pulled.snapshot.canonicalize().map_err(|e| HubError::io(&pulled.snapshot, e))?;
    // `<cache>/models--ORG--NAME`, two levels above `snapshots/<commit>`.
    let repo_folder = snapshot.parent().and_then(Path::parent).unwrap_or(&snapshot);
    for candidate in [name.to_owned(), format!("{org}--{name}")] {
        let at = models_dir.join(&candidate);
        match fs::symlink_metadata(&at) {
            Err(_) => {}
            // Ours, from an earlier pull of this repo (it points into the repo's cache folder).
            Ok(m) if m.file_type().is_symlink() && links_into(&at, repo_folder) => {
                fs::remove_file(&at).map_err(|e| HubError::io(&at, e))?;
            }
            Ok(_) => continue,
        }
        #[cfg(unix)]
        std::os::unix::fs::symlink(&snapshot, &at).map_err(|e| HubError::io(&at, e))?;
        #[cfg(not(unix))]
        return Err(HubError::io(&at, io::Error::new(io::ErrorKind::Unsupported, "symlinks are needed here")));
        return Ok(at);
    }
    let at = models_dir.join(name);
    Err(HubError::io(
        &at,
        io::Error::new(io::ErrorKind::AlreadyExists, "a folder of this name (and of ORG--NAME) is already there"),
    ))
}

fn links_into(link: &Path, dir: &Path) -> bool {
    fs::read_link(link).is_ok_and(|t| t.starts_with(dir))
}

/// `HF_HUB_OFFLINE`: the snapshot the cache holds for `r`, when every file asked for is there.
fn offline(cfg: &HubConfig, r: &RepoRef, dir: &Path, patterns: &[glob::Pattern]) -> Result<Pulled, HubError> {
    let missing = || HubError::Offline { repo: r.repo.clone(), revision: r.revision.clone(), cache: cfg.cache.clone() };
    let is_commit = r.revision.len() == 40 && r.revision.chars().all(|c| c.is_ascii_hexdigit());
    let commit = if is_commit {
        r.revision.to_lowercase()
    } else {
        fs::read_to_string(dir.join("refs").join(&r.revision)).map_err(|_| missing())?.trim().to_owned()
    };
    let snapshot = dir.join("snapshots").join(&commit);
    let mut files = 0;
    let mut bytes = 0;
    let mut stack = vec![snapshot.clone()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).map_err(|_| missing())?.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            let rel = p.strip_prefix(&snapshot).map(|r| r.to_string_lossy().replace('\\', "/")).unwrap_or_default();
            if patterns.is_empty() || patterns.iter().any(|pat| pat.matches(&rel)) {
                // A dangling link (its blob removed) is not a file the cache holds.
                let meta = fs::metadata(&p).map_err(|_| missing())?;
                files += 1;
                bytes += meta.len();
            }
        }
    }
    if files == 0 {
        return Err(missing());
    }
    Ok(Pulled {
        repo: r.repo.clone(),
        revision: r.revision.clone(),
        commit,
        snapshot,
        files,
        downloaded_bytes: 0,
        cached_bytes: bytes,
    })
}

mod preview;
mod search;

pub use preview::{preview, Preview};
pub use search::{search, HubModel};

#[cfg(test)]
mod tests;
