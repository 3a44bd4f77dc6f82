//! Tandem's desktop shell. It adds a window, a tray (menu-bar) icon and native drag and drop to the
//! engine and HTTP server that `tandem serve` runs, in this one process, and nothing else:
//!
//! - the engine ([`tandem::engine::Engine`]) and the HTTP server ([`tandem::server`]) start here, on
//!   the address models.toml's `[server]` gives (127.0.0.1:11435 unless set; a free port when that one is taken);
//! - the window loads the web UI from that server, so the UI and the API share one origin (no CORS,
//!   no CSP exceptions, the same files and code paths as in a browser);
//! - the tray menu shows the loaded model, live tok/s and memory from `Engine::subscribe_stats`, and
//!   loads or unloads the default model through the engine's API;
//! - a folder dropped on the window is chosen in the engine (conversions may read it) and handed to
//!   the UI (`window.onFolderDropped`);
//! - the UI's Browse… opens the native folder dialog through `POST /api/folders/pick`, which only this
//!   window can call: it carries a token the shell gives the window alone (`folder_dialog`);
//! - one instance: a second launch brings this window forward and exits (the single-instance plugin),
//!   so two engines never serve the same models.toml and models folder.

// No console window next to the app on Windows release builds.
#![cfg_attr(not(debug_assertions), windows_subsystem = "windows")]

mod folder_dialog;
mod folder_drop;
mod locations;
mod tray;
mod webview_language;

use std::sync::Mutex;

use anyhow::Context;
use tandem::engine::Engine;
use tandem::registry::Registry;
use tandem::server::{RunningServer, ServeConfig};
use tauri::{Manager, RunEvent, WebviewUrl, WebviewWindow, WebviewWindowBuilder, WindowEvent};

/// On Linux the engine here allocates as the `tandem` CLI's does: every allocation of the process, MLX's
/// C++ ones and the webview's included, goes to mimalloc (the crate's `override` feature), where glibc's
/// malloc took a quarter of the thread launching MLX's work (docs/PERF.md, session 29). macOS keeps its own.
#[cfg(target_os = "linux")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The label of the one window.
pub const MAIN_WINDOW: &str = "main";

/// What the app holds while it runs: the server (stopped on exit) and its engine.
struct Running {
    server: Mutex<Option<RunningServer>>,
    engine: Engine,
}

fn main() {
    // Conversion jobs run in this process: a write past `ulimit -f` must fail, not kill the app.
    tandem::quant::fail_writes_past_the_file_size_limit();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TANDEM_LOG")
                .or_else(|_| tracing_subscriber::EnvFilter::try_from_default_env())
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();

    let app = tauri::Builder::default()
        // First of all: a second launch finds this one (D-Bus on Linux, a socket on macOS), hands it
        // its arguments and exits before starting an engine of its own; this one shows its window.
        .plugin(tauri_plugin_single_instance::init(|app, argv, _cwd| {
            // The desktop smoke test waits for this line.
            tracing::info!(?argv, "another launch of Tandem: showing this window instead");
            show_main_window(app);
        }))
        .setup(|app| {
            if let Err(error) = start(app) {
                // The person sees why in the window rather than a window that never appears.
                tracing::error!("{error:#}");
                show_startup_error(app.handle(), &format!("{error:#}"))?;
            }
            Ok(())
        })
        .build(tauri::generate_context!())
        .expect("cannot start the Tandem window (is a display available?)");

    app.run(|app, event| match event {
        RunEvent::WindowEvent { label, event: WindowEvent::CloseRequested { api, .. }, .. } if label == MAIN_WINDOW => {
            // On macOS the app lives on in the menu bar when its window closes (the tray's "Show
            // Tandem" or the Dock icon brings it back); elsewhere closing the window quits.
            if cfg!(target_os = "macos") {
                api.prevent_close();
                if let Some(window) = app.get_webview_window(MAIN_WINDOW) {
                    let _ = window.hide();
                }
            }
        }
        #[cfg(target_os = "macos")]
        RunEvent::Reopen { .. } => show_main_window(app),
        RunEvent::Exit => stop(app),
        _ => {}
    });
}

/// Engine, server, window, tray.
fn start(app: &mut tauri::App) -> anyhow::Result<()> {
    let resources = app.path().resource_dir().ok();
    let places = locations::Locations::resolve(resources.as_deref())?;
    tracing::info!(config = %places.models_toml.display(), ui = ?places.ui_dir, "starting Tandem");

    let mut config = ServeConfig::new(&places.models_toml);
    let picker = folder_dialog::picker(app.handle().clone())?;
    let shell_script = folder_dialog::window_script(&picker);
    config.folder_picker = Some(picker);
    if let Some(ui_dir) = places.ui_dir {
        config.ui_dir = ui_dir;
    }
    let registry =
        Registry::load(&config.registry).with_context(|| format!("cannot load {}", config.registry.display()))?;
    // models.toml's [server]: the port, loopback or every interface, the API key.
    config.listen_as(registry.server());
    // The window's own requests carry the key when one is required.
    let key_script = format!("window.__TANDEM_API_KEY__ = {};", serde_json::to_string(&config.api_key)?);
    let engine = Engine::new(registry, config.engine.clone());
    let server = tauri::async_runtime::block_on(listen(config, engine.clone()))?;
    let url = server.url();
    tracing::info!("Tandem is serving on {url} (UI and API)");
    // Tests and scripts read this line to find the server.
    println!("Tandem is serving on {url}");

    // The window opens blank, gets its language (see webview_language), then loads the UI.
    let ui_url: tauri::Url = url.parse().context("the server's URL")?;
    let window = WebviewWindowBuilder::new(app, MAIN_WINDOW, WebviewUrl::External("about:blank".parse()?))
        .title("Tandem")
        .inner_size(1200.0, 800.0)
        .min_inner_size(720.0, 480.0)
        // The UI would find the API on its own origin anyway; this says so explicitly.
        .initialization_script(format!("window.__TANDEM_API__ = {};", serde_json::to_string(&url)?))
        .initialization_script(&shell_script)
        .initialization_script(&key_script)
        // The window shows the app only: links elsewhere (say, in a model's answer) do not replace it.
        .on_navigation({
            let origin = url.clone();
            move |target| {
                let ok = same_origin(target, &origin) || target.as_str() == "about:blank";
                if !ok {
                    tracing::info!("not navigating the window to {target}");
                }
                ok
            }
        })
        .on_page_load(|_, payload| {
            if matches!(payload.event(), tauri::webview::PageLoadEvent::Finished) {
                // The desktop smoke test waits for this line.
                tracing::info!("window loaded {}", payload.url());
            }
        })
        .build()
        .context("cannot open the window")?;
    webview_language::apply(&window).context("cannot set the window's language")?;
    window.navigate(ui_url).context("cannot load the UI")?;
    deliver_drops(&window, engine.clone());

    // The app works without its tray icon (e.g. a Linux desktop without an indicator host).
    if let Err(error) = tray::install(app.handle(), engine.clone(), url) {
        tracing::warn!("no tray icon: {error}");
    }
    app.manage(Running { server: Mutex::new(Some(server)), engine });
    Ok(())
}

/// Binds the port from `TANDEM_PORT` (0: any free one), else models.toml's (11435 unless set), else a
/// free one when that is taken (e.g. by a `tandem serve`).
async fn listen(mut config: ServeConfig, engine: Engine) -> anyhow::Result<RunningServer> {
    if let Some(port) = std::env::var("TANDEM_PORT").ok().filter(|p| !p.trim().is_empty()) {
        config.port = port.trim().parse().with_context(|| format!("TANDEM_PORT `{port}` is not a port number"))?;
        return tandem::server::start_with_engine(config, engine).await;
    }
    match tandem::server::start_with_engine(config.clone(), engine.clone()).await {
        Ok(server) => Ok(server),
        Err(error) => {
            tracing::warn!("{error:#}; using a free port instead");
            config.port = 0;
            tandem::server::start_with_engine(config, engine).await
        }
    }
}

/// Native file drops on the window: the folder is chosen in the engine (the person put it there, so a
/// conversion may read it), then handed to the UI.
fn deliver_drops(window: &WebviewWindow, engine: Engine) {
    let target = window.clone();
    window.on_window_event(move |event| {
        if let WindowEvent::DragDrop(tauri::DragDropEvent::Drop { paths, .. }) = event {
            if let Some(folder) = folder_drop::folder_of(paths) {
                tracing::info!(folder = %folder.display(), "folder dropped on the window");
                if let Err(error) = engine.choose_folder(&folder) {
                    tracing::warn!("the dropped folder cannot be used: {}", error.message());
                }
                if let Err(error) = target.eval(folder_drop::script(&folder)) {
                    tracing::warn!("cannot hand the dropped folder to the UI: {error}");
                }
            }
        }
    });
}

/// `url` is on the server's origin (`http://127.0.0.1:PORT`).
fn same_origin(url: &tauri::Url, origin: &str) -> bool {
    tauri::Url::parse(origin).is_ok_and(|o| o.origin() == url.origin())
}

pub fn show_main_window(app: &tauri::AppHandle) {
    if let Some(window) = app.get_webview_window(MAIN_WINDOW) {
        let _ = window.unminimize();
        let _ = window.show();
        if let Err(error) = window.set_focus() {
            tracing::warn!("cannot focus the window: {error}");
        }
    }
}

/// A window with the reason the engine could not start (the shell's own page, `shell/index.html`).
fn show_startup_error(app: &tauri::AppHandle, message: &str) -> tauri::Result<()> {
    if let Some(window) = app.get_webview_window(MAIN_WINDOW) {
        window.destroy()?;
    }
    WebviewWindowBuilder::new(app, MAIN_WINDOW, WebviewUrl::App("index.html".into()))
        .title("Tandem")
        .inner_size(720.0, 420.0)
        .initialization_script(format!(
            "window.__TANDEM_STARTUP_ERROR__ = {};",
            serde_json::to_string(message).unwrap_or_else(|_| "\"\"".into())
        ))
        .on_page_load(|_, payload| {
            if matches!(payload.event(), tauri::webview::PageLoadEvent::Finished) {
                tracing::info!("window loaded {} (the startup error)", payload.url());
            }
        })
        .build()?;
    Ok(())
}

/// Stops the server (open streams end) and unloads the models.
fn stop(app: &tauri::AppHandle) {
    let Some(running) = app.try_state::<Running>() else {
        return;
    };
    let server = running.server.lock().unwrap_or_else(|p| p.into_inner()).take();
    if let Some(server) = server {
        if let Err(error) = tauri::async_runtime::block_on(server.shutdown()) {
            tracing::warn!("stopping the server: {error:#}");
        }
    }
    running.engine.shutdown();
    tracing::info!("Tandem stopped");
}

#[cfg(test)]
#[path = "../rpath.rs"]
mod rpath;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rpath;

    #[test]
    fn the_window_stays_on_the_servers_origin() {
        let origin = "http://127.0.0.1:11435";
        let url = |s: &str| tauri::Url::parse(s).unwrap();
        assert!(same_origin(&url("http://127.0.0.1:11435/#/models"), origin));
        assert!(same_origin(&url("http://127.0.0.1:11435/assets/index.js"), origin));
        assert!(!same_origin(&url("http://127.0.0.1:8080/"), origin));
        assert!(!same_origin(&url("https://example.com/"), origin));
        assert!(!same_origin(&url("file:///etc/passwd"), origin));
    }

    /// RFC 7396 merge, as Tauri merges tauri.<platform>.conf.json into tauri.conf.json.
    fn merge(base: &mut serde_json::Value, patch: serde_json::Value) {
        match (base, patch) {
            (serde_json::Value::Object(b), serde_json::Value::Object(p)) => {
                for (k, v) in p {
                    merge(b.entry(k).or_insert(serde_json::Value::Null), v);
                }
            }
            (b, p) => *b = p,
        }
    }

    /// tauri.conf.json with `tauri.<platform>.conf.json` merged in, as the Tauri CLI builds it, and
    /// checked to be a valid Tauri config.
    fn bundle_config(platform: &str) -> serde_json::Value {
        let read = |name: &str| -> serde_json::Value {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(name);
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
        };
        let mut config = read("tauri.conf.json");
        merge(&mut config, read(&format!("tauri.{platform}.conf.json")));
        let _: tauri::utils::config::Config = serde_json::from_value(config.clone()).expect("a valid Tauri config");
        config
    }

    fn text<'a>(value: &'a serde_json::Value, pointer: &str) -> &'a str {
        value.pointer(pointer).and_then(|v| v.as_str()).unwrap_or_else(|| panic!("{pointer} is not set"))
    }

    /// The macOS app (which cannot be built here): `libmlx.dylib` and `mlx.metallib` from the
    /// wheel, side by side (MLX looks for `mlx.metallib` beside the library that holds it first, then
    /// in `Resources/` below it: `current_binary_dir()` in its metal/device.cpp), in the folder the
    /// binary's `@executable_path` rpath names; the wheel's `libmlx.dylib` is `@rpath/libmlx.dylib`.
    #[test]
    fn the_macos_bundle_carries_mlx_where_the_rpath_points() {
        let config = bundle_config("macos");
        assert_eq!(text(&config, "/productName"), rpath::PRODUCT_NAME);
        assert_eq!(
            text(&config, "/bundle/macOS/minimumSystemVersion"),
            "14.0",
            "the mlx-metal wheel's libmlx is built for macOS 14"
        );
        let targets = config.pointer("/bundle/targets").unwrap().to_string();
        assert!(targets.contains("\"app\"") && targets.contains("\"dmg\""), "{targets}");
        // `bundle.macOS.files`: destinations relative to `Contents/`, sources relative to src-tauri.
        let files = config.pointer("/bundle/macOS/files").and_then(|f| f.as_object()).expect("bundle.macOS.files");
        let find = |name: &str| {
            let (to, from) = files
                .iter()
                .find(|(to, _)| to.ends_with(&format!("/{name}")))
                .unwrap_or_else(|| panic!("{name} is not in the bundle ({files:?})"));
            assert_eq!(from.as_str(), Some(format!("../.mlx/wheel/mlx/lib/{name}").as_str()), "{name} from the wheel");
            std::path::PathBuf::from(to)
        };
        let dylib = find("libmlx.dylib");
        let metallib = find("mlx.metallib");
        assert_eq!(dylib.parent(), metallib.parent(), "MLX looks for mlx.metallib beside libmlx.dylib");
        let folder = dylib.parent().unwrap().to_str().unwrap();
        // The binary is Contents/MacOS/Tandem, so `@executable_path/..` is Contents.
        let rpaths = rpath::app("macos");
        assert!(
            rpaths.contains(&format!("@executable_path/../{folder}")),
            "the binary's rpath {rpaths:?} does not name Contents/{folder}"
        );
        assert!(rpaths.iter().chain(&rpath::tests("macos")).all(|p| p.starts_with('@')), "{rpaths:?}");
        assert_eq!(text(&config, "/bundle/macOS/infoPlist"), "Info.plist");
        let plist = include_str!("../Info.plist");
        assert!(plist.contains("<key>NSAllowsLocalNetworking</key>"), "the window may load http://127.0.0.1");
        let resources = config.pointer("/bundle/resources").unwrap().to_string();
        assert!(resources.contains("ui/dist") && resources.contains("models/tandem-tiny"), "{resources}");
    }

    /// The Linux packages: libmlx.so in `usr/lib/Tandem/mlx/lib/`, where the binary's `$ORIGIN` rpath
    /// reaches from `usr/bin/`, and each of the wheel's `*.libs` folders where libmlx's own rpath
    /// (`$ORIGIN/../../<name>.libs`) reaches; with the UI and the bundled model, in the .deb and the
    /// AppImage alike. They are the bundler's `files`, never `bundle.resources`: tauri-build copies
    /// resources into the build tree at every build, and there `mlx/` and `*.libs` are links to the
    /// unpacked wheel, which the copy would truncate. tests/desktop/package.sh runs the .deb itself.
    #[test]
    fn the_linux_packages_carry_mlx_where_the_rpath_points() {
        let config = bundle_config("linux");
        let targets = config.pointer("/bundle/targets").unwrap().to_string();
        assert!(targets.contains("\"deb\"") && targets.contains("\"appimage\""), "{targets}");
        let resources = config.pointer("/bundle/resources").map(|r| r.to_string()).unwrap_or_default();
        assert!(!resources.contains(".mlx"), "MLX among the resources, copied into the build tree: {resources}");
        let product = text(&config, "/productName");
        let lib = format!("/usr/lib/{product}");
        // The binary is usr/bin/Tandem.
        let rpaths = rpath::app("linux");
        assert!(rpaths.contains(&format!("$ORIGIN/../lib/{product}/mlx/lib")), "{rpaths:?}");
        assert!(rpath::app("linux").iter().chain(&rpath::tests("linux")).all(|p| p.starts_with("$ORIGIN")));
        let mut wanted = vec![
            (format!("{lib}/mlx/lib/libmlx.so"), "../.mlx/wheel/mlx/lib/libmlx.so".to_string()),
            (format!("{lib}/ui/dist"), "../ui/dist".into()),
            (format!("{lib}/models/tandem-tiny"), "../assets/models/tandem-tiny".into()),
        ];
        let wheel = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../.mlx/wheel");
        for entry in std::fs::read_dir(&wheel).expect("the MLX wheel (make setup)").flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.ends_with(".libs") {
                wanted.push((format!("{lib}/{name}"), format!("../.mlx/wheel/{name}")));
            }
        }
        assert!(wanted.len() > 3, "the mlx-cpu wheel has a *.libs folder (BLAS, LAPACK)");
        for bundle in ["deb", "appimage"] {
            let files = config
                .pointer(&format!("/bundle/linux/{bundle}/files"))
                .and_then(|f| f.as_object())
                .unwrap_or_else(|| panic!("bundle.linux.{bundle}.files"));
            for (to, from) in &wanted {
                assert_eq!(files.get(to).and_then(|v| v.as_str()), Some(from.as_str()), "{bundle}: {to}");
            }
        }
    }
}
