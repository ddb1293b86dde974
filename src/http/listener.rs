//! The accept loop: each connection served by hyper's HTTP/1 with the
//! limits `axum::serve` leaves out, and a graceful shutdown.
//!
//! `axum::serve` builds hyper without a timer, so hyper's header read
//! timeout (30 s by default) never fires, and it first waits for the bytes
//! that tell HTTP/1 from HTTP/2 without any timeout: a client that opens a
//! connection and sends nothing, or its headers one byte at a time (slow
//! loris), holds a socket and a task for ever. Here every connection gets:
//! - a header read timeout, which also closes keep-alive connections that
//!   stay idle that long;
//! - a cap on the size of the request line and headers (431 above it);
//! - TCP_NODELAY, so small responses do not wait for delayed ACKs.
//!
//! A connection that opens with a watch request is answered by
//! [`event_stream`](super::event_stream) instead of hyper (it explains why).
//! [`serve_tls`] is the same loop over TLS (the admission webhook), with a
//! handshake timeout.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;

use super::event_stream::{self, FirstRequest, Prefixed};

/// The largest request line plus headers a client may send (431 above).
/// Keys travel in the path (at most about 3 KiB percent-encoded with the
/// default key limit); the rest is room for tokens and proxies' headers.
pub const MAX_HEADER_BYTES: usize = 64 * 1024;

/// What each connection is held to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// How long a client may take to send a request's line and headers,
    /// counted from the first byte it could send (for a keep-alive
    /// connection: from the end of the previous response).
    pub header_read_timeout: Duration,
    /// See [`MAX_HEADER_BYTES`].
    pub max_header_bytes: usize,
    /// Open connections at most: at the limit the loop stops accepting
    /// (new clients wait in the kernel's listen backlog, then are refused
    /// by it) until a connection closes, rather than running out of file
    /// descriptors or memory.
    pub max_connections: usize,
}

/// Serves `router` on `listener` until `shutdown` resolves; then stops
/// accepting (new connections are refused), lets each connection finish
/// the request it is serving, closes it, and returns once all are closed.
/// Bound the wait from outside: an endless response (an SSE stream) keeps
/// its connection open until its body ends. Dropping the future (e.g.
/// aborting its task when a grace period ends) closes every connection
/// at once.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let builder = http1_builder(limits);
    accept_loop(listener, limits, shutdown, |stream, stopping, slot| {
        tokio::spawn(connection(
            stream,
            router.clone(),
            Arc::clone(&builder),
            limits,
            stopping,
            slot,
        ));
    })
    .await
}

/// [`serve`] over TLS, for the admission webhook: each connection must
/// complete its handshake within `handshake_timeout` (else it is closed),
/// then hyper serves it with the same limits. No event streams here.
pub async fn serve_tls(
    listener: TcpListener,
    router: Router,
    limits: ConnectionLimits,
    acceptor: TlsAcceptor,
    handshake_timeout: Duration,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let builder = http1_builder(limits);
    accept_loop(listener, limits, shutdown, |stream, stopping, slot| {
        tokio::spawn(tls_connection(
            stream,
            acceptor.clone(),
            handshake_timeout,
            router.clone(),
            Arc::clone(&builder),
            stopping,
            slot,
        ));
    })
    .await
}

/// hyper's HTTP/1 with a timer (without one its header read timeout never
/// fires) and the limits.
fn http1_builder(limits: ConnectionLimits) -> Arc<http1::Builder> {
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_header_size(limits.max_header_bytes);
    Arc::new(builder)
}

/// Accepts connections and hands each to `spawn` with a receiver of the
/// stop signal and the slot it holds until it closes; see [`serve`].
async fn accept_loop(
    listener: TcpListener,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()>,
    mut spawn: impl FnMut(TcpStream, watch::Receiver<bool>, OwnedSemaphorePermit),
) -> io::Result<()> {
    // Every connection task holds one of the `slots` until it closes, so
    // having them all back means every connection is closed. `stop`
    // changes once, after the last connection was accepted, so every
    // connection sees the change.
    let (stop, stopping) = watch::channel(false);
    let permits = u32::try_from(limits.max_connections.max(1)).unwrap_or(u32::MAX);
    let slots = Arc::new(Semaphore::new(permits as usize));
    let mut full_since: Option<Instant> = None;
    tokio::pin!(shutdown);
    loop {
        let slot = match Arc::clone(&slots).try_acquire_owned() {
            Ok(slot) => slot,
            Err(_) => {
                if full_since.is_none() {
                    tracing::warn!(
                        limit = limits.max_connections,
                        "connection limit reached; not accepting until one closes"
                    );
                    full_since = Some(Instant::now());
                }
                tokio::select! {
                    () = &mut shutdown => break,
                    slot = Arc::clone(&slots).acquire_owned() => match slot {
                        Ok(slot) => slot,
                        Err(_) => break,
                    },
                }
            }
        };
        if let Some(since) = full_since.take() {
            tracing::info!(after = ?since.elapsed(), "accepting connections again");
        }
        let stream = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(error) => {
                    accept_failed(error).await;
                    continue;
                }
            },
        };
        set_nodelay(&stream);
        spawn(stream, stopping.clone(), slot);
    }
    drop(listener);
    stop.send_replace(true);
    // Never closed, so this cannot fail.
    let _ = slots.acquire_many(permits).await;
    Ok(())
}

/// Serves one connection until it closes; its `_slot` is held until then.
async fn connection(
    mut stream: TcpStream,
    router: Router,
    builder: Arc<http1::Builder>,
    limits: ConnectionLimits,
    mut stopping: watch::Receiver<bool>,
    _slot: OwnedSemaphorePermit,
) {
    // The first request's head is read here at most once per connection;
    // a client that takes its time before the first byte gets hyper's full
    // header timeout from the first byte on (at most twice the timeout).
    let prefix = match event_stream::read_first_request(
        &mut stream,
        limits.header_read_timeout,
        limits.max_header_bytes,
        &mut stopping,
    )
    .await
    {
        FirstRequest::Gone => return,
        FirstRequest::Stream(request) => {
            event_stream::respond(stream, router, request, stopping).await;
            return;
        }
        FirstRequest::Hyper(prefix) => prefix,
    };
    serve_http1(Prefixed::new(prefix, stream), router, &builder, stopping).await;
}

/// Serves one TLS connection until it closes; its `_slot` is held until then.
async fn tls_connection(
    stream: TcpStream,
    acceptor: TlsAcceptor,
    handshake_timeout: Duration,
    router: Router,
    builder: Arc<http1::Builder>,
    mut stopping: watch::Receiver<bool>,
    _slot: OwnedSemaphorePermit,
) {
    let tls = tokio::select! {
        handshake = tokio::time::timeout(handshake_timeout, acceptor.accept(stream)) => handshake,
        _ = stopping.changed() => return,
    };
    match tls {
        Ok(Ok(tls)) => serve_http1(tls, router, &builder, stopping).await,
        Ok(Err(error)) => tracing::debug!(%error, "TLS handshake failed"),
        Err(_) => tracing::debug!("TLS handshake timed out"),
    }
}

/// hyper serves `io` until the connection closes; when `stopping`
/// changes it finishes the request in progress and closes.
async fn serve_http1<I>(
    io: I,
    router: Router,
    builder: &http1::Builder,
    mut stopping: watch::Receiver<bool>,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let connection = builder.serve_connection(TokioIo::new(io), TowerToHyperService::new(router));
    tokio::pin!(connection);
    loop {
        tokio::select! {
            result = connection.as_mut() => {
                if let Err(error) = result {
                    // Timeouts, resets, malformed requests: the client's
                    // business, not an operator's.
                    tracing::debug!(%error, "connection ended with an error");
                }
                break;
            }
            changed = stopping.changed() => {
                if changed.is_err() {
                    // `serve` itself was dropped (the grace period ran
                    // out): close at once.
                    break;
                }
                connection.as_mut().graceful_shutdown();
            }
        }
    }
}

fn set_nodelay(stream: &TcpStream) {
    if let Err(error) = stream.set_nodelay(true) {
        tracing::debug!(%error, "cannot set TCP_NODELAY");
    }
}

/// A failed accept: a connection reset before it was accepted is nothing;
/// anything else (out of file descriptors, ...) is logged and waited out,
/// as hyper's own server did, so the loop does not spin.
async fn accept_failed(error: io::Error) {
    use io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if matches!(
        error.kind(),
        ConnectionAborted | ConnectionRefused | ConnectionReset
    ) {
        return;
    }
    tracing::error!(%error, "accepting a connection failed; retrying in 1 s");
    tokio::time::sleep(Duration::from_secs(1)).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::get;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    async fn start(limits: ConnectionLimits) -> (std::net::SocketAddr, watch::Sender<bool>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let router = Router::new().route("/", get(|| async { "hi" }));
        let (stop, mut stopped) = watch::channel(false);
        tokio::spawn(serve(listener, router, limits, async move {
            let _ = stopped.wait_for(|stop| *stop).await;
        }));
        (addr, stop)
    }

    const LIMITS: ConnectionLimits = ConnectionLimits {
        header_read_timeout: Duration::from_millis(300),
        max_header_bytes: 1024,
        max_connections: 100,
    };

    /// Reads until the server closes; `None` if it does not within `within`.
    async fn read_to_close(stream: &mut TcpStream, within: Duration) -> Option<Vec<u8>> {
        let mut received = Vec::new();
        tokio::time::timeout(within, async {
            let mut buffer = [0u8; 4096];
            loop {
                match stream.read(&mut buffer).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => received.extend_from_slice(&buffer[..n]),
                }
            }
        })
        .await
        .ok()?;
        Some(received)
    }

    #[tokio::test]
    async fn a_silent_connection_is_closed_after_the_header_read_timeout() {
        let (addr, _stop) = start(LIMITS).await;
        let mut silent = TcpStream::connect(addr).await.unwrap();
        let closed = read_to_close(&mut silent, Duration::from_secs(5)).await;
        assert!(closed.is_some(), "still open 5 s after connecting");
    }

    #[tokio::test]
    async fn headers_sent_a_byte_at_a_time_are_cut_off() {
        let (addr, _stop) = start(LIMITS).await;
        let mut slow = TcpStream::connect(addr).await.unwrap();
        let started = std::time::Instant::now();
        let request = b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
        for byte in request {
            if slow.write_all(&[*byte]).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let closed = read_to_close(&mut slow, Duration::from_secs(5)).await;
        assert!(closed.is_some(), "a slow loris keeps its connection");
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[tokio::test]
    async fn oversized_headers_get_431_and_a_close() {
        let (addr, _stop) = start(LIMITS).await;
        let mut client = TcpStream::connect(addr).await.unwrap();
        let request = format!(
            "GET / HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
            "a".repeat(2048)
        );
        client.write_all(request.as_bytes()).await.unwrap();
        let response = read_to_close(&mut client, Duration::from_secs(5))
            .await
            .expect("closed after the 431");
        let response = String::from_utf8_lossy(&response);
        assert!(response.starts_with("HTTP/1.1 431"), "{response}");
    }

    #[tokio::test]
    async fn at_the_connection_limit_new_clients_wait_until_one_closes() {
        let (addr, _stop) = start(ConnectionLimits {
            header_read_timeout: Duration::from_secs(30),
            max_connections: 2,
            ..LIMITS
        })
        .await;
        let first = TcpStream::connect(addr).await.unwrap();
        let _second = TcpStream::connect(addr).await.unwrap();
        // The kernel completes the handshake; the gateway does not accept.
        let mut third = TcpStream::connect(addr).await.unwrap();
        third
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut buffer = [0u8; 1024];
        let early = tokio::time::timeout(Duration::from_millis(300), third.read(&mut buffer)).await;
        assert!(early.is_err(), "answered over the limit: {early:?}");
        drop(first);
        let n = tokio::time::timeout(Duration::from_secs(5), third.read(&mut buffer))
            .await
            .expect("served once a connection closed")
            .unwrap();
        assert!(
            buffer[..n].starts_with(b"HTTP/1.1 200"),
            "{:?}",
            &buffer[..n]
        );
    }

    #[tokio::test]
    async fn shutdown_refuses_new_connections_and_closes_idle_ones() {
        let (addr, stop) = start(ConnectionLimits {
            header_read_timeout: Duration::from_secs(30),
            ..LIMITS
        })
        .await;
        let mut idle = TcpStream::connect(addr).await.unwrap();
        idle.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut buffer = [0u8; 1024];
        let n = idle.read(&mut buffer).await.unwrap();
        assert!(buffer[..n].starts_with(b"HTTP/1.1 200"));
        stop.send_replace(true);
        assert!(
            read_to_close(&mut idle, Duration::from_secs(5))
                .await
                .is_some(),
            "an idle keep-alive connection is closed at shutdown"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(TcpStream::connect(addr).await.is_err());
    }

    #[tokio::test]
    async fn dropping_serve_closes_a_connection_stuck_in_a_request() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        // A handler that never answers.
        let router = Router::new().route("/", get(std::future::pending::<&'static str>));
        let server = tokio::spawn(serve(
            listener,
            router,
            ConnectionLimits {
                header_read_timeout: Duration::from_secs(30),
                ..LIMITS
            },
            std::future::pending(),
        ));
        let mut stuck = TcpStream::connect(addr).await.unwrap();
        stuck
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        server.abort();
        assert!(
            read_to_close(&mut stuck, Duration::from_secs(5))
                .await
                .is_some(),
            "the connection outlives the server"
        );
    }
}
