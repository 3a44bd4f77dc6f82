//! Getting a model through the Hub beyond a plain pull (issue 18): the preview that says what a repo holds
//! and whether it fits before a byte of weights arrives; search; the catalogue; and grafting a raw
//! checkpoint's MTP head onto an MLX conversion that dropped it — fetching only the shard that holds the
//! head, kept only once the acceptance probe passes — over the HTTP API and on the command line.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::json;
use tandem::hub::{self, HubError, RepoRef};
use tandem::model::{self, LoadOptions};
use tandem::quant::{self, ConvertOptions, GraftOptions, MtpMode};

use super::config;
use super::mock::{files_of, serve, File, Hub, Repo, COMMIT, REPO, WEIGHTS};
use crate::common::{tempdir, tiny_model_dir};

const SHARDED: &str = "tandem/tiny-sharded";
const SHARDED_COMMIT: &str = "1111111111111111111111111111111111111111";
const MLX: &str = "tandem/tiny-mlx";
const MLX_COMMIT: &str = "2222222222222222222222222222222222222222";
const BODY_SHARD: &str = "model-00001-of-00002.safetensors";
const HEAD_SHARD: &str = "model-00002-of-00002.safetensors";

/// tandem-tiny's tensors split in two shards, the MTP head alone in the second, with an index.
fn sharded_tiny(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let bytes = std::fs::read(tiny_model_dir().join(WEIGHTS)).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let (head, body): (Vec<_>, Vec<_>) = st.tensors().into_iter().partition(|(n, _)| n.starts_with("mtp."));
    let mut map = serde_json::Map::new();
    for (file, tensors) in [(BODY_SHARD, body), (HEAD_SHARD, head)] {
        for (n, _) in &tensors {
            map.insert(n.clone(), json!(file));
        }
        safetensors::serialize_to_file(tensors, None, &dir.join(file)).unwrap();
    }
    std::fs::write(dir.join("model.safetensors.index.json"), json!({"metadata": {}, "weight_map": map}).to_string())
        .unwrap();
    for f in ["config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"] {
        std::fs::copy(tiny_model_dir().join(f), dir.join(f)).unwrap();
    }
}

/// An MLX conversion of tandem-tiny without its head, as mlx-lm writes them.
fn headless_conversion(dst: &Path, bits: Option<u8>) {
    let opts = ConvertOptions { bits, mtp: MtpMode::Drop, ..Default::default() };
    quant::convert(&tiny_model_dir(), dst, &opts, &mut |_| quant::Control::Continue).unwrap();
}

/// The mock Hub with tandem/tiny, the sharded raw checkpoint and a head-less 8-bit conversion whose
/// card names the sharded one as its base.
fn hub_with_conversion(tmp: &Path) -> Arc<Hub> {
    let sharded = tmp.join("src-sharded");
    sharded_tiny(&sharded);
    let mlx = tmp.join("src-mlx");
    headless_conversion(&mlx, Some(8));
    Hub::with(vec![
        Repo {
            id: SHARDED.into(),
            commit: SHARDED_COMMIT.into(),
            files: files_of(&sharded),
            base_model: None,
            downloads: 5,
        },
        Repo {
            id: MLX.into(),
            commit: MLX_COMMIT.into(),
            files: files_of(&mlx),
            base_model: Some(SHARDED.into()),
            downloads: 50,
        },
    ])
}

fn repo(s: &str) -> RepoRef {
    s.parse().unwrap()
}

#[test]
fn a_preview_says_what_a_repo_holds_and_whether_it_fits_without_fetching_weights() {
    let tmp = tempdir();
    let hub = hub_with_conversion(tmp.path());
    let cfg = config(&serve(hub.clone()), &tmp.path().join("cache"));

    // One weight file, no index: the names come from its safetensors header, read with two bounded
    // Range requests.
    let p = hub::preview(&cfg, &repo(REPO)).unwrap();
    let tiny = std::fs::read(tiny_model_dir().join(WEIGHTS)).unwrap();
    let st = safetensors::SafeTensors::deserialize(&tiny).unwrap();
    let head = st.names().iter().filter(|n| n.starts_with("mtp.")).count();
    assert!(head > 0);
    assert_eq!((p.commit.as_str(), p.format.as_deref(), p.quantized), (COMMIT, Some("hf"), false));
    assert_eq!((p.mtp_declared, p.mtp_tensors), (1, Some(head)));
    assert_eq!(p.head_files, vec![WEIGHTS.to_owned()]);
    assert_eq!(p.weight_bytes, tiny.len() as u64);
    let transfers = hub.requests(&hub.cdn_of(WEIGHTS));
    assert_eq!(transfers.len(), 2, "{transfers:?}");
    assert!(transfers[0].ends_with("bytes=0-7") && transfers[1].contains("bytes=8-"), "{transfers:?}");
    // Its fit counts the caches of the planned context (capped by tiny's 4,096 positions).
    let f = tandem::engine::catalog::fit_for_config(p.weight_bytes, p.config.as_ref().unwrap(), 1 << 40);
    assert_eq!(f.context_tokens, 4096);
    assert!(f.fits && f.state_bytes > 0 && f.need > p.weight_bytes + f.state_bytes, "{f:?}");

    // Sharded with an index: the index names the head's shard; no weight byte is read.
    let p = hub::preview(&cfg, &repo(SHARDED)).unwrap();
    assert_eq!((p.mtp_tensors, p.head_files.clone()), (Some(head), vec![HEAD_SHARD.to_owned()]));
    assert!(hub.requests(&hub.cdn_of(HEAD_SHARD)).is_empty() && hub.requests(&hub.cdn_of(BODY_SHARD)).is_empty());

    // A head-less MLX conversion: quantized, no head, and where it came from.
    let p = hub::preview(&cfg, &repo(MLX)).unwrap();
    assert_eq!((p.format.as_deref(), p.quantized, p.mtp_tensors), (Some("mlx"), true, Some(0)));
    assert_eq!(p.base_model.as_deref(), Some(SHARDED));
    assert!(p.head_files.is_empty());

    // Missing and gated repos say so; offline there is nothing to preview.
    assert!(matches!(hub::preview(&cfg, &repo("tandem/none")), Err(HubError::NotFound { .. })));
    hub.knobs.lock().unwrap().token = Some("hf_secret".into());
    assert!(matches!(hub::preview(&cfg, &repo(REPO)), Err(HubError::Unauthorized { token: false, .. })));
    hub.knobs.lock().unwrap().token = None;
    let offline = hub::HubConfig { offline: true, ..cfg.clone() };
    assert!(matches!(hub::preview(&offline, &repo(REPO)), Err(HubError::Offline { .. })));
}

#[test]
fn search_lists_matching_repos_most_downloaded_first() {
    let hub = Hub::with(vec![
        Repo {
            id: "tandem/tiny-mlx".into(),
            commit: MLX_COMMIT.into(),
            files: Vec::new(),
            base_model: None,
            downloads: 50,
        },
        Repo { id: "other/big".into(), commit: MLX_COMMIT.into(), files: Vec::new(), base_model: None, downloads: 99 },
    ]);
    let tmp = tempdir();
    let cfg = config(&serve(hub.clone()), tmp.path());
    let found = hub::search(&cfg, "tiny", 10).unwrap();
    let ids: Vec<&str> = found.iter().map(|m| m.id.as_str()).collect();
    // The Hub's order kept, a name no pull accepts dropped.
    assert_eq!(ids, ["tandem/tiny-mlx", REPO]);
    assert_eq!(found[0].downloads, 50);
    assert_eq!(hub::search(&cfg, "TINY", 1).unwrap().len(), 1, "limit");
    assert!(hub.requests("GET /api/models?search=").iter().any(|r| r.ends_with("=TINY")), "the query is sent as typed");
    assert!(matches!(hub::search(&cfg, "  ", 10), Err(HubError::BadQuery(_))));
    let offline = hub::HubConfig { offline: true, ..cfg };
    assert!(matches!(hub::search(&offline, "tiny", 10), Err(HubError::OfflineSearch)));
}

/// The folder's files and their bytes, to prove a graft never writes to its sources.
fn snapshot_of(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|p| (p.clone(), std::fs::read(&p).unwrap()))
        .collect();
    v.sort();
    v
}

fn probe_acceptance(dir: &Path) -> f64 {
    let m = model::load(dir, &LoadOptions::default()).unwrap();
    assert!(m.has_mtp(), "{}: {:?}", dir.display(), m.mtp_status);
    m.mtp_status.probe.as_ref().and_then(|p| p.acceptance).unwrap()
}

/// `POST /api/models/{name}/graft` on a head-less conversion: only config.json, the index and the head's
/// shard are fetched; the new model `<name>-mtp` is listed with its head running, at the raw model's
/// acceptance; the conversion is unchanged; and the refusals say why.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_headless_conversion_gets_its_head_grafted_through_the_api() {
    use crate::common::http::{get, post_json};
    let tmp = tempdir();
    let hub = hub_with_conversion(tmp.path());
    let url = serve(hub.clone());
    let models = tmp.path().join("models");
    std::fs::create_dir_all(&models).unwrap();
    let body = models.join("tiny-mlx");
    headless_conversion(&body, None);
    let before = snapshot_of(&body);
    std::fs::write(tmp.path().join("models.toml"), format!("models_dir = \"{}\"\n", models.display())).unwrap();
    let registry = tandem::registry::Registry::load(&tmp.path().join("models.toml")).unwrap();
    let engine_config =
        tandem::engine::EngineConfig { hub: config(&url, &tmp.path().join("cache")), ..Default::default() };
    let engine = tandem::engine::Engine::new(registry, engine_config);
    let mut serve_config = tandem::server::ServeConfig::new(tmp.path().join("models.toml"));
    (serve_config.port, serve_config.api_key) = (0, None);
    let server = tandem::server::start_with_engine(serve_config, engine).await.unwrap();
    let a = server.addr();

    // Its card names no base: the person must say where the head comes from.
    let e = post_json(a, "/api/models/tiny-mlx/graft", &json!({})).await.error(400, "invalid_value");
    assert!(e.contains("base_model"), "{e}");
    post_json(a, "/api/models/tiny-mlx/graft", &json!({"from": "tandem/none"})).await.error(404, "hub_not_found");
    let e = post_json(a, "/api/models/tiny-mlx/graft", &json!({"from": MLX})).await.error(400, "invalid_value");
    assert!(e.contains("no MTP head"), "{e}");
    post_json(a, "/api/models/nope/graft", &json!({})).await.error(404, "model_not_found");

    // Named in its card (as mlx-community's cards do): the default source.
    let card = std::fs::read_to_string(body.join("README.md")).unwrap_or_default();
    std::fs::write(body.join("README.md"), format!("---\nbase_model: {SHARDED}\n---\n{card}")).unwrap();
    let before = [before.into_iter().filter(|(p, _)| !p.ends_with("README.md")).collect::<Vec<_>>()].concat();
    let r = post_json(a, "/api/models/tiny-mlx/graft", &json!({})).await;
    assert_eq!(r.status, 202, "{}", r.text());
    assert_eq!((r.json()["repo"].as_str(), r.json()["graft_onto"].as_str()), (Some(SHARDED), Some("tiny-mlx")));
    let job = r.json()["job"].as_str().unwrap().to_owned();
    let events = tokio::time::timeout(std::time::Duration::from_secs(300), get(a, &format!("/api/pull/{job}/events")))
        .await
        .expect("the graft ends")
        .text();
    assert!(events.contains("\"event\":\"finished\"") && events.contains("\"model\":\"tiny-mlx-mtp\""), "{events}");

    // Only the head's files crossed the network.
    assert_eq!(hub.requests(&hub.cdn_of(HEAD_SHARD)).len(), 1);
    assert!(hub.requests(&hub.cdn_of(BODY_SHARD)).is_empty(), "the body's shard is not fetched");
    let grafted = models.join("tiny-mlx-mtp");
    let listed = get(a, "/api/models").await.json();
    let m = listed["models"].as_array().unwrap().iter().find(|m| m["name"] == "tiny-mlx-mtp").cloned();
    assert!(m.is_some_and(|m| m["mtp"]["available"] == true), "{listed}");
    let again = post_json(a, "/api/models/tiny-mlx-mtp/graft", &json!({})).await.error(400, "invalid_value");
    assert!(again.contains("already has its MTP head"), "{again}");
    server.shutdown().await.unwrap();

    // The head runs at the raw model's acceptance (bf16 body and head: within a few points), MTP is
    // lossless on it, and the conversion's own files are as they were.
    let (raw, got) = (probe_acceptance(&tiny_model_dir()), probe_acceptance(&grafted));
    assert!(got > 0.5 && (got - raw).abs() < 0.1, "grafted {got:.3} vs raw {raw:.3}");
    let m = model::load(&grafted, &LoadOptions { probe: false, ..Default::default() }).unwrap();
    let prompt = [1u32, 1113, 207, 63, 80, 275, 335, 268];
    let depth1 = tandem::generate::MtpOptions {
        enabled: true,
        depth: 1,
        adaptive: false,
        exact_verify: false,
        ..Default::default()
    };
    let ((mtp, stats), (plain, _)) =
        (crate::common::greedy(&m, &prompt, 32, Some(depth1)), crate::common::greedy(&m, &prompt, 32, None));
    assert_eq!(mtp, plain, "MTP changed the greedy output");
    assert!(stats.spec.is_some_and(|s| s.acceptance > 0.5), "the grafted head drafts");
    let after: Vec<_> = snapshot_of(&body).into_iter().filter(|(p, _)| !p.ends_with("README.md")).collect();
    assert!(after == before, "the conversion's files changed");
}

/// A head that cannot be this model's, a head that does not draft, and a source without one: each
/// refused naming why, nothing left behind.
#[test]
fn grafts_that_cannot_work_are_refused_and_leave_nothing() {
    let tmp = tempdir();
    let body = tmp.path().join("body");
    headless_conversion(&body, Some(4));
    let out = tmp.path().join("out");
    let refused = |head: &Path| {
        let e = quant::graft_head(&body, head, &out, &GraftOptions::default()).unwrap_err().to_string();
        assert!(!out.exists(), "{e}: the output exists");
        let leftovers: Vec<_> = std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(".out"))
            .collect();
        assert!(leftovers.is_empty(), "{e}: {leftovers:?}");
        e
    };
    let copy = |name: &str| {
        let d = tmp.path().join(name);
        crate::common::copy_dir(&tiny_model_dir(), &d);
        d
    };

    // Another model's head: the shape field that differs is named.
    let other = copy("other");
    let mut c: serde_json::Value = serde_json::from_slice(&std::fs::read(other.join("config.json")).unwrap()).unwrap();
    c["text_config"]["intermediate_size"] = json!(999);
    std::fs::write(other.join("config.json"), c.to_string()).unwrap();
    let e = refused(&other);
    assert!(e.contains("intermediate_size") && e.contains("999"), "{e}");

    // A head whose fusion projection is zeroed never drafts the body's tokens: the probe refuses it.
    let dead = copy("dead");
    let bytes = std::fs::read(dead.join(WEIGHTS)).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let zeros: Vec<(String, Vec<u8>, safetensors::Dtype, Vec<usize>)> = st
        .tensors()
        .into_iter()
        .map(|(n, v)| {
            let data = if n == "mtp.fc.weight" { vec![0u8; v.data().len()] } else { v.data().to_vec() };
            (n, data, v.dtype(), v.shape().to_vec())
        })
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView)> = zeros
        .iter()
        .map(|(n, d, t, s)| (n.clone(), safetensors::tensor::TensorView::new(*t, s.clone(), d).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, &dead.join(WEIGHTS)).unwrap();
    let e = refused(&dead);
    assert!(e.contains("does not run"), "{e}");

    // A conversion without a head as the source.
    let e = refused(&body.clone());
    assert!(e.contains("no MTP layers"), "{e}");
    // The body unchanged by all of it: still head-less, still loads.
    let m = model::load(&body, &LoadOptions { probe: false, ..Default::default() }).unwrap();
    assert!(!m.has_mtp());
}

/// `tandem graft` on the command line: the head of `--from` fetched and grafted, the new model named.
#[test]
fn tandem_graft_on_the_command_line_names_the_new_model() {
    let tmp = tempdir();
    let hub = hub_with_conversion(tmp.path());
    let url = serve(hub.clone());
    let models = tmp.path().join("models");
    let body = models.join("tiny-mlx");
    std::fs::create_dir_all(&models).unwrap();
    headless_conversion(&body, None);
    std::fs::write(tmp.path().join("models.toml"), format!("models_dir = \"{}\"\n", models.display())).unwrap();
    let out = std::process::Command::new(crate::common::repo().join("target/debug/tandem"))
        .args(["graft", "tiny-mlx", "--from", SHARDED, "--quiet"])
        .env("TANDEM_CONFIG", tmp.path().join("models.toml"))
        .env("HF_ENDPOINT", &url)
        .env("HF_HUB_CACHE", tmp.path().join("cache"))
        .env_remove("HF_TOKEN")
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("MTP head grafted") && stdout.contains("tandem chat --model tiny-mlx-mtp"), "{stdout}");
    assert!(models.join("tiny-mlx-mtp").join("mtp.safetensors").is_file());
    // Without --from and without a base in its card: told what to pass.
    let out = std::process::Command::new(crate::common::repo().join("target/debug/tandem"))
        .args(["graft", "tiny-mlx", "--quiet"])
        .env("TANDEM_CONFIG", tmp.path().join("models.toml"))
        .env("HF_ENDPOINT", &url)
        .env("HF_HUB_CACHE", tmp.path().join("cache"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("--from ORG/NAME"), "{stderr}");
}

/// The catalogue: the built-in Qwen3.5 repos with their fit here, models.toml's own entries, and the
/// model a downloaded repo became.
#[test]
fn the_catalogue_shows_fits_own_entries_and_what_is_downloaded() {
    let tmp = tempdir();
    let hub = Hub::tiny();
    let cfg = config(&serve(hub), &tmp.path().join("cache"));
    let models = tmp.path().join("models");
    std::fs::write(
        tmp.path().join("models.toml"),
        format!(
            "models_dir = \"{}\"\n[[catalog]]\nrepo = \"{REPO}\"\nformat = \"hf\"\nparams_b = 0.00727\nbits = 16\nmtp = true\n",
            models.display()
        ),
    )
    .unwrap();
    let load = || tandem::registry::Registry::load(&tmp.path().join("models.toml")).unwrap();
    let engine =
        |r| tandem::engine::Engine::new(r, tandem::engine::EngineConfig { hub: cfg.clone(), ..Default::default() });
    let e = engine(load());
    let view = e.catalog();
    let big = view.iter().find(|v| v.entry.repo == "Qwen/Qwen3.5-27B").expect("built in");
    assert!(big.estimated_bytes > 50_000_000_000 && big.fit.need > big.estimated_bytes, "{big:?}");
    let own = view.iter().find(|v| v.entry.repo == REPO).expect("models.toml's entry");
    assert!(own.fit.fits && own.model.is_none(), "{own:?}");

    let pulled = hub::pull(&cfg, &repo(REPO), &Default::default(), &mut |_| hub::Control::Continue).unwrap();
    hub::link_into_models(&models, &pulled).unwrap();
    let view = engine(load()).catalog();
    assert_eq!(view.iter().find(|v| v.entry.repo == REPO).unwrap().model.as_deref(), Some("tiny"));
    let _ = File::new; // (the mock's constructor, used by other tests)
}
