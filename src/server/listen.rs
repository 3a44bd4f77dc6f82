//! The accept loop: each connection served over HTTP/1.1 by hyper, with a deadline for the request
//! head and a cap on the connections open at once, so that idle or half-open sockets can neither
//! pile up until the process runs out of file descriptors nor hold the server forever.
//!
//! The head deadline runs from the moment a connection can send a request (when it opens, and
//! again when the previous response has ended), so it is also the keep-alive idle timeout. It does
//! not run while a response is being written: a long event stream is never cut by it.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};

/// What bounds a connection.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub max_connections: usize,
    pub header_timeout: Duration,
}

/// Accepts and serves connections until `stop` turns true, then waits for the open ones to end
/// (each is asked to close once its response in flight is done).
pub(crate) async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    mut stop: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let max = connection_cap(limits.max_connections, raise_open_files_limit());
    tracing::debug!("serving at most {max} connections at once");
    let slots = Arc::new(Semaphore::new(max));
    loop {
        // At the cap, new connections wait in the kernel's backlog instead of costing descriptors.
        let slot = tokio::select! {
            _ = stopped(&mut stop) => break,
            slot = slots.clone().acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => break,
            },
        };
        let stream = tokio::select! {
            _ = stopped(&mut stop) => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of descriptors or a connection reset before it was accepted: try again
                    // shortly rather than spin or stop serving.
                    tracing::warn!("cannot accept a connection: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        tokio::spawn(connection(stream, app.clone(), limits.header_timeout, stop.clone(), slot));
    }
    drop(listener);
    // Every open connection holds a slot: having them all back means every connection has ended.
    let _ = slots.acquire_many(max as u32).await;
    Ok(())
}

/// Descriptors kept for everything but connections: model files, logs, the conversion jobs' files.
const RESERVED_DESCRIPTORS: usize = 256;

/// The connections served at once: as asked, within what the descriptor limit leaves after the
/// reserve (each connection costs one), and at least 8.
fn connection_cap(requested: usize, open_files: usize) -> usize {
    requested.clamp(1, 1 << 20).min(open_files.saturating_sub(RESERVED_DESCRIPTORS).max(8))
}

/// Raises this process's soft limit on open files to its hard limit (at most 65,536; the usual soft
/// default of 1,024 is what idle sockets exhausted), and returns the soft limit in force.
#[cfg(unix)]
fn raise_open_files_limit() -> usize {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit read and write the struct passed; nothing else is touched.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return 1024;
        }
        let want = lim.rlim_max.min(65_536);
        if want > lim.rlim_cur {
            let raised = libc::rlimit { rlim_cur: want, rlim_max: lim.rlim_max };
            // macOS refuses values above OPEN_MAX whatever the hard limit says: keep the old one then.
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                lim.rlim_cur = want;
            }
        }
    }
    lim.rlim_cur as usize
}

#[cfg(not(unix))]
fn raise_open_files_limit() -> usize {
    usize::MAX
}

async fn connection(
    stream: TcpStream,
    app: Router,
    header_timeout: Duration,
    mut stop: watch::Receiver<bool>,
    _slot: OwnedSemaphorePermit,
) {
    let _ = stream.set_nodelay(true);
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(header_timeout).keep_alive(true);
    let conn = http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app));
    let mut conn = std::pin::pin!(conn);
    let result = tokio::select! {
        result = conn.as_mut() => result,
        _ = stopped(&mut stop) => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    // Timeouts and clients that hang up are routine; nothing to report above debug.
    if let Err(e) = result {
        tracing::debug!("connection ended: {e}");
    }
}

/// Resolves once the server is stopping (the watch's guard is dropped inside, so that the caller
/// stays `Send` while it goes on awaiting).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Who holds a port this server could not bind.
#[derive(Debug, Default)]
pub(crate) struct PortHolder {
    /// The address probed, and whether what answers `GET /api/health` there is a Tandem.
    pub tandem: Option<std::net::SocketAddr>,
    /// The program with the socket open, and its pid (Linux, when it is this user's).
    pub process: Option<(String, u32)>,
}

/// Who holds `ip:port`, as far as can be told: a Tandem server (it answers /api/health as one), and
/// the program that has the socket open.
pub(crate) fn port_holder(ip: std::net::IpAddr, port: u16) -> PortHolder {
    use std::io::{Read, Write};
    let ip = match ip {
        std::net::IpAddr::V4(v4) if v4.is_unspecified() => std::net::IpAddr::from([127, 0, 0, 1]),
        std::net::IpAddr::V6(v6) if v6.is_unspecified() => std::net::Ipv6Addr::LOCALHOST.into(),
        ip => ip,
    };
    let addr = std::net::SocketAddr::new(ip, port);
    let mut holder = PortHolder { tandem: None, process: socket_owner(port) };
    if let Ok(mut s) = std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(500)) {
        let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
        let req = format!("GET /api/health HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        let mut reply = Vec::new();
        if s.write_all(req.as_bytes()).is_ok() {
            let _ = s.take(64 << 10).read_to_end(&mut reply);
        }
        let reply = String::from_utf8_lossy(&reply);
        if reply.contains("\"models_loaded\"") && reply.contains("\"backend\"") {
            holder.tandem = Some(addr);
        }
    }
    holder
}

/// The process with a listening TCP socket on `port` open, from /proc (Linux).
#[cfg(target_os = "linux")]
fn socket_owner(port: u16) -> Option<(String, u32)> {
    let mut inodes = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        for line in std::fs::read_to_string(table).unwrap_or_default().lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // local_address is HEX_IP:HEX_PORT; state 0A is LISTEN; the inode is the tenth field.
            let listens = f.get(3) == Some(&"0A");
            let on_port = f.get(1).and_then(|a| a.rsplit(':').next()).and_then(|p| u16::from_str_radix(p, 16).ok());
            if listens && on_port == Some(port) {
                inodes.extend(f.get(9).map(|i| format!("socket:[{i}]")));
            }
        }
    }
    if inodes.is_empty() {
        return None;
    }
    for proc_dir in std::fs::read_dir("/proc").ok()?.flatten() {
        // Only the numbered entries are processes (`self` and `thread-self` are links to one).
        if !proc_dir.file_name().to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(fds) = std::fs::read_dir(proc_dir.path().join("fd")) else { continue };
        for fd in fds.flatten() {
            let Ok(target) = std::fs::read_link(fd.path()) else { continue };
            if inodes.iter().any(|i| target.as_os_str() == i.as_str()) {
                let pid = proc_dir.file_name().to_string_lossy().parse().ok()?;
                let name = std::fs::read_to_string(proc_dir.path().join("comm")).unwrap_or_default();
                return Some((name.trim().to_string(), pid));
            }
        }
    }
    None
}

#[cfg(not(target_os = "linux"))]
fn socket_owner(_port: u16) -> Option<(String, u32)> {
    None
}

#[cfg(test)]
mod tests {
    use super::{connection_cap, port_holder};

    #[test]
    fn a_busy_port_names_its_holder() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let who = port_holder("127.0.0.1".parse().unwrap(), port);
        assert_eq!(who.tandem, None, "a bare socket is no Tandem");
        if cfg!(target_os = "linux") {
            let (_, pid) = who.process.expect("the holder is this test process");
            assert_eq!(pid, std::process::id());
        }
    }

    #[test]
    fn the_cap_leaves_descriptors_for_the_rest() {
        assert_eq!(connection_cap(4096, 65_536), 4096);
        assert_eq!(connection_cap(4096, 1024), 768);
        assert_eq!(connection_cap(4096, 100), 8);
        assert_eq!(connection_cap(0, 65_536), 1);
    }
}
