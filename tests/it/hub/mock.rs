//! A mock of the Hugging Face Hub on 127.0.0.1: the endpoints and headers the client uses (the
//! `?blobs=true` listing with its card data, `resolve` answered with a redirect to a CDN path,
//! `X-Repo-Commit` and `ETag`, HTTP Range — open-ended and bounded —, `/api/models?search=`), serving
//! the bundled tandem-tiny as `tandem/tiny` and any other repos a test adds.

use std::collections::HashSet;
use std::path::Path;
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use sha2::{Digest, Sha256};

use crate::common::tiny_model_dir;

pub const REPO: &str = "tandem/tiny";
pub const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";
pub const WEIGHTS: &str = "model.safetensors";

pub struct File {
    pub path: String,
    pub bytes: Bytes,
    pub sha256: String,
    pub lfs: bool,
}

impl File {
    pub fn new(path: &str, bytes: Vec<u8>) -> File {
        // As the Hub stores them: weights and the tokenizer in LFS, small text files in git.
        let lfs = path.ends_with(".safetensors") || path == "tokenizer.json";
        File { sha256: sha256(&bytes), path: path.to_owned(), bytes: Bytes::from(bytes), lfs }
    }
}

/// Files of a folder (not recursive), sorted by name.
pub fn files_of(dir: &Path) -> Vec<File> {
    let mut files: Vec<File> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.path().is_file())
        .map(|e| File::new(&e.file_name().to_string_lossy(), std::fs::read(e.path()).unwrap()))
        .collect();
    files.sort_by(|a, b| a.path.cmp(&b.path));
    files
}

/// A repo besides `tandem/tiny`.
pub struct Repo {
    pub id: String,
    pub commit: String,
    pub files: Vec<File>,
    /// The card's `base_model`.
    pub base_model: Option<String>,
    pub downloads: u64,
}

#[derive(Default)]
pub struct Knobs {
    /// Serve only this token's requests (a gated repo).
    pub token: Option<String>,
    /// Files whose bytes arrive altered.
    pub corrupt: HashSet<String>,
    /// Files whose next transfer breaks halfway (then the knob is spent).
    pub cut_once: HashSet<String>,
}

pub struct Hub {
    /// tandem/tiny's files.
    pub files: Vec<File>,
    pub others: Vec<Repo>,
    pub knobs: Mutex<Knobs>,
    /// Each request as "METHOD PATH [range]".
    pub log: Mutex<Vec<String>>,
}

pub fn sha256(b: &[u8]) -> String {
    Sha256::digest(b).iter().map(|x| format!("{x:02x}")).collect()
}

impl Hub {
    pub fn tiny() -> Arc<Hub> {
        Hub::with(Vec::new())
    }

    pub fn with(others: Vec<Repo>) -> Arc<Hub> {
        Arc::new(Hub { files: files_of(&tiny_model_dir()), others, knobs: Mutex::default(), log: Mutex::default() })
    }

    /// (commit, files, base_model) of a repo.
    fn repo(&self, id: &str) -> Option<(&str, &[File], Option<&str>)> {
        if id == REPO {
            return Some((COMMIT, &self.files, None));
        }
        self.others.iter().find(|r| r.id == id).map(|r| (r.commit.as_str(), &r.files[..], r.base_model.as_deref()))
    }

    fn all_files(&self) -> impl Iterator<Item = &File> {
        self.files.iter().chain(self.others.iter().flat_map(|r| r.files.iter()))
    }

    fn authorized(&self, headers: &HeaderMap) -> bool {
        let want = self.knobs.lock().unwrap().token.clone();
        let sent = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).map(str::to_owned);
        want.is_none_or(|t| sent == Some(format!("Bearer {t}")))
    }

    fn note(&self, what: String) {
        self.log.lock().unwrap().push(what);
    }

    pub fn requests(&self, prefix: &str) -> Vec<String> {
        self.log.lock().unwrap().iter().filter(|l| l.starts_with(prefix)).cloned().collect()
    }

    /// The CDN path of a file (what the log shows for its transfers).
    pub fn cdn_of(&self, path: &str) -> String {
        let f = self.all_files().find(|f| f.path == path).unwrap();
        format!("GET /cdn/{}", f.sha256)
    }
}

fn not_found() -> Response {
    (StatusCode::NOT_FOUND, axum::Json(serde_json::json!({"error": "Repository not found"}))).into_response()
}

async fn info(
    State(hub): State<Arc<Hub>>,
    UrlPath((org, name, rev)): UrlPath<(String, String, String)>,
    headers: HeaderMap,
) -> Response {
    hub.note(format!("GET /api/models/{org}/{name}/revision/{rev}"));
    let id = format!("{org}/{name}");
    let Some((commit, files, base)) = hub.repo(&id).filter(|(c, _, _)| rev == "main" || rev == *c) else {
        return not_found();
    };
    if !hub.authorized(&headers) {
        return (StatusCode::UNAUTHORIZED, format!("Access to model {id} is restricted")).into_response();
    }
    let siblings: Vec<_> = files
        .iter()
        .map(|f| {
            let blob_id = &f.sha256[..40];
            if f.lfs {
                serde_json::json!({"rfilename": f.path, "size": f.bytes.len(), "blobId": blob_id,
                    "lfs": {"sha256": f.sha256, "size": f.bytes.len(), "pointerSize": 134}})
            } else {
                serde_json::json!({"rfilename": f.path, "size": f.bytes.len(), "blobId": blob_id})
            }
        })
        .collect();
    let mut body = serde_json::json!({"id": id, "sha": commit, "siblings": siblings});
    if let Some(base) = base {
        body["cardData"] = serde_json::json!({"base_model": [base], "library_name": "mlx"});
    }
    axum::Json(body).into_response()
}

/// `resolve`: a redirect to the CDN, as the Hub answers for LFS files, with the commit and ETag headers.
async fn resolve(
    State(hub): State<Arc<Hub>>,
    UrlPath((org, name, rev, file)): UrlPath<(String, String, String, String)>,
    headers: HeaderMap,
) -> Response {
    hub.note(format!("GET /{org}/{name}/resolve/{rev}/{file}"));
    if !hub.authorized(&headers) {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    let Some((commit, files, _)) = hub.repo(&format!("{org}/{name}")) else { return not_found() };
    let Some(f) = files.iter().find(|f| f.path == file).filter(|_| rev == commit) else { return not_found() };
    Response::builder()
        .status(StatusCode::FOUND)
        .header(header::LOCATION, format!("/cdn/{}", f.sha256))
        .header("X-Repo-Commit", commit)
        .header(header::ETAG, format!("\"{}\"", f.sha256))
        .body(Body::empty())
        .unwrap()
}

async fn cdn(State(hub): State<Arc<Hub>>, UrlPath(sha): UrlPath<String>, headers: HeaderMap) -> Response {
    let range = headers.get(header::RANGE).and_then(|v| v.to_str().ok()).map(str::to_owned);
    hub.note(format!("GET /cdn/{sha} {}", range.clone().unwrap_or_default()));
    let Some(f) = hub.all_files().find(|f| f.sha256 == sha) else { return not_found() };
    let (corrupt, cut) = {
        let mut k = hub.knobs.lock().unwrap();
        (k.corrupt.contains(&f.path), k.cut_once.remove(&f.path))
    };
    let mut bytes = f.bytes.to_vec();
    if corrupt {
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0xff;
    }
    // `bytes=FROM-` or `bytes=FROM-TO` (inclusive).
    let (from, to) = range
        .as_deref()
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.split_once('-'))
        .map(|(a, b)| (a.parse::<usize>().unwrap_or(0), b.parse::<usize>().ok()))
        .unwrap_or((0, None));
    let from = from.min(bytes.len());
    let end = to.map_or(bytes.len(), |t| (t + 1).min(bytes.len())).max(from);
    let body = bytes[from..end].to_vec();
    let partial = range.is_some() && (from > 0 || end < bytes.len());
    let status = if partial { StatusCode::PARTIAL_CONTENT } else { StatusCode::OK };
    let mut res = Response::builder()
        .status(status)
        .header(header::CONTENT_LENGTH, body.len())
        .header(header::ACCEPT_RANGES, "bytes");
    if partial {
        res = res.header(header::CONTENT_RANGE, format!("bytes {from}-{}/{}", end.saturating_sub(1), bytes.len()));
    }
    if cut {
        // Half the bytes, then the connection breaks (the declared length is never reached).
        let half = Bytes::from(body[..body.len() / 2].to_vec());
        let chunks: Vec<Result<Bytes, std::io::Error>> = vec![Ok(half), Err(std::io::Error::other("connection cut"))];
        return res.body(Body::from_stream(futures::stream::iter(chunks))).unwrap();
    }
    res.body(Body::from(body)).unwrap()
}

#[derive(serde::Deserialize)]
struct Search {
    search: String,
    limit: Option<usize>,
}

/// `/api/models?search=`: ids containing the text (case-insensitive), most downloaded first.
async fn search(State(hub): State<Arc<Hub>>, Query(q): Query<Search>) -> Response {
    hub.note(format!("GET /api/models?search={}", q.search));
    let needle = q.search.to_lowercase();
    let mut found: Vec<(String, u64)> = std::iter::once((REPO.to_owned(), 10))
        .chain(hub.others.iter().map(|r| (r.id.clone(), r.downloads)))
        .filter(|(id, _)| id.to_lowercase().contains(&needle))
        .collect();
    found.sort_by_key(|f| std::cmp::Reverse(f.1));
    found.truncate(q.limit.unwrap_or(1000));
    let mut body: Vec<serde_json::Value> = found
        .into_iter()
        .map(|(id, downloads)| serde_json::json!({"_id": "x", "id": id, "downloads": downloads, "likes": 1, "tags": ["safetensors"]}))
        .collect();
    // What a real search may also return: a name no pull would accept (dropped by the client).
    if needle == "tiny" {
        body.push(serde_json::json!({"id": "not a repo", "downloads": 0}));
    }
    axum::Json(body).into_response()
}

/// The mock on an ephemeral port; its base URL.
pub fn serve(hub: Arc<Hub>) -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(async move {
            let app = Router::new()
                .route("/api/models", get(search))
                .route("/api/models/{org}/{name}/revision/{rev}", get(info))
                .route("/{org}/{name}/resolve/{rev}/{*file}", get(resolve))
                .route("/cdn/{sha}", get(cdn))
                .with_state(hub);
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            axum::serve(listener, app).await.unwrap();
        });
    });
    format!("http://{}", rx.recv().unwrap())
}
