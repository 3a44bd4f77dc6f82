//! Who may talk to the server: the Host header (against DNS rebinding), the Origin header (only the
//! app's own pages may call from a browser), the API key, and which folders requests may name.

use std::net::{IpAddr, SocketAddr};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use super::AppState;

/// The rules, fixed when the server binds.
#[derive(Debug, Clone)]
pub struct Policy {
    pub bound: SocketAddr,
    pub api_key: Option<String>,
    /// Host names accepted besides loopback names and the bound address.
    pub extra_hosts: Vec<String>,
    /// Origins (`scheme://host[:port]`) allowed to call from a browser.
    pub origins: Vec<String>,
}

impl Policy {
    pub fn new(
        bound: SocketAddr,
        api_key: Option<String>,
        extra_hosts: Vec<String>,
        extra_origins: Vec<String>,
    ) -> Policy {
        let port = bound.port();
        let mut origins: Vec<String> = vec![
            "tauri://localhost".into(),
            "http://tauri.localhost".into(),
            "https://tauri.localhost".into(),
            format!("http://127.0.0.1:{port}"),
            format!("http://localhost:{port}"),
            format!("http://[::1]:{port}"),
        ];
        let own = match bound.ip() {
            IpAddr::V4(ip) => format!("http://{ip}:{port}"),
            IpAddr::V6(ip) => format!("http://[{ip}]:{port}"),
        };
        origins.push(own);
        origins.extend(extra_origins.into_iter().map(|o| o.trim_end_matches('/').to_ascii_lowercase()));
        origins.dedup();
        let extra_hosts = extra_hosts.into_iter().map(|h| h.to_ascii_lowercase()).collect();
        Policy { bound, api_key, extra_hosts, origins }
    }

    pub fn loopback_only(&self) -> bool {
        self.bound.ip().is_loopback()
    }

    /// The Host header names this server: a loopback name or address, the bound address, a
    /// configured name, or (when bound beyond loopback, where an API key is required) any IP literal.
    pub fn host_allowed(&self, host: &str) -> bool {
        let name = host_name(host).to_ascii_lowercase();
        if name == "localhost" || name.ends_with(".localhost") || self.extra_hosts.iter().any(|h| h == &name) {
            return true;
        }
        match name.parse::<IpAddr>() {
            Ok(ip) => ip.is_loopback() || ip == self.bound.ip() || !self.loopback_only(),
            Err(_) => false,
        }
    }

    /// A listed origin, or this server's own pages under any name the Host check accepts
    /// (e.g. `http://192.168.1.5:11435` when bound beyond loopback).
    pub fn origin_allowed(&self, origin: &str) -> bool {
        let origin = origin.trim_end_matches('/').to_ascii_lowercase();
        if self.origins.contains(&origin) {
            return true;
        }
        let Some(authority) = origin.strip_prefix("http://") else {
            return false;
        };
        let port = authority.rsplit_once(':').map(|(_, p)| p).filter(|p| !p.contains(']'));
        port.and_then(|p| p.parse::<u16>().ok()) == Some(self.bound.port()) && self.host_allowed(authority)
    }

    fn key_ok(&self, headers: &HeaderMap) -> bool {
        let Some(key) = &self.api_key else {
            return true;
        };
        // `Authorization: Bearer <key>`, or `x-api-key: <key>` as Anthropic's clients send it.
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
            .or_else(|| headers.get("x-api-key").and_then(|v| v.to_str().ok()))
            .map(str::trim);
        given.is_some_and(|given| constant_time_eq(given.as_bytes(), key.as_bytes()))
    }
}

pub use crate::registry::api_key_problem;

/// `example.com:80` -> `example.com`, `[::1]:8080` -> `::1`.
fn host_name(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.chars().all(|c| c.is_ascii_digit()) => name,
        _ => host,
    }
}

pub(super) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = a.len() ^ b.len();
    for (i, &x) in a.iter().enumerate() {
        diff |= usize::from(x ^ b.get(i % b.len().max(1)).copied().unwrap_or(0));
    }
    diff == 0
}

/// Checks Host, Origin and the API key before any route runs.
pub async fn guard(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let policy = &state.policy;
    let headers = req.headers();
    let host =
        headers.get(header::HOST).and_then(|v| v.to_str().ok()).or_else(|| req.uri().authority().map(|a| a.as_str()));
    match host {
        None => return ApiError::bad_request("missing_host", "the request has no Host header").into_response(),
        Some(host) if !policy.host_allowed(host) => {
            return ApiError::forbidden(
                "forbidden_host",
                format!("Host `{host}` is not this server; use http://127.0.0.1:{}", policy.bound.port()),
            )
            .into_response()
        }
        Some(_) => {}
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("");
        if !policy.origin_allowed(origin) {
            return ApiError::forbidden(
                "forbidden_origin",
                format!("requests from the web page at `{origin}` are not allowed"),
            )
            .into_response();
        }
    }
    let path = req.uri().path();
    let protected = (path.starts_with("/v1/") || path.starts_with("/api/")) && path != "/api/health";
    if protected && !policy.key_ok(headers) {
        let mut response = ApiError::new(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "invalid_api_key",
            "this server requires an API key: send `Authorization: Bearer <key>`",
        )
        .into_response();
        response.headers_mut().insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
        return response;
    }
    next.run(req).await
}

/// Folders that requests may name: the models folder and the folders of the registry's models.
#[derive(Debug, Clone)]
pub struct PathRules {
    pub models_dir: PathBuf,
    pub model_paths: Vec<PathBuf>,
    /// Folders the person chose in this run ([`crate::engine::Engine::choose_folder`]): read, never written.
    pub chosen: Vec<PathBuf>,
}

impl PathRules {
    /// An existing file or folder inside an allowed folder, resolved (symlinks followed).
    pub fn existing(&self, what: &str, path: &str) -> Result<PathBuf, ApiError> {
        let given = expand(path);
        let real =
            given.canonicalize().map_err(|e| ApiError::bad_request("invalid_path", format!("{what} `{path}`: {e}")))?;
        if self.roots().iter().any(|root| real.starts_with(root)) {
            Ok(real)
        } else {
            Err(self.not_chosen(what, path))
        }
    }

    /// A path to create inside the models folder: it must not exist yet, its parent must, and it
    /// must not climb out with `..`.
    pub fn new_in_models_dir(&self, what: &str, path: &str) -> Result<PathBuf, ApiError> {
        let given = expand(path);
        let given = if given.is_relative() { self.models_dir.join(given) } else { given };
        if given.components().any(|c| matches!(c, Component::ParentDir)) {
            return Err(self.refuse(what, path));
        }
        let (Some(parent), Some(name)) = (given.parent(), given.file_name()) else {
            return Err(self.refuse(what, path));
        };
        let parent = parent
            .canonicalize()
            .map_err(|e| ApiError::bad_request("invalid_path", format!("{what} `{path}`: its folder: {e}")))?;
        let models_dir = self.models_dir.canonicalize().unwrap_or_else(|_| self.models_dir.clone());
        if !parent.starts_with(&models_dir) {
            return Err(self.refuse(what, path));
        }
        Ok(parent.join(name))
    }

    fn roots(&self) -> Vec<PathBuf> {
        std::iter::once(&self.models_dir)
            .chain(&self.model_paths)
            .chain(&self.chosen)
            .filter_map(|p| p.canonicalize().ok())
            .collect()
    }

    /// A folder to read that nobody chose: the UI offers to confirm it (`folder_not_chosen`).
    fn not_chosen(&self, what: &str, path: &str) -> ApiError {
        ApiError::forbidden(
            "folder_not_chosen",
            format!(
                "{what} `{path}` is outside the models folder ({}), the registry's models and the folders chosen in \
                 this run; choose it in the app (Browse… or drop it on the window), confirm it with POST /api/folders, \
                 or add it to models.toml",
                self.models_dir.display()
            ),
        )
    }

    fn refuse(&self, what: &str, path: &str) -> ApiError {
        ApiError::forbidden(
            "path_forbidden",
            format!(
                "{what} `{path}` is outside the models folder ({}) and the registry's models; move it there or add it to models.toml",
                self.models_dir.display()
            ),
        )
    }
}

/// Folders whose images `file:` URLs may name: the folder of models.toml, the models folder, the
/// registry's model folders, and the configured image folders (`ServeConfig::image_dirs`).
pub fn image_roots(registry: &crate::registry::Registry, image_dirs: &[PathBuf]) -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = registry.path().parent().map(Path::to_path_buf).into_iter().collect();
    roots.push(registry.models_dir().to_path_buf());
    roots.extend(registry.list().into_iter().map(|m| m.path));
    roots.extend(image_dirs.iter().cloned());
    // `models.toml` given without a folder lives in the current one.
    roots
        .into_iter()
        .map(|r| if r.as_os_str().is_empty() { PathBuf::from(".") } else { r })
        .filter_map(|r| r.canonicalize().ok())
        .collect()
}

/// The file of a `file:` URL, resolved (symlinks followed), when it lies inside one of `roots`
/// (already canonical); else refused with 403.
pub fn image_file(path: &Path, roots: &[PathBuf]) -> Result<PathBuf, ApiError> {
    let inside = |real: &Path| roots.iter().any(|root| real.starts_with(root));
    match path.canonicalize() {
        Ok(real) if inside(&real) => Ok(real),
        // A missing file is reported only inside the allowed folders: elsewhere, whether a file
        // exists is none of the client's business.
        Err(e) if path.parent().and_then(|p| p.canonicalize().ok()).is_some_and(|p| inside(&p)) => {
            Err(ApiError::bad_request("invalid_image", format!("{}: {e}", path.display())))
        }
        _ => Err(ApiError::forbidden(
            "path_forbidden",
            format!(
                "{} is outside the folders whose images this server reads (the folder of models.toml, the models folder, \
                 the models' folders and TANDEM_IMAGE_DIRS); send the image as a data URL or add its folder to TANDEM_IMAGE_DIRS",
                path.display()
            ),
        )),
    }
}

pub(super) fn expand(path: &str) -> PathBuf {
    match (path.strip_prefix("~/"), std::env::var_os("HOME")) {
        (Some(rest), Some(home)) => Path::new(&home).join(rest),
        _ => PathBuf::from(path),
    }
}

#[cfg(test)]
mod tests;
