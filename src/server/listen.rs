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
    let max = limits.max_connections.clamp(1, 1 << 20);
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
