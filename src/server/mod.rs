//! `tandem serve`: the OpenAI-compatible API, the admin API, server-sent events and the web UI's
//! static files, over the [`Engine`].
//!
//! Security: binds 127.0.0.1 by default; an API key is required to bind anywhere else; the Host
//! header must name this server (DNS rebinding); browsers may call only from the app's own origins;
//! bodies are limited in size; paths in requests stay inside the models folder; conversation ids
//! are file names, never paths.

mod admin;
mod anthropic;
mod completions;
mod conversations;
mod convert;
mod downloads;
pub mod error;
mod folders;
mod listen;
mod ollama;
mod openai;
mod request;
mod request_log;
mod security;
mod settings;
mod ui;
pub mod wire;

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use axum::extract::DefaultBodyLimit;
use axum::http::{header, HeaderValue, Method};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use tokio::sync::watch;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::cors::{AllowOrigin, CorsLayer};
use tower_http::timeout::RequestBodyTimeoutLayer;

use crate::engine::{Engine, EngineConfig};
use crate::registry::Registry;
use error::ApiError;
pub use folders::{FolderPicker, SHELL_TOKEN_HEADER};
pub use security::api_key_problem;

pub const DEFAULT_PORT: u16 = crate::registry::app::DEFAULT_PORT;
/// Request bodies up to this size (images travel inside them as data URLs).
pub const DEFAULT_MAX_BODY: usize = 32 << 20;
/// Connections open at once. The server raises its descriptor limit to the hard limit at start and
/// lowers this cap to what that limit leaves after a reserve for models and files (listen.rs).
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;
/// How long a connection may take to send a request head, and stay idle between requests.
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest pause within a request body.
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(30);

/// How to serve.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// An IP address, or `localhost`.
    pub host: String,
    /// 0 picks a free port.
    pub port: u16,
    /// models.toml.
    pub registry: PathBuf,
    /// Required as `Authorization: Bearer <key>` on /v1 and /api (except /api/health) when set;
    /// must be set to bind beyond loopback. `ServeConfig::new` reads `TANDEM_API_KEY`. A key no
    /// client could send (blank, see [`api_key_problem`]) is refused when the server starts.
    pub api_key: Option<String>,
    /// The built web UI (`ui/dist`).
    pub ui_dir: PathBuf,
    pub max_body_bytes: usize,
    /// Connections served at once; more wait in the kernel's backlog until one closes.
    pub max_connections: usize,
    /// The time a connection has to send a complete request head, from when it opens and again
    /// after each response (so also the keep-alive idle timeout); then it is closed. It does not
    /// run while a response (an event stream) is being written.
    pub header_timeout: Duration,
    /// The longest pause between two parts of a request body; then the request fails.
    pub body_timeout: Duration,
    /// Browser origins allowed besides the Tauri app's and the server's own (e.g. a UI dev server).
    pub extra_origins: Vec<String>,
    /// Host names accepted besides loopback names and the bound address.
    pub extra_hosts: Vec<String>,
    /// Folders whose images `file:` URLs may name (a server on loopback only), besides Tandem's
    /// own: the folder of models.toml, the models folder and the registry's model folders.
    /// `ServeConfig::new` reads `TANDEM_IMAGE_DIRS` (a path list, like `PATH`).
    pub image_dirs: Vec<PathBuf>,
    pub engine: EngineConfig,
    /// Test hook: a pause after each tensor a conversion job writes (with the MLX lock let go), to
    /// make a conversion slow enough to overlap a chat. None outside tests.
    #[doc(hidden)]
    pub convert_pause: Option<Duration>,
    /// The desktop app's native folder dialog (`POST /api/folders/pick`); None for `tandem serve`.
    pub folder_picker: Option<FolderPicker>,
}

impl ServeConfig {
    /// Listens as models.toml's `[server]` says: its port, loopback or every interface, and its API
    /// key unless one is set already (`TANDEM_API_KEY`). Flags given after this override it.
    pub fn listen_as(&mut self, server: &crate::registry::ServerSettings) {
        self.host = server.host().to_owned();
        self.port = server.port();
        if self.api_key.is_none() {
            self.api_key.clone_from(&server.api_key);
        }
    }

    pub fn new(registry: impl Into<PathBuf>) -> Self {
        ServeConfig {
            host: "127.0.0.1".into(),
            port: DEFAULT_PORT,
            registry: registry.into(),
            // Kept even when blank, so that starting refuses it rather than serving without a key.
            api_key: std::env::var("TANDEM_API_KEY").ok(),
            ui_dir: default_ui_dir(),
            max_body_bytes: DEFAULT_MAX_BODY,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            body_timeout: DEFAULT_BODY_TIMEOUT,
            extra_origins: Vec::new(),
            extra_hosts: Vec::new(),
            image_dirs: std::env::var_os("TANDEM_IMAGE_DIRS")
                .map(|dirs| std::env::split_paths(&dirs).filter(|d| !d.as_os_str().is_empty()).collect())
                .unwrap_or_default(),
            engine: EngineConfig::default(),
            convert_pause: None,
            folder_picker: None,
        }
    }
}

/// `TANDEM_UI_DIR`, else `ui/dist` in the current folder, else the source tree's (development builds).
fn default_ui_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("TANDEM_UI_DIR") {
        return PathBuf::from(dir);
    }
    let here = PathBuf::from("ui/dist");
    if here.is_dir() {
        return here;
    }
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/ui/dist"))
}

/// Runs blocking engine work (disk reads, loading, file writes) off the async threads.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T, ApiError> + Send + 'static) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| ApiError::internal(format!("a background task failed: {e}")))?
}

/// `http://ADDR`, with loopback for an address bound to every interface.
pub(crate) fn local_url(addr: SocketAddr) -> String {
    match addr.ip() {
        ip if ip.is_unspecified() && ip.is_ipv4() => format!("http://127.0.0.1:{}", addr.port()),
        ip if ip.is_unspecified() => format!("http://[::1]:{}", addr.port()),
        _ => format!("http://{addr}"),
    }
}

/// What every handler shares.
pub(crate) struct AppState {
    engine: Engine,
    policy: security::Policy,
    ui_dir: PathBuf,
    max_body_bytes: usize,
    /// See [`ServeConfig::image_dirs`].
    image_dirs: Vec<PathBuf>,
    /// See [`ServeConfig::convert_pause`].
    convert_pause: Option<Duration>,
    folder_picker: Option<FolderPicker>,
    started: Instant,
    started_unix: u64,
    shutdown: watch::Receiver<bool>,
    /// models.toml's `[server]` when the server started (a change applies at the next start).
    started_with: crate::registry::ServerSettings,
    requests: request_log::Requests,
}

impl AppState {
    /// Resolves when the server starts shutting down; long streams end on it.
    fn shutdown_signal(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.shutdown.clone();
        async move {
            let _ = rx.wait_for(|stop| *stop).await;
        }
    }
}

/// A job's events as server-sent events (conversions, downloads): `past` replayed, then `live` ones unless
/// the job had ended, closing right after the event `is_terminal` marks, or when the server stops.
fn job_events<E>(
    state: &AppState,
    past: Vec<E>,
    live: Option<tokio::sync::broadcast::Receiver<E>>,
    is_terminal: fn(&E) -> bool,
) -> axum::response::sse::Sse<impl futures::Stream<Item = Result<axum::response::sse::Event, std::convert::Infallible>>>
where
    E: serde::Serialize + Clone + Send + 'static,
{
    use futures::StreamExt;
    let replay = futures::stream::iter(past);
    let live: futures::stream::BoxStream<'static, E> = match live {
        Some(rx) => tokio_stream::wrappers::BroadcastStream::new(rx).filter_map(|r| async move { r.ok() }).boxed(),
        None => futures::stream::empty().boxed(),
    };
    // Ends right after the terminal event, without waiting for another.
    let events = futures::stream::unfold((replay.chain(live).boxed(), false), move |(mut events, ended)| async move {
        if ended {
            return None;
        }
        let event = events.next().await?;
        let terminal = is_terminal(&event);
        Some((event, (events, terminal)))
    });
    let stream = events
        .map(|event| {
            let data = serde_json::to_string(&event).unwrap_or_else(|_| "{}".into());
            Ok(axum::response::sse::Event::default().data(data))
        })
        .take_until(state.shutdown_signal());
    axum::response::sse::Sse::new(stream).keep_alive(axum::response::sse::KeepAlive::default())
}

/// A server running on a tokio runtime.
pub struct RunningServer {
    addr: SocketAddr,
    engine: Engine,
    shutdown: watch::Sender<bool>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl RunningServer {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`
    /// Where this machine reaches it (loopback when bound to every interface).
    pub fn url(&self) -> String {
        local_url(self.addr)
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// A handle that stops the server from elsewhere (e.g. a signal handler).
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle(self.shutdown.clone())
    }

    /// Stops accepting, ends open streams, and waits (at most 5 s) for responses in flight.
    /// Models stay loaded: the engine belongs to the caller.
    pub async fn shutdown(self) -> anyhow::Result<()> {
        let _ = self.shutdown.send(true);
        self.wait().await
    }

    /// Waits until the server stops (after a shutdown, or on an error).
    pub async fn wait(mut self) -> anyhow::Result<()> {
        let mut stop = self.shutdown.subscribe();
        tokio::select! {
            result = &mut self.task => return result.context("the server task failed")?.context("the server failed"),
            _ = stop.wait_for(|s| *s) => {}
        }
        match tokio::time::timeout(Duration::from_secs(5), &mut self.task).await {
            Ok(result) => result.context("the server task failed")?.context("the server failed"),
            Err(_) => {
                tracing::warn!("responses still open 5 s after shutdown; closing them");
                self.task.abort();
                Ok(())
            }
        }
    }
}

/// Stops a [`RunningServer`].
#[derive(Clone)]
pub struct ShutdownHandle(watch::Sender<bool>);

impl ShutdownHandle {
    pub fn shutdown(&self) {
        let _ = self.0.send(true);
    }
}

/// Serves until Ctrl-C or SIGTERM, on a runtime of its own, then unloads the models.
pub fn serve(config: ServeConfig) -> anyhow::Result<()> {
    let runtime =
        tokio::runtime::Builder::new_multi_thread().enable_all().build().context("cannot start the async runtime")?;
    runtime.block_on(async move {
        let server = start(config).await?;
        let engine = server.engine().clone();
        let handle = server.shutdown_handle();
        tracing::info!("Tandem is serving on {} (UI and API)", server.url());
        eprintln!("Tandem is serving on {}  (Ctrl-C stops it)", server.url());
        tokio::spawn(async move {
            stop_signal().await;
            eprintln!("stopping...");
            handle.shutdown();
        });
        let result = server.wait().await;
        let _ = tokio::task::spawn_blocking(move || engine.shutdown()).await;
        result
    })
}

async fn stop_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    {
        let term = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut s) => {
                    s.recv().await;
                }
                Err(_) => std::future::pending::<()>().await,
            }
        };
        tokio::select! { _ = ctrl_c => {}, _ = term => {} }
    }
    #[cfg(not(unix))]
    ctrl_c.await;
}

/// Loads models.toml, makes an engine and starts serving; returns once listening.
pub async fn start(config: ServeConfig) -> anyhow::Result<RunningServer> {
    // The registry's errors name the file (and line) themselves.
    let registry = Registry::load(&config.registry).context("cannot load the models registry")?;
    registry.check_model_paths().context("a model in the registry cannot be served")?;
    let engine = Engine::new(registry, config.engine.clone());
    start_with_engine(config, engine).await
}

/// Starts serving an existing engine (the desktop shell shares its engine with the tray).
pub async fn start_with_engine(config: ServeConfig, engine: Engine) -> anyhow::Result<RunningServer> {
    let ip: IpAddr = if config.host.eq_ignore_ascii_case("localhost") {
        IpAddr::from([127, 0, 0, 1])
    } else {
        config.host.parse().with_context(|| format!("--host `{}` is not an IP address", config.host))?
    };
    if let Some(why) = config.api_key.as_deref().and_then(api_key_problem) {
        bail!(
            "the API key (--api-key or TANDEM_API_KEY) {why}, so no client could send it; give a key of \
             visible characters, or unset it to serve on loopback only"
        );
    }
    if !ip.is_loopback() && config.api_key.is_none() {
        bail!(
            "refusing to listen on {ip}: beyond this machine the API needs a key; set TANDEM_API_KEY \
             (clients then send `Authorization: Bearer <key>`) or bind to 127.0.0.1"
        );
    }
    let listener = match tokio::net::TcpListener::bind((ip, config.port)).await {
        Ok(l) => l,
        Err(e) => return Err(bind_error(ip, config.port, e).await),
    };
    let addr = listener.local_addr().context("cannot read the bound address")?;
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let policy =
        security::Policy::new(addr, config.api_key.clone(), config.extra_hosts.clone(), config.extra_origins.clone());
    let state = Arc::new(AppState {
        engine: engine.clone(),
        policy,
        ui_dir: config.ui_dir.clone(),
        max_body_bytes: config.max_body_bytes,
        image_dirs: config.image_dirs.clone(),
        convert_pause: config.convert_pause,
        folder_picker: config.folder_picker.clone(),
        started: Instant::now(),
        started_unix: crate::engine::live::unix_ms() / 1000,
        shutdown: shutdown_rx,
        started_with: engine.registry().server().clone(),
        requests: request_log::Requests::default(),
    });
    let app = router(state.clone()).layer(RequestBodyTimeoutLayer::new(config.body_timeout));
    let limits = listen::Limits { max_connections: config.max_connections, header_timeout: config.header_timeout };
    let task = tokio::spawn(listen::serve(listener, app, limits, state.shutdown.clone()));
    Ok(RunningServer { addr, engine, shutdown: shutdown_tx, task })
}

/// Why `ip:port` cannot be listened on, saying who holds a busy port: another Tandem by its URL
/// (and pid), else the port, the OS's error and the program holding it where the OS tells.
async fn bind_error(ip: IpAddr, port: u16, e: std::io::Error) -> anyhow::Error {
    use std::io::ErrorKind;
    if !matches!(e.kind(), ErrorKind::AddrInUse | ErrorKind::PermissionDenied) {
        return anyhow::anyhow!("cannot listen on {ip}:{port}: {e}");
    }
    let holder = match e.kind() {
        ErrorKind::AddrInUse => tokio::task::spawn_blocking(move || listen::port_holder(ip, port)).await.ok(),
        _ => None,
    };
    let holder = holder.unwrap_or_default();
    let pid = holder.process.as_ref().map(|(_, pid)| format!(" (pid {pid})")).unwrap_or_default();
    match (holder.tandem, holder.process) {
        (Some(addr), _) => anyhow::anyhow!(
            "Tandem is already serving on http://{addr}{pid}: use that one, or choose another port with --port"
        ),
        (None, Some((name, _))) => {
            anyhow::anyhow!("cannot listen on {ip}:{port}: {e}, held by {name}{pid}; choose another port with --port")
        }
        (None, None) => anyhow::anyhow!("cannot listen on {ip}:{port}: {e}; choose another port with --port"),
    }
}

fn router(state: Arc<AppState>) -> Router {
    let origins: Vec<HeaderValue> = state.policy.origins.iter().filter_map(|o| HeaderValue::from_str(o).ok()).collect();
    let cors = CorsLayer::new()
        .allow_origin(AllowOrigin::list(origins))
        .allow_methods([Method::GET, Method::POST, Method::PUT, Method::PATCH, Method::DELETE, Method::OPTIONS])
        .allow_headers([header::CONTENT_TYPE, header::AUTHORIZATION, header::ACCEPT])
        .max_age(Duration::from_secs(600));
    Router::new()
        .route("/v1/models", get(openai::list_models))
        .route("/v1/models/{*id}", get(openai::get_model))
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/v1/completions", post(completions::completions))
        .route("/v1/messages", post(anthropic::messages))
        .route("/api/health", get(admin::health))
        .route("/api/chat", post(ollama::chat))
        .route("/api/generate", post(ollama::generate))
        .route("/api/tags", get(ollama::tags))
        .route("/api/show", post(ollama::show))
        .route("/api/ps", get(ollama::ps))
        .route("/api/version", get(ollama::version))
        .route("/api/models", get(admin::models).post(folders::add_model))
        .route("/api/folders", get(folders::list).post(folders::choose))
        .route("/api/folders/pick", post(folders::pick))
        .route("/api/pull", post(downloads::start).get(downloads::list))
        .route("/api/pull/{job}", get(downloads::get).delete(downloads::delete))
        .route("/api/pull/{job}/events", get(downloads::events))
        .route("/api/catalog", get(downloads::catalog))
        .route("/api/hub/search", get(downloads::search))
        .route("/api/hub/preview", get(downloads::preview))
        .route("/api/models/{id}", get(admin::model))
        .route("/api/models/{id}/load", post(admin::load))
        .route("/api/models/{id}/unload", post(admin::unload))
        .route("/api/models/{id}/settings", axum::routing::patch(admin::settings))
        .route("/api/models/{id}/graft", post(downloads::graft))
        .route("/api/settings", get(settings::get).patch(settings::patch))
        .route("/api/server", get(settings::server))
        .route("/api/server/requests", get(settings::requests))
        .route("/api/stats", get(admin::stats))
        .route("/api/stats/stream", get(admin::stats_stream))
        .route("/api/convert", post(convert::start).get(convert::list))
        .route("/api/convert/{job}", get(convert::get).delete(convert::delete))
        .route("/api/convert/{job}/events", get(convert::events))
        .route("/api/conversations", get(conversations::list))
        .route("/api/conversations/{id}", get(conversations::get).put(conversations::put).delete(conversations::delete))
        .fallback(ui::fallback)
        .method_not_allowed_fallback(ui::method_not_allowed)
        .layer(DefaultBodyLimit::max(state.max_body_bytes))
        .layer(axum::middleware::from_fn_with_state(state.clone(), security::guard))
        // Outside the guard: refused requests are logged too.
        .layer(axum::middleware::from_fn_with_state(state.clone(), request_log::record))
        .layer(cors)
        .layer(CatchPanicLayer::custom(panic_response))
        .with_state(state)
}

fn panic_response(panic: Box<dyn std::any::Any + Send + 'static>) -> Response {
    let message = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into());
    tracing::error!("a request handler panicked: {message}");
    ApiError::internal(format!("the server hit a bug while handling this request: {message}")).into_response()
}
