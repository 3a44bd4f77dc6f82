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

#[cfg(test)]
mod tests {
    use super::connection_cap;

    #[test]
    fn the_cap_leaves_descriptors_for_the_rest() {
        assert_eq!(connection_cap(4096, 65_536), 4096);
        assert_eq!(connection_cap(4096, 1024), 768);
        assert_eq!(connection_cap(4096, 100), 8);
        assert_eq!(connection_cap(0, 65_536), 1);
    }
}
