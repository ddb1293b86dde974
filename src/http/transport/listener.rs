//! The accept loop: each connection served by hyper (HTTP/1.1, or HTTP/2
//! by ALPN over TLS or with prior knowledge on a plain connection) with the
//! limits `axum::serve` leaves out, and a graceful shutdown.
//!
//! `axum::serve` builds hyper without a timer, so hyper's header read
//! timeout (30 s by default) never fires, and it first waits for the bytes
//! that tell HTTP/1 from HTTP/2 without any timeout: a client that opens a
//! connection and sends nothing, or its headers one byte at a time (slow
//! loris), holds a socket and a task for ever. Here every connection gets:
//! - a header read timeout, which also closes keep-alive connections that
//!   stay idle that long (HTTP/2: a connection without an open stream for
//!   that long, its handshake included, is closed with a GOAWAY);
//! - a cap on the size of the request line and headers (431 above it;
//!   HTTP/2: the header list size it advertises);
//! - HTTP/2: at most [`MAX_CONCURRENT_STREAMS`] streams at once, and pings
//!   when it is quiet, so a peer that vanished is noticed;
//! - TCP_NODELAY, so small responses do not wait for delayed ACKs.
//!
//! A connection that opens with an HTTP/1 stream request (`/watch`,
//! `/subscribe`) is answered by
//! [`event_stream`](super::event_stream) instead of hyper (it explains why),
//! over TLS too. [`serve`] runs the same loop over TLS, with a handshake
//! timeout.

use std::convert::Infallible;
use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::server::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulConnection;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt as _;

use super::event_stream::{self, FirstRequest, Prefixed};
use super::tls::ALPN_H2;

/// The largest request line plus headers a client may send (431 above).
/// Keys travel in the path (at most about 3 KiB percent-encoded with the
/// default key limit); the rest is room for tokens and proxies' headers.
pub const MAX_HEADER_BYTES: usize = 64 * 1024;

/// Streams one HTTP/2 connection may have open at once (more are refused
/// with REFUSED_STREAM): room for a dashboard's watch streams and its
/// requests, while one connection cannot take every watcher of the gateway
/// (`--max-watchers` still counts each stream).
pub const MAX_CONCURRENT_STREAMS: u32 = 256;

/// How long an HTTP/2 connection may be quiet before a ping, and how long
/// the ping's answer may take before the connection is closed: a peer that
/// vanished (no FIN, no RST) would otherwise hold its streams' watchers.
pub const HTTP2_KEEP_ALIVE: Duration = Duration::from_secs(20);

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
///
/// With `tls`, each connection must complete its handshake within the
/// header read timeout (as long as a plain connection may stay silent),
/// then is served the same way, HTTP/2 when ALPN chose `h2` (if the
/// acceptor offers it).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnectionLimits,
    tls: Option<TlsAcceptor>,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let protocols = Protocols::new(limits);
    accept_loop(listener, limits, shutdown, |stream, stopping, slot| {
        let (router, protocols, tls) = (router.clone(), Arc::clone(&protocols), tls.clone());
        tokio::spawn(async move {
            match tls {
                // Boxed: a plain connection's task, a watch stream's
                // included, is not sized by the TLS handshake's state.
                Some(acceptor) => {
                    Box::pin(tls_connection(
                        stream, acceptor, router, &protocols, stopping,
                    ))
                    .await;
                }
                None => connection(stream, router, &protocols, stopping).await,
            }
            drop(slot);
        });
    })
    .await
}

/// hyper's HTTP/1 and HTTP/2 with a timer (without one their timeouts and
/// pings never fire) and the limits.
#[derive(Debug)]
struct Protocols {
    limits: ConnectionLimits,
    http1: http1::Builder,
    http2: http2::Builder<TokioExecutor>,
}

impl Protocols {
    fn new(limits: ConnectionLimits) -> Arc<Self> {
        let mut http1 = http1::Builder::new();
        http1
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_read_timeout)
            .max_header_size(limits.max_header_bytes);
        let mut http2 = http2::Builder::new(TokioExecutor::new());
        http2
            .timer(TokioTimer::new())
            .max_header_list_size(u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX))
            .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
            .keep_alive_interval(HTTP2_KEEP_ALIVE)
            .keep_alive_timeout(HTTP2_KEEP_ALIVE);
        Arc::new(Self {
            limits,
            http1,
            http2,
        })
    }
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

/// Serves one connection (plain, or TLS without `h2`) until it closes.
async fn connection<I>(
    mut io: I,
    router: Router,
    protocols: &Protocols,
    mut stopping: watch::Receiver<bool>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let limits = protocols.limits;
    // The first request's head is read here at most once per connection;
    // a client that takes its time before the first byte gets hyper's full
    // header timeout from the first byte on (at most twice the timeout).
    match event_stream::read_first_request(
        &mut io,
        limits.header_read_timeout,
        limits.max_header_bytes,
        &mut stopping,
    )
    .await
    {
        FirstRequest::Gone => {}
        FirstRequest::Stream(request) => {
            event_stream::respond(io, router, request).await;
        }
        // hyper's connections are boxed: held inline, the larger of them
        // (HTTP/2's) would size every connection's task, watch streams'
        // included, which live far longer and are far more numerous.
        FirstRequest::Hyper(prefix) => {
            let io = TokioIo::new(Prefixed::new(prefix, io));
            let http1 = protocols
                .http1
                .serve_connection(io, TowerToHyperService::new(router));
            Box::pin(drive(http1, stopping, None)).await;
        }
        FirstRequest::Http2(prefix) => {
            let io = Prefixed::new(prefix, io);
            Box::pin(serve_http2(io, router, protocols, stopping)).await;
        }
    }
}

/// Serves one TLS connection until it closes.
async fn tls_connection(
    stream: TcpStream,
    acceptor: TlsAcceptor,
    router: Router,
    protocols: &Protocols,
    mut stopping: watch::Receiver<bool>,
) {
    let tls = tokio::select! {
        handshake = tokio::time::timeout(
            protocols.limits.header_read_timeout,
            acceptor.accept(stream),
        ) => handshake,
        _ = stopping.changed() => return,
    };
    let tls = match tls {
        Ok(Ok(tls)) => tls,
        Ok(Err(error)) => return tracing::debug!(%error, "TLS handshake failed"),
        Err(_) => return tracing::debug!("TLS handshake timed out"),
    };
    if tls.get_ref().1.alpn_protocol() == Some(ALPN_H2) {
        // Boxed, as in `connection`: a TLS watch stream's task is not sized
        // by HTTP/2's connection.
        Box::pin(serve_http2(tls, router, protocols, stopping)).await;
    } else {
        connection(tls, router, protocols, stopping).await;
    }
}

/// hyper's HTTP/2 serves `io` (the client's preface first) until the
/// connection closes, as [`drive`] says.
async fn serve_http2<I>(
    io: I,
    router: Router,
    protocols: &Protocols,
    stopping: watch::Receiver<bool>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let streams = Arc::new(OpenStreams::new());
    let service = {
        let streams = Arc::clone(&streams);
        hyper::service::service_fn(move |request: axum::http::Request<Incoming>| {
            let open = OpenStream::new(Arc::clone(&streams));
            let router = router.clone();
            async move {
                let response = match router.oneshot(request).await {
                    Ok(response) => response,
                    Err(never) => match never {},
                };
                // The stream counts as open until its body ends or is dropped.
                // Event streams keep their frames whole: their watchers
                // skip ahead on their own when a client does not read.
                let paced = !is_event_stream(response.headers());
                Ok::<_, Infallible>(response.map(|body| Http2Body::new(body, open, paced)))
            }
        })
    };
    let connection = protocols.http2.serve_connection(TokioIo::new(io), service);
    let idle = (&*streams, protocols.limits.header_read_timeout);
    drive(connection, stopping, Some(idle)).await;
}

/// Runs one hyper connection until it closes. When `stopping` changes it
/// finishes what is in progress and closes (at once if `serve` itself was
/// dropped: the grace period ran out). With `idle` (HTTP/2), a connection
/// with no stream open for the timeout is sent GOAWAY the same way, and one
/// still without a stream a timeout after its GOAWAY (a client stuck in its
/// handshake) is dropped.
async fn drive<C>(
    connection: C,
    mut stopping: watch::Receiver<bool>,
    idle: Option<(&OpenStreams, Duration)>,
) where
    C: GracefulConnection,
    C::Error: std::fmt::Display,
{
    tokio::pin!(connection);
    let (streams, timeout) = match idle {
        Some((streams, timeout)) => (Some(streams), timeout),
        None => (None, Duration::ZERO),
    };
    // Never polled without `idle`: an HTTP/1 connection registers no timer.
    let idle_check = tokio::time::sleep(timeout);
    tokio::pin!(idle_check);
    let mut going_away = false;
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
                    break;
                }
                connection.as_mut().graceful_shutdown();
                going_away = true;
            }
            () = &mut idle_check, if streams.is_some() => {
                match streams.and_then(OpenStreams::idle_for) {
                    Some(idle) if idle >= timeout => {
                        if going_away {
                            break;
                        }
                        connection.as_mut().graceful_shutdown();
                        going_away = true;
                        idle_check.as_mut().reset(Instant::now() + timeout);
                    }
                    Some(idle) => idle_check.as_mut().reset(Instant::now() + (timeout - idle)),
                    None => idle_check.as_mut().reset(Instant::now() + timeout),
                }
            }
        }
    }
}

/// The streams of one HTTP/2 connection that are open (a request being
/// answered, or its response body being sent), and since when none is.
#[derive(Debug)]
struct OpenStreams(Mutex<(usize, Instant)>);

impl OpenStreams {
    fn new() -> Self {
        Self(Mutex::new((0, Instant::now())))
    }

    /// How long no stream has been open; `None` while one is.
    fn idle_for(&self) -> Option<Duration> {
        let (open, since) = *self.0.lock().unwrap_or_else(|e| e.into_inner());
        (open == 0).then(|| since.elapsed())
    }
}

/// One open stream of [`OpenStreams`], until dropped.
#[derive(Debug)]
struct OpenStream(Arc<OpenStreams>);

impl OpenStream {
    fn new(streams: Arc<OpenStreams>) -> Self {
        streams.0.lock().unwrap_or_else(|e| e.into_inner()).0 += 1;
        Self(streams)
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        let mut state = self.0.0.lock().unwrap_or_else(|e| e.into_inner());
        state.0 = state.0.saturating_sub(1);
        if state.0 == 0 {
            state.1 = Instant::now();
        }
    }
}

/// The most of a response body h2 is handed at once: a larger frame goes
/// out in copies of this size, so that a stream whose client does not read
/// pins this much in h2's send buffer, not the whole value.
const HTTP2_PIECE_BYTES: usize = 16 * 1024;

/// A response body on an HTTP/2 stream. It keeps its stream counted as
/// open and, but for event streams, hands h2 at most [`HTTP2_PIECE_BYTES`]
/// at a time, and gives up
/// when h2 has not asked for more within
/// [`WRITE_STALL_TIMEOUT`](event_stream::WRITE_STALL_TIMEOUT) of the last
/// piece: what is unsent is dropped at once, and the stream fails (is
/// reset) if h2 asks again. h2 asks only when the client's flow-control
/// window has room, so a client that never reads (window 0, pings
/// answered) would otherwise pin its responses for as long as it likes.
#[derive(Debug)]
struct Http2Body {
    unsent: Arc<Mutex<Unsent>>,
    watchdog: Option<tokio::task::AbortHandle>,
    /// Whether frames go out in pieces, watched for progress.
    paced: bool,
    _open: OpenStream,
}

/// Whether a response is an SSE stream.
fn is_event_stream(headers: &axum::http::HeaderMap) -> bool {
    headers
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|value| value.as_bytes().starts_with(b"text/event-stream"))
}

/// What an [`Http2Body`] has not handed to h2 yet.
#[derive(Debug)]
struct Unsent {
    /// `None` once it ended or was given up.
    body: Option<Body>,
    /// The rest of a frame larger than a piece.
    rest: Bytes,
    /// When a piece was handed out with more to come, until h2 asks again.
    waiting_since: Option<Instant>,
    stalled: bool,
}

impl Unsent {
    fn is_end(&self) -> bool {
        self.rest.is_empty() && self.body.as_ref().is_none_or(HttpBody::is_end_stream)
    }

    /// Drops what is unsent if h2 has waited `stall` for the client since
    /// the last piece; otherwise how long until it would have.
    fn give_up_after(&mut self, stall: Duration) -> Option<Duration> {
        let left = match self.waiting_since {
            Some(since) => stall.saturating_sub(since.elapsed()),
            None => stall,
        };
        if !left.is_zero() {
            return Some(left);
        }
        tracing::debug!(
            ?stall,
            "an HTTP/2 client read nothing of a response; giving it up"
        );
        self.body = None;
        self.rest = Bytes::new();
        self.stalled = true;
        None
    }
}

impl Http2Body {
    fn new(body: Body, open: OpenStream, paced: bool) -> Self {
        Self {
            unsent: Arc::new(Mutex::new(Unsent {
                body: Some(body),
                rest: Bytes::new(),
                waiting_since: None,
                stalled: false,
            })),
            watchdog: None,
            paced,
            _open: open,
        }
    }

    fn unsent(&self) -> std::sync::MutexGuard<'_, Unsent> {
        self.unsent.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts the task that gives the body up when h2 stops asking; one
    /// per body, only for bodies of more than one piece or frame.
    fn watch_progress(&mut self) {
        if self.watchdog.is_some() {
            return;
        }
        let unsent = Arc::downgrade(&self.unsent);
        let stall = event_stream::WRITE_STALL_TIMEOUT;
        let task = tokio::spawn(async move {
            loop {
                let left = {
                    let Some(unsent) = unsent.upgrade() else {
                        return;
                    };
                    let mut unsent = unsent.lock().unwrap_or_else(|e| e.into_inner());
                    unsent.give_up_after(stall)
                };
                match left {
                    Some(left) => tokio::time::sleep(left).await,
                    None => return,
                }
            }
        });
        self.watchdog = Some(task.abort_handle());
    }
}

impl Drop for Http2Body {
    fn drop(&mut self) {
        if let Some(watchdog) = &self.watchdog {
            watchdog.abort();
        }
    }
}

impl HttpBody for Http2Body {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        use std::task::Poll;
        let this = self.get_mut();
        let mut unsent = this.unsent();
        if !this.paced {
            return match unsent.body.as_mut() {
                Some(body) => std::pin::Pin::new(body).poll_frame(cx),
                None => Poll::Ready(None),
            };
        }
        if unsent.stalled {
            return Poll::Ready(Some(Err(axum::Error::new(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client read nothing of the response for too long",
            )))));
        }
        unsent.waiting_since = None;
        if unsent.rest.is_empty() {
            let Some(body) = unsent.body.as_mut() else {
                return Poll::Ready(None);
            };
            let data = match std::pin::Pin::new(body).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => {
                    unsent.body = None;
                    return Poll::Ready(None);
                }
                Poll::Ready(Some(Err(error))) => return Poll::Ready(Some(Err(error))),
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => data,
                    Err(trailers) => return Poll::Ready(Some(Ok(trailers))),
                },
            };
            if data.len() <= HTTP2_PIECE_BYTES {
                let more = !unsent.is_end();
                if more {
                    unsent.waiting_since = Some(Instant::now());
                    drop(unsent);
                    this.watch_progress();
                }
                return Poll::Ready(Some(Ok(Frame::data(data))));
            }
            unsent.rest = data;
        }
        // A copy: a slice would keep the whole frame's memory alive.
        let length = unsent.rest.len().min(HTTP2_PIECE_BYTES);
        let piece = Bytes::copy_from_slice(&unsent.rest[..length]);
        bytes::Buf::advance(&mut unsent.rest, length);
        if !unsent.is_end() {
            unsent.waiting_since = Some(Instant::now());
            drop(unsent);
            this.watch_progress();
        }
        Poll::Ready(Some(Ok(Frame::data(piece))))
    }

    fn is_end_stream(&self) -> bool {
        let unsent = self.unsent();
        !unsent.stalled && unsent.is_end()
    }

    fn size_hint(&self) -> SizeHint {
        let unsent = self.unsent();
        let rest = unsent.rest.len() as u64;
        let mut hint = unsent
            .body
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), HttpBody::size_hint);
        // Upper first: a lower bound above the upper one panics.
        if let Some(upper) = hint.upper() {
            hint.set_upper(upper + rest);
        }
        hint.set_lower(hint.lower() + rest);
        hint
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
        tokio::spawn(serve(listener, router, limits, None, async move {
            let _ = stopped.wait_for(|stop| *stop).await;
        }));
        (addr, stop)
    }

    #[tokio::test]
    async fn an_http2_body_goes_out_in_copied_pieces_with_its_length_known() {
        use http_body_util::BodyExt as _;
        let value: Vec<u8> = (0..40_000u32).map(|n| n as u8).collect();
        let body = Http2Body::new(
            Body::from(value.clone()),
            OpenStream::new(Arc::new(OpenStreams::new())),
            true,
        );
        assert_eq!(body.size_hint().exact(), Some(40_000));
        let mut body = std::pin::pin!(body);
        let mut sizes = Vec::new();
        let mut received = Vec::new();
        while let Some(frame) = body.frame().await {
            let data = frame.unwrap().into_data().unwrap();
            sizes.push(data.len());
            received.extend_from_slice(&data);
        }
        assert_eq!(sizes, [16_384, 16_384, 7_232]);
        assert_eq!(received, value);
        assert!(body.is_end_stream());
    }

    #[test]
    fn an_http2_body_waited_on_for_the_stall_timeout_drops_what_is_unsent() {
        let stall = Duration::from_secs(60);
        let mut unsent = Unsent {
            body: Some(Body::from(vec![0u8; 100])),
            rest: Bytes::from(vec![0u8; 100]),
            waiting_since: None,
            stalled: false,
        };
        // Not waiting for the client: nothing to give up.
        assert_eq!(unsent.give_up_after(stall), Some(stall));
        unsent.waiting_since = Some(Instant::now());
        assert!(unsent.give_up_after(stall).is_some());
        assert!(unsent.body.is_some());
        unsent.waiting_since = Instant::now().checked_sub(stall);
        assert_eq!(unsent.give_up_after(stall), None);
        assert!(unsent.stalled && unsent.body.is_none() && unsent.rest.is_empty());
    }

    const LIMITS: ConnectionLimits = ConnectionLimits {
        header_read_timeout: Duration::from_millis(300),
        max_header_bytes: 1024,
        max_connections: 100,
    };
    /// [`LIMITS`] for a test whose idle clients must outlast it.
    const PATIENT: ConnectionLimits = ConnectionLimits {
        header_read_timeout: Duration::from_secs(30),
        ..LIMITS
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

    /// Sends `bytes` one every 50 ms, as a slow loris does, until the
    /// server hangs up; whether it closed the connection within 5 s.
    async fn closes_a_slow_sender(addr: std::net::SocketAddr, bytes: &[u8]) -> bool {
        let mut slow = TcpStream::connect(addr).await.unwrap();
        for byte in bytes {
            if slow.write_all(&[*byte]).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        read_to_close(&mut slow, Duration::from_secs(5))
            .await
            .is_some()
    }

    #[tokio::test]
    async fn headers_sent_a_byte_at_a_time_are_cut_off() {
        let (addr, _stop) = start(LIMITS).await;
        let started = std::time::Instant::now();
        let request = b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
        assert!(
            closes_a_slow_sender(addr, request).await,
            "a slow loris keeps its connection"
        );
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
            max_connections: 2,
            ..PATIENT
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
        let (addr, stop) = start(PATIENT).await;
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

    const HTTP2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    /// An empty SETTINGS frame: with the preface, a client's whole handshake.
    const EMPTY_SETTINGS: &[u8] = b"\0\0\0\x04\0\0\0\0\0";

    #[tokio::test]
    async fn a_client_with_prior_knowledge_gets_http2() {
        let (addr, _stop) = start(LIMITS).await;
        let client = reqwest::Client::builder()
            .http2_prior_knowledge()
            .no_proxy()
            .build()
            .unwrap();
        for _ in 0..3 {
            let response = client.get(format!("http://{addr}/")).send().await.unwrap();
            assert_eq!(response.version(), reqwest::Version::HTTP_2);
            assert_eq!(response.text().await.unwrap(), "hi");
        }
    }

    #[tokio::test]
    async fn an_http2_connection_without_streams_is_closed_after_the_header_read_timeout() {
        let (addr, _stop) = start(LIMITS).await;
        // Stuck in the handshake (the preface, no SETTINGS), and idle
        // after a complete one.
        for opening in [
            HTTP2_PREFACE.to_vec(),
            [HTTP2_PREFACE, EMPTY_SETTINGS].concat(),
        ] {
            let mut client = TcpStream::connect(addr).await.unwrap();
            client.write_all(&opening).await.unwrap();
            let started = std::time::Instant::now();
            let closed = read_to_close(&mut client, Duration::from_secs(5)).await;
            assert!(closed.is_some(), "still open 5 s after its preface");
            assert!(started.elapsed() >= Duration::from_millis(250));
        }
    }

    #[tokio::test]
    async fn a_preface_sent_a_byte_at_a_time_is_cut_off() {
        let (addr, _stop) = start(LIMITS).await;
        assert!(
            closes_a_slow_sender(addr, &HTTP2_PREFACE[..20]).await,
            "a slow preface keeps its connection"
        );
    }

    #[tokio::test]
    async fn shutdown_sends_http2_clients_a_goaway_and_closes() {
        let (addr, stop) = start(PATIENT).await;
        let mut client = TcpStream::connect(addr).await.unwrap();
        client
            .write_all(&[HTTP2_PREFACE, EMPTY_SETTINGS].concat())
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        stop.send_replace(true);
        // hyper pings before its last GOAWAY: answer as a client does.
        let mut frames = Vec::new();
        let mut received = Vec::new();
        let mut buffer = [0u8; 4096];
        let closed = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                match client.read(&mut buffer).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => received.extend_from_slice(&buffer[..n]),
                }
                while received.len() >= 9 {
                    let length = usize::from(received[0]) << 16
                        | usize::from(received[1]) << 8
                        | usize::from(received[2]);
                    if received.len() < 9 + length {
                        break;
                    }
                    let frame: Vec<u8> = received.drain(..9 + length).collect();
                    frames.push(frame[3]);
                    if frame[3] == 6 && frame[4] & 1 == 0 {
                        let mut ack = frame.clone();
                        ack[4] = 1;
                        let _ = client.write_all(&ack).await;
                    }
                }
            }
        })
        .await;
        assert!(closed.is_ok(), "open 5 s after shutdown; frames {frames:?}");
        assert!(
            frames.contains(&7),
            "no GOAWAY among frame types {frames:?}"
        );
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
            PATIENT,
            None,
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
