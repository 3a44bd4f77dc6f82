//! `tandem pull` (`tandem::hub`) against a mock of the Hugging Face Hub started here on 127.0.0.1: the
//! endpoints and headers the client uses (the `?blobs=true` listing, `resolve` answered with a redirect to
//! a CDN path, `X-Repo-Commit` and `ETag`, HTTP Range), serving the bundled tandem-tiny as `tandem/tiny`.
//! A full download; a second pull downloading nothing; an interrupted transfer resumed with a Range
//! request; a corrupted file refused by checksum; a gated repo (401) with and without a token; 404; a disk
//! too small; a cancel mid-file leaving no visible partial model; offline mode; the CLI.

mod mock;
mod models;

use std::path::{Path, PathBuf};

use tandem::hub::{self, Control, HubConfig, HubError, PullEvent, PullOptions, RepoRef};

use crate::common::{self, tempdir, tiny_model_dir};
use mock::{serve, Hub, COMMIT, REPO, WEIGHTS};

pub(crate) fn config(endpoint: &str, cache: &Path) -> HubConfig {
    HubConfig { endpoint: endpoint.to_owned(), token: None, cache: cache.to_owned(), offline: false }
}

fn pull(cfg: &HubConfig, opts: &PullOptions) -> Result<hub::Pulled, HubError> {
    hub::pull(cfg, &REPO.parse().unwrap(), opts, &mut |_| Control::Continue)
}

fn snapshot(cache: &Path) -> PathBuf {
    hub::repo_dir(cache, REPO).join("snapshots").join(COMMIT)
}

/// The snapshot holds exactly tandem-tiny's files, byte for byte.
fn assert_complete(cache: &Path) {
    let snap = snapshot(cache);
    for e in std::fs::read_dir(tiny_model_dir()).unwrap() {
        let e = e.unwrap();
        let got = std::fs::read(snap.join(e.file_name())).unwrap_or_else(|err| panic!("{:?}: {err}", e.file_name()));
        assert!(got == std::fs::read(e.path()).unwrap(), "{:?} differs", e.file_name());
    }
}

#[test]
fn a_pull_downloads_verifies_links_and_a_second_pull_downloads_nothing() {
    let hub = Hub::tiny();
    let url = serve(hub.clone());
    let tmp = tempdir();
    let cache = tmp.path().join("hub");
    let cfg = config(&url, &cache);
    let mut events = Vec::new();
    let pulled = hub::pull(&cfg, &REPO.parse().unwrap(), &PullOptions::default(), &mut |e| {
        events.push(e);
        Control::Continue
    })
    .unwrap();
    assert_eq!((pulled.commit.as_str(), pulled.files), (COMMIT, hub.files.len()));
    let total: u64 = hub.files.iter().map(|f| f.bytes.len() as u64).sum();
    assert_eq!((pulled.downloaded_bytes, pulled.cached_bytes), (total, 0));
    assert_complete(&cache);
    // The standard layout: blobs named by sha256 (LFS) or blob id, relative links, the ref recorded.
    let repo = hub::repo_dir(&cache, REPO);
    let weights = hub.files.iter().find(|f| f.path == WEIGHTS).unwrap();
    assert!(repo.join("blobs").join(&weights.sha256).is_file());
    assert_eq!(
        std::fs::read_link(snapshot(&cache).join(WEIGHTS)).unwrap(),
        Path::new("../../blobs").join(&weights.sha256)
    );
    assert_eq!(std::fs::read_to_string(repo.join("refs/main")).unwrap(), COMMIT);
    assert!(matches!(&events[0], PullEvent::Listed { total_bytes, .. } if *total_bytes == total), "{:?}", events[0]);
    assert!(events.iter().any(|e| matches!(e, PullEvent::Progress { file, .. } if file == WEIGHTS)));
    assert_eq!(hub.requests("GET /cdn/").len(), hub.files.len(), "each file once, through the redirect");

    // Linked into the models folder: listed by the registry, loadable.
    let models = tmp.path().join("models");
    let link = hub::link_into_models(&models, &pulled).unwrap();
    assert_eq!(link, models.join("tiny"));
    let model = tandem::model::load(&link, &tandem::model::LoadOptions { probe: false, ..Default::default() }).unwrap();
    assert!(model.has_mtp());
    // Again: nothing downloaded, the link re-pointed (not a second one).
    let again = pull(&cfg, &PullOptions::default()).unwrap();
    assert_eq!((again.downloaded_bytes, again.cached_bytes), (0, total));
    assert_eq!(hub.requests("GET /cdn/").len(), hub.files.len(), "a second pull fetches no file");
    assert_eq!(hub::link_into_models(&models, &again).unwrap(), link);
    // A real folder of that name is never replaced: ORG--NAME instead.
    std::fs::remove_file(&link).unwrap();
    std::fs::create_dir(&link).unwrap();
    assert_eq!(hub::link_into_models(&models, &again).unwrap(), models.join("tandem--tiny"));

    // Offline: the cache answers, the Hub is not asked.
    let asked = hub.log.lock().unwrap().len();
    let off = HubConfig { offline: true, ..cfg.clone() };
    let cached = pull(&off, &PullOptions::default()).unwrap();
    assert_eq!((cached.commit.as_str(), cached.files, cached.downloaded_bytes), (COMMIT, hub.files.len(), 0));
    let at_commit = hub::pull(&off, &format!("{REPO}@{COMMIT}").parse().unwrap(), &PullOptions::default(), &mut |_| {
        Control::Continue
    });
    assert_eq!(at_commit.unwrap().snapshot, snapshot(&cache));
    let e =
        hub::pull(&off, &format!("{REPO}@v2").parse().unwrap(), &PullOptions::default(), &mut |_| Control::Continue)
            .unwrap_err();
    assert!(matches!(e, HubError::Offline { .. }) && e.to_string().contains("HF_HUB_OFFLINE"), "{e}");
    assert_eq!(hub.log.lock().unwrap().len(), asked, "offline asks nothing");
}

#[test]
fn an_interrupted_transfer_resumes_and_a_corrupted_file_is_refused() {
    let hub = Hub::tiny();
    let url = serve(hub.clone());
    let tmp = tempdir();
    let cache = tmp.path().join("hub");
    let cfg = config(&url, &cache);
    let weights = hub.files.iter().find(|f| f.path == WEIGHTS).unwrap();
    let size = weights.bytes.len() as u64;

    hub.knobs.lock().unwrap().cut_once.insert(WEIGHTS.into());
    let e = pull(&cfg, &PullOptions::default()).unwrap_err();
    assert!(matches!(e, HubError::Network { .. }), "{e}");
    let part = hub::repo_dir(&cache, REPO).join("blobs").join(format!("{}.incomplete", weights.sha256));
    let kept = std::fs::metadata(&part).unwrap().len();
    assert!(kept > 0 && kept < size, "half a file kept for the resume: {kept} of {size}");
    assert!(!snapshot(&cache).join(WEIGHTS).exists(), "no visible partial weights");
    let resumed = pull(&cfg, &PullOptions::default()).unwrap();
    let range = format!("GET /cdn/{} bytes={kept}-", weights.sha256);
    assert!(hub.requests(&range).len() == 1, "resumed with a Range request: {:?}", hub.requests("GET /cdn/"));
    assert!(resumed.downloaded_bytes < resumed.cached_bytes + size, "{resumed:?}");
    assert_complete(&cache);
    assert!(!part.exists());

    // Corrupted on the way: refused by its sha256, nothing kept, nothing linked.
    let fresh = tmp.path().join("hub2");
    hub.knobs.lock().unwrap().corrupt.insert(WEIGHTS.into());
    let e = pull(&config(&url, &fresh), &PullOptions::default()).unwrap_err();
    let message = e.to_string();
    assert!(
        matches!(e, HubError::Checksum { .. }) && message.contains(WEIGHTS) && message.contains(&weights.sha256),
        "{message}"
    );
    let blobs = hub::repo_dir(&fresh, REPO).join("blobs");
    assert!(!blobs.join(&weights.sha256).exists() && !blobs.join(format!("{}.incomplete", weights.sha256)).exists());
    assert!(!snapshot(&fresh).join(WEIGHTS).exists());
}

#[test]
fn gated_missing_full_disk_and_cancelled_pulls_say_why_and_leave_no_model() {
    let hub = Hub::tiny();
    let url = serve(hub.clone());
    let tmp = tempdir();
    let cache = tmp.path().join("hub");
    let cfg = config(&url, &cache);

    hub.knobs.lock().unwrap().token = Some("hf_secret".into());
    let e = pull(&cfg, &PullOptions::default()).unwrap_err();
    assert!(matches!(e, HubError::Unauthorized { status: 401, token: false, .. }), "{e}");
    assert!(e.to_string().contains("gated") && e.to_string().contains("HF_TOKEN"), "{e}");
    let wrong = HubConfig { token: Some("hf_wrong".into()), ..cfg.clone() };
    let e = pull(&wrong, &PullOptions::default()).unwrap_err();
    assert!(e.to_string().contains("does not grant"), "{e}");
    let with = HubConfig { token: Some("hf_secret".into()), ..cfg.clone() };
    pull(&with, &PullOptions { include: vec!["*.json".into()], ..Default::default() }).expect("the token opens it");
    assert!(!snapshot(&cache).join(WEIGHTS).exists(), "--include took the JSON files only");
    hub.knobs.lock().unwrap().token = None;

    let e = hub::pull(&cfg, &"tandem/nope".parse().unwrap(), &PullOptions::default(), &mut |_| Control::Continue)
        .unwrap_err();
    assert!(matches!(e, HubError::NotFound { .. }) && e.to_string().contains("tandem/nope"), "{e}");
    let e = pull(&cfg, &PullOptions { include: vec!["*.gguf".into()], ..Default::default() }).unwrap_err();
    assert!(e.to_string().contains("*.gguf"), "{e}");

    let small = tmp.path().join("small");
    let e = pull(&config(&url, &small), &PullOptions { free_space: Some(1 << 20), ..Default::default() }).unwrap_err();
    assert!(matches!(e, HubError::DiskSpace { available: 1048576, .. }), "{e}");
    assert!(e.to_string().contains("1048576 bytes free"), "{e}");
    let blobs = hub::repo_dir(&small, REPO).join("blobs");
    assert_eq!(std::fs::read_dir(&blobs).map(|d| d.count()).unwrap_or(0), 0, "nothing written");

    // Cancelled in the middle of the weights: no snapshot link for them, no link in the models folder.
    let mid = tmp.path().join("mid");
    let r: RepoRef = REPO.parse().unwrap();
    let e = hub::pull(&config(&url, &mid), &r, &PullOptions::default(), &mut |ev| match ev {
        PullEvent::Progress { file, file_done, .. } if file == WEIGHTS && file_done > 0 => Control::Cancel,
        _ => Control::Continue,
    })
    .unwrap_err();
    assert!(matches!(e, HubError::Cancelled), "{e}");
    assert!(!snapshot(&mid).join(WEIGHTS).exists());
    assert!(!tandem::registry::is_model_folder(&snapshot(&mid)), "no visible partial model");
}

#[test]
fn tandem_pull_on_the_command_line_links_the_model_and_says_what_next() {
    let hub = Hub::tiny();
    let url = serve(hub.clone());
    let tmp = tempdir();
    let models = tmp.path().join("models");
    std::fs::write(tmp.path().join("models.toml"), format!("models_dir = \"{}\"\n", models.display())).unwrap();
    let out = std::process::Command::new(common::repo().join("target/debug/tandem"))
        .args(["pull", REPO])
        .env("TANDEM_CONFIG", tmp.path().join("models.toml"))
        .env("HF_ENDPOINT", &url)
        .env("HF_HOME", tmp.path().join("hf"))
        .env_remove("HF_HUB_CACHE")
        .env_remove("HF_TOKEN")
        .env_remove("HF_HUB_OFFLINE")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("as model `tiny`") && stdout.contains("tandem chat --model tiny"), "{stdout}");
    assert!(stdout.contains("tandem convert tiny --bits 4"), "a raw checkpoint is offered a conversion: {stdout}");
    assert!(stdout.contains("of memory to run; this machine has"), "{stdout}");
    assert!(tandem::registry::is_model_folder(&models.join("tiny")));
    assert!(tmp.path().join("hf/hub/models--tandem--tiny/snapshots").join(COMMIT).is_dir(), "HF_HOME's hub cache");
    let bad = std::process::Command::new(common::repo().join("target/debug/tandem"))
        .args(["pull", "not a repo"])
        .env("TANDEM_CONFIG", tmp.path().join("models.toml"))
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("`not a repo` is not a Hugging Face model repo"));
}

/// `POST /api/pull` runs the download as an engine job: its events stream (and replay to a late
/// listener), `GET /api/pull` lists it after a reload, the model appears under `/api/models`, and a
/// bad repo or a gated one is a clear error.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_api_downloads_as_a_job_and_the_model_is_listed() {
    use crate::common::http::{get, post_json, send};
    use serde_json::json;
    let hub = Hub::tiny();
    let url = serve(hub.clone());
    let tmp = tempdir();
    let models = tmp.path().join("models");
    std::fs::write(tmp.path().join("models.toml"), format!("models_dir = \"{}\"\n", models.display())).unwrap();
    let registry = tandem::registry::Registry::load(&tmp.path().join("models.toml")).unwrap();
    let engine_config =
        tandem::engine::EngineConfig { hub: config(&url, &tmp.path().join("hub")), ..Default::default() };
    let engine = tandem::engine::Engine::new(registry, engine_config);
    let mut serve_config = tandem::server::ServeConfig::new(tmp.path().join("models.toml"));
    (serve_config.port, serve_config.api_key) = (0, None);
    let server = tandem::server::start_with_engine(serve_config, engine).await.unwrap();
    let a = server.addr();

    post_json(a, "/api/pull", &json!({"repo": "no-slash"})).await.error(400, "invalid_value");
    let r = post_json(a, "/api/pull", &json!({"repo": REPO})).await;
    assert_eq!(r.status, 202, "{}", r.text());
    let job = r.json()["job"].as_str().unwrap().to_owned();
    let events = tokio::time::timeout(std::time::Duration::from_secs(120), get(a, &format!("/api/pull/{job}/events")))
        .await
        .expect("the download ends");
    let text = events.text();
    assert!(text.contains("\"event\":\"finished\"") && text.contains("\"model\":\"tiny\""), "{text}");
    // A late listener gets the end at once; the list keeps the job.
    let again = get(a, &format!("/api/pull/{job}/events")).await.text();
    assert!(again.contains("\"event\":\"finished\""), "{again}");
    let list = get(a, "/api/pull").await.json();
    assert_eq!(list["downloads"][0]["state"], "finished", "{list}");
    assert_eq!(list["downloads"][0]["commit"], COMMIT);
    // Whether it fits this machine: tandem-tiny's 14.6 MB of weights always do.
    let fit = &list["downloads"][0]["fit"];
    assert!(
        fit["fits"] == true && fit["need"].as_u64().unwrap() > 14_000_000 && fit["recommended_bits"].is_null(),
        "{fit}"
    );
    let listed = get(a, "/api/models").await.json();
    assert!(listed["models"].as_array().unwrap().iter().any(|m| m["name"] == "tiny"), "{listed}");
    assert_eq!(send(a, "DELETE", &format!("/api/pull/{job}"), &[], b"").await.status, 200);
    get(a, &format!("/api/pull/{job}")).await.error(404, "download_not_found");

    // A gated repo ends in an error event that says what to do.
    hub.knobs.lock().unwrap().token = Some("hf_secret".into());
    let r = post_json(a, "/api/pull", &json!({"repo": REPO})).await;
    let job = r.json()["job"].as_str().unwrap().to_owned();
    let events = tokio::time::timeout(std::time::Duration::from_secs(60), get(a, &format!("/api/pull/{job}/events")))
        .await
        .unwrap()
        .text();
    assert!(events.contains("\"event\":\"error\"") && events.contains("HF_TOKEN"), "{events}");
    server.shutdown().await.unwrap();
}
