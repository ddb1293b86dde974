//! Event streams served straight on the socket, without hyper's buffers.
//!
//! hyper gives every HTTP/1 connection a read buffer and a header write
//! buffer of 8 KiB each, for as long as the connection lives. A watch
//! stream lives for hours and writes a few hundred bytes now and then, so
//! those 16 KiB were most of what a watcher cost (10,000 watchers: about
//! 147 MiB); a topic stream (`GET /subscribe`) is the same. So when a
//! connection's *first* request is a plain `GET /watch…` or
//! `GET /subscribe?…`, the listener reads its head here
//! ([`read_first_request`]),
//! runs it through the same router (authentication, CORS, limits and error
//! bodies are exactly the API's) and writes the response itself
//! ([`respond`]): the head, then each body frame as it is produced, one
//! `writev` per frame, with no copy of the (shared) event bytes. The
//! connection closes when the response ends (`Connection: close`).
//!
//! Anything else (another method or path, a request with a body, a head
//! this parser does not take, a stream after another request on a
//! keep-alive connection) goes to hyper as before, with the bytes already
//! read handed back first by [`Prefixed`].

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderName, HeaderValue, Method, Request, Uri, Version, header};
use bytes::{Buf as _, Bytes, BytesMut};
use http_body::Body as _;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, ReadBuf};
use tokio::sync::watch;
use tokio::time::Instant;
use tower::ServiceExt as _;

use super::stream_request::{REQUEST_LINE_STARTS, is_stream_request};

/// What an HTTP/2 client with prior knowledge sends first (RFC 9113,
/// section 3.4); a connection that starts with it goes to hyper's HTTP/2.
const HTTP2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Headers a request served here may have (more: hyper's, which allows 100).
const MAX_HEADERS: usize = 64;

/// The first read's buffer; it grows up to the head size limit.
const FIRST_READ_BYTES: usize = 1024;

/// How long one frame (the head, or one event) may take to write to a
/// client that does not read, or reads too slowly, before the stream is
/// given up (its watcher has long been skipping to `lagged` syncs by then).
pub const WRITE_STALL_TIMEOUT: Duration = Duration::from_secs(60);

/// What the first bytes of a connection turned out to be.
#[derive(Debug)]
pub enum FirstRequest {
    /// A complete request head to answer with [`respond`].
    Stream(Box<Request<Body>>),
    /// For hyper's HTTP/1: these bytes, then the rest of the connection.
    Hyper(BytesMut),
    /// For hyper's HTTP/2: these bytes (the preface), then the rest.
    Http2(BytesMut),
    /// The client closed, failed, stayed silent past the header read
    /// timeout, or the server is shutting down: close without an answer,
    /// as hyper does.
    Gone,
}

/// Reads until the first request is known to be a stream or not; at most
/// `header_read_timeout` in all, and `max_header_bytes` of head.
pub async fn read_first_request(
    stream: &mut (impl AsyncRead + Unpin),
    header_read_timeout: Duration,
    max_header_bytes: usize,
    stopping: &mut watch::Receiver<bool>,
) -> FirstRequest {
    let deadline = Instant::now() + header_read_timeout;
    let mut buffer = BytesMut::with_capacity(FIRST_READ_BYTES);
    let mut scanned = 0;
    loop {
        match classify(&buffer, scanned, max_header_bytes) {
            Head::Incomplete => scanned = buffer.len(),
            Head::Stream(request) => return FirstRequest::Stream(request),
            Head::Other => return FirstRequest::Hyper(buffer),
            Head::Http2 => return FirstRequest::Http2(buffer),
        }
        let read = tokio::select! {
            read = tokio::time::timeout_at(deadline, stream.read_buf(&mut buffer)) => read,
            _ = stopping.changed() => return FirstRequest::Gone,
        };
        match read {
            Ok(Ok(n)) if n > 0 => {}
            _ => return FirstRequest::Gone,
        }
    }
}

#[derive(Debug)]
enum Head {
    Incomplete,
    Stream(Box<Request<Body>>),
    Other,
    Http2,
}

/// `buffer[..scanned]` was seen before without a complete head.
fn classify(buffer: &[u8], scanned: usize, max_header_bytes: usize) -> Head {
    let preface = buffer.len().min(HTTP2_PREFACE.len());
    if buffer[..preface] == HTTP2_PREFACE[..preface] {
        return if preface == HTTP2_PREFACE.len() {
            Head::Http2
        } else {
            Head::Incomplete
        };
    }
    // Request lines served here start so; other bytes go to hyper as soon
    // as they differ from every start.
    let mut started = false;
    let mut whole = false;
    for start in REQUEST_LINE_STARTS {
        let seen = buffer.len().min(start.len());
        if buffer[..seen] == start[..seen] {
            started = true;
            whole |= seen == start.len();
        }
    }
    if !started {
        return Head::Other;
    }
    if buffer.len() > max_header_bytes {
        // hyper answers 431.
        return Head::Other;
    }
    // A head ends with a line feed: parse only when a new one arrived, so
    // a client trickling bytes costs one scan per line, not per byte.
    if !whole || !buffer[scanned..].contains(&b'\n') {
        return Head::Incomplete;
    }
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut parsed = httparse::Request::new(&mut headers);
    match parsed.parse(buffer) {
        Ok(httparse::Status::Complete(_)) => {
            request(&parsed).map_or(Head::Other, |request| Head::Stream(Box::new(request)))
        }
        Ok(httparse::Status::Partial) => Head::Incomplete,
        // Malformed or too many headers: hyper's answer (400, 431).
        Err(_) => Head::Other,
    }
}

/// The request, if it is one served here: a stream route, no body, nothing
/// hyper would treat specially.
fn request(parsed: &httparse::Request<'_, '_>) -> Option<Request<Body>> {
    let method = Method::from_bytes(parsed.method?.as_bytes()).ok()?;
    let path = parsed.path?;
    let route = path.split_once('?').map_or(path, |(route, _)| route);
    if !is_stream_request(&method, route) {
        return None;
    }
    let version = match parsed.version? {
        0 => Version::HTTP_10,
        1 => Version::HTTP_11,
        _ => return None,
    };
    let mut request = Request::new(Body::empty());
    *request.method_mut() = method;
    *request.uri_mut() = Uri::try_from(path).ok()?;
    *request.version_mut() = version;
    let headers = request.headers_mut();
    for field in parsed.headers.iter() {
        let name = HeaderName::from_bytes(field.name.as_bytes()).ok()?;
        if name == header::CONTENT_LENGTH
            || name == header::TRANSFER_ENCODING
            || name == header::UPGRADE
            || name == header::EXPECT
        {
            return None;
        }
        headers.append(name, HeaderValue::from_bytes(field.value).ok()?);
    }
    Some(request)
}

/// Answers `request` with `router` on `stream`, then closes it. Returns
/// when the response has ended, the client has gone, or a write stalled
/// for [`WRITE_STALL_TIMEOUT`]. A shutdown ends streams through their
/// bodies (the watch and topic hubs close what they read), so a stream,
/// 10,000 of them in a fan-out, waits on no shutdown signal here.
pub async fn respond(
    mut stream: impl AsyncRead + AsyncWrite + Unpin,
    router: Router,
    request: Box<Request<Body>>,
) {
    // What only the start needs (the request, the router's future, the
    // response's head) is freed before the stream's long life, and kept
    // out of this future's state, which the connection's task holds for
    // as long: a stream keeps its body and the socket.
    let version = request.version();
    let response = match Box::pin(router.oneshot(unbox(request))).await {
        Ok(response) => response,
        Err(never) => match never {},
    };
    let (parts, mut body) = response.into_parts();
    let framing = match body.size_hint().exact() {
        Some(length) => Framing::Length(length),
        None if version == Version::HTTP_11 => Framing::Chunked,
        None => Framing::UntilClose,
    };
    let head = Bytes::from(encode_head(&parts, framing));
    drop(parts);
    // Scoped: what the stream's life holds is gone before the shutdown.
    let end = {
        let mut pump = Pump::new(head, framing, WRITE_STALL_TIMEOUT);
        std::future::poll_fn(|cx| pump.poll(cx, &mut stream, &mut body)).await
    };
    drop(body);
    if end == End::Gone {
        return;
    }
    let _ = tokio::time::timeout(WRITE_STALL_TIMEOUT, stream.shutdown()).await;
}

/// How a stream's [`Pump`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// The body ended, and its end was told.
    Done,
    /// The client left, a write failed or stalled, or the body failed:
    /// close without telling the end, so the client sees the truncation.
    Gone,
}

/// A stream's whole life on the socket: the head, then each body frame
/// written whole (one `writev` when the socket takes it), then the body's
/// end (the last chunk), while the client's side is read (bytes it sends
/// after its request are dropped; its close is noticed at once). The
/// connection's task holds this for as long as the stream lives, one per
/// watcher, so it is kept small: one frame in flight, and a stall timer
/// only while a write waits.
#[derive(Debug)]
struct Pump {
    framing: Framing,
    frame: Outgoing,
    stall_after: Duration,
    /// Armed when a frame's write first waits, kept until the frame is out:
    /// a client reading a byte at a time still has the whole frame to take
    /// within `stall_after`.
    stall: Option<Pin<Box<tokio::time::Sleep>>>,
    /// The body's end is being written.
    ending: bool,
    discard: [u8; 16],
}

impl Pump {
    /// Starts with `head` in flight.
    fn new(head: Bytes, framing: Framing, stall_after: Duration) -> Self {
        let mut frame = Outgoing::default();
        frame.start(head, false);
        Self {
            framing,
            frame,
            stall_after,
            stall: None,
            ending: false,
            discard: [0; 16],
        }
    }

    /// The body's end in flight: the last chunk, when chunked.
    fn end(&mut self) {
        self.ending = true;
        if self.framing == Framing::Chunked {
            self.frame.start(Bytes::from_static(b"0\r\n\r\n"), false);
        }
    }

    fn poll<S: AsyncRead + AsyncWrite + Unpin>(
        &mut self,
        cx: &mut Context<'_>,
        stream: &mut S,
        body: &mut Body,
    ) -> Poll<End> {
        loop {
            let mut read = ReadBuf::new(&mut self.discard);
            match Pin::new(&mut *stream).poll_read(cx, &mut read) {
                Poll::Ready(Ok(())) if !read.filled().is_empty() => continue,
                Poll::Ready(_) => return Poll::Ready(End::Gone),
                Poll::Pending => break,
            }
        }
        loop {
            if self.frame.in_flight {
                match self.frame.poll_write(cx, stream) {
                    Poll::Ready(Ok(())) => self.stall = None,
                    Poll::Ready(Err(_)) => return Poll::Ready(End::Gone),
                    Poll::Pending => {
                        let after = self.stall_after;
                        let stall = self
                            .stall
                            .get_or_insert_with(|| Box::pin(tokio::time::sleep(after)));
                        if stall.as_mut().poll(cx).is_ready() {
                            tracing::debug!("a client took no event frame for the stall timeout");
                            return Poll::Ready(End::Gone);
                        }
                        return Poll::Pending;
                    }
                }
            }
            if self.ending {
                return Poll::Ready(End::Done);
            }
            match std::task::ready!(Pin::new(&mut *body).poll_frame(cx)) {
                None => self.end(),
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) if !data.is_empty() => {
                        self.frame.start(data, self.framing == Framing::Chunked);
                    }
                    // Empty frames and trailers: nothing to send.
                    _ => {}
                },
                Some(Err(error)) => {
                    tracing::debug!(%error, "response body failed");
                    return Poll::Ready(End::Gone);
                }
            }
        }
    }
}

/// The body frame being written: its chunk size line, its data and the
/// chunk's CRLF, each advanced past what the socket took.
#[derive(Debug, Default)]
struct Outgoing {
    line: [u8; CHUNK_SIZE_LINE],
    line_at: u8,
    line_end: u8,
    data: Bytes,
    /// Bytes of the chunk's closing CRLF still to write.
    crlf: u8,
    /// Until written and flushed.
    in_flight: bool,
}

impl Outgoing {
    /// `data` in flight, as a chunk when `chunked`.
    fn start(&mut self, data: Bytes, chunked: bool) {
        if chunked {
            let end = chunk_size_line(data.len(), &mut self.line).len();
            self.line_end = u8::try_from(end).unwrap_or(u8::MAX);
            self.crlf = 2;
        } else {
            self.line_end = 0;
            self.crlf = 0;
        }
        self.line_at = 0;
        self.data = data;
        self.in_flight = true;
    }

    /// Writes what is left, then flushes (TLS keeps what the socket did not
    /// take).
    fn poll_write<S: AsyncWrite + Unpin>(
        &mut self,
        cx: &mut Context<'_>,
        stream: &mut S,
    ) -> Poll<io::Result<()>> {
        loop {
            let line = &self.line[usize::from(self.line_at)..usize::from(self.line_end)];
            let crlf = &b"\r\n"[2 - usize::from(self.crlf)..];
            if line.is_empty() && self.data.is_empty() && crlf.is_empty() {
                break;
            }
            let slices = [
                IoSlice::new(line),
                IoSlice::new(&self.data),
                IoSlice::new(crlf),
            ];
            let written =
                std::task::ready!(Pin::new(&mut *stream).poll_write_vectored(cx, &slices))?;
            if written == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.consume(written);
        }
        std::task::ready!(Pin::new(&mut *stream).poll_flush(cx))?;
        // The written frame's buffer is not kept for the stream's quiet time.
        self.data = Bytes::new();
        self.in_flight = false;
        Poll::Ready(Ok(()))
    }

    fn consume(&mut self, mut written: usize) {
        let line = usize::from(self.line_end - self.line_at).min(written);
        self.line_at += u8::try_from(line).unwrap_or(u8::MAX);
        written -= line;
        let data = self.data.len().min(written);
        self.data.advance(data);
        written -= data;
        self.crlf -= u8::try_from(written.min(usize::from(self.crlf))).unwrap_or(0);
    }
}

/// The request out of its box, the box freed now (a `*boxed` moved out
/// of frees the box only where the binding's scope ends).
fn unbox(request: Box<Request<Body>>) -> Request<Body> {
    *request
}

/// How the body's end is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    Length(u64),
    Chunked,
    /// HTTP/1.0 has no chunks: the close ends the body.
    UntilClose,
}

fn encode_head(parts: &axum::http::response::Parts, framing: Framing) -> Vec<u8> {
    let status = parts.status;
    let mut head = Vec::with_capacity(256);
    head.extend_from_slice(b"HTTP/1.1 ");
    head.extend_from_slice(status.as_str().as_bytes());
    head.push(b' ');
    head.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    head.extend_from_slice(b"\r\n");
    for (name, value) in &parts.headers {
        // Framing and connection are this module's to say.
        if name == header::CONTENT_LENGTH
            || name == header::TRANSFER_ENCODING
            || name == header::CONNECTION
        {
            continue;
        }
        field(&mut head, name.as_str(), value.as_bytes());
    }
    if !parts.headers.contains_key(header::DATE) {
        let date = httpdate::fmt_http_date(SystemTime::now());
        field(&mut head, "date", date.as_bytes());
    }
    match framing {
        Framing::Length(length) => {
            field(&mut head, "content-length", length.to_string().as_bytes())
        }
        Framing::Chunked => field(&mut head, "transfer-encoding", b"chunked"),
        Framing::UntilClose => {}
    }
    field(&mut head, "connection", b"close");
    head.extend_from_slice(b"\r\n");
    head
}

fn field(head: &mut Vec<u8>, name: &str, value: &[u8]) {
    head.extend_from_slice(name.as_bytes());
    head.extend_from_slice(b": ");
    head.extend_from_slice(value);
    head.extend_from_slice(b"\r\n");
}

/// Room for a chunk's size line: 16 hex digits and CRLF.
const CHUNK_SIZE_LINE: usize = 18;

/// `{length:x}\r\n`, written into `line` (no allocation per frame).
fn chunk_size_line(length: usize, line: &mut [u8; CHUNK_SIZE_LINE]) -> &[u8] {
    use std::io::Write as _;
    let mut cursor = io::Cursor::new(&mut line[..]);
    // 16 hex digits hold any usize on 64-bit targets.
    let _ = write!(cursor, "{length:x}\r\n");
    let end = usize::try_from(cursor.position()).unwrap_or(CHUNK_SIZE_LINE);
    &line[..end]
}

/// A connection whose first bytes were already read: reads return those
/// bytes first, then the socket's. Writes go straight to the socket.
#[derive(Debug)]
pub struct Prefixed<I> {
    prefix: BytesMut,
    io: I,
}

impl<I> Prefixed<I> {
    /// `io`, whose first bytes `prefix` were read from it.
    pub fn new(prefix: BytesMut, io: I) -> Self {
        Self { prefix, io }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for Prefixed<I> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.prefix.is_empty() {
            return Pin::new(&mut this.io).poll_read(cx, buf);
        }
        let n = this.prefix.len().min(buf.remaining());
        buf.put_slice(&this.prefix[..n]);
        this.prefix.advance(n);
        if this.prefix.is_empty() {
            // Free the buffer for the connection's remaining life.
            this.prefix = BytesMut::new();
        }
        Poll::Ready(Ok(()))
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Prefixed<I> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: usize = 64 * 1024;

    /// Runs a [`Pump`] of `head` and `body` on `stream` to its end.
    async fn pump(
        stream: &mut (impl AsyncRead + AsyncWrite + Unpin),
        head: &'static [u8],
        mut body: Body,
        framing: Framing,
        stall_after: Duration,
    ) -> End {
        let mut pump = Pump::new(Bytes::from_static(head), framing, stall_after);
        std::future::poll_fn(|cx| pump.poll(cx, stream, &mut body)).await
    }

    /// A client that reads a byte every 10 ms makes progress on every
    /// write, yet would take a second for this 100-byte frame: the frame as
    /// a whole must be written within the stall timeout.
    #[tokio::test]
    async fn a_reader_that_trickles_trips_the_stall_timeout() {
        let (mut writer, mut reader) = tokio::io::duplex(1);
        let trickle = tokio::spawn(async move {
            let mut byte = [0u8; 1];
            while let Ok(1) = reader.read(&mut byte).await {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
        let started = Instant::now();
        let end = pump(
            &mut writer,
            &[b'x'; 100],
            Body::empty(),
            Framing::Length(0),
            Duration::from_millis(200),
        )
        .await;
        assert_eq!(end, End::Gone);
        assert!(started.elapsed() < Duration::from_millis(900));
        trickle.abort();
    }

    /// The head, each frame as a chunk, the last chunk; written through a
    /// pipe of 7 bytes, so every piece is cut somewhere.
    #[tokio::test]
    async fn frames_are_written_whole_in_their_framing() {
        let (mut writer, mut reader) = tokio::io::duplex(7);
        let read = tokio::spawn(async move {
            let mut all = Vec::new();
            reader.read_to_end(&mut all).await.map(|_| all)
        });
        let frames = futures_util::stream::iter(
            ["data: a\n\n", "", "data: bcdefghijklmnopq\n\n"]
                .map(|frame| Ok::<_, io::Error>(Bytes::from_static(frame.as_bytes()))),
        );
        let body = Body::from_stream(frames);
        let end = pump(
            &mut writer,
            b"HEAD\r\n\r\n",
            body,
            Framing::Chunked,
            Duration::from_secs(5),
        )
        .await;
        assert_eq!(end, End::Done);
        drop(writer);
        let written = read.await.unwrap().unwrap();
        assert_eq!(
            String::from_utf8(written).unwrap(),
            "HEAD\r\n\r\n9\r\ndata: a\n\n\r\n18\r\ndata: bcdefghijklmnopq\n\n\r\n0\r\n\r\n"
        );
    }

    /// A client that closes its side ends the stream at once, without the
    /// body's end: the body is never read again.
    #[tokio::test]
    async fn a_client_that_closes_ends_the_stream() {
        let (mut writer, reader) = tokio::io::duplex(1024);
        drop(reader);
        let body = Body::from_stream(futures_util::stream::pending::<Result<Bytes, io::Error>>());
        let end = tokio::time::timeout(
            Duration::from_secs(5),
            pump(
                &mut writer,
                b"",
                body,
                Framing::Chunked,
                Duration::from_secs(5),
            ),
        )
        .await;
        assert_eq!(end.ok(), Some(End::Gone));
    }

    fn classify_all(bytes: &[u8]) -> Head {
        classify(bytes, 0, MAX)
    }

    /// Asserts that `bytes`, seen whole, classify as `expected` says.
    fn assert_classified(bytes: &[u8], expected: fn(&Head) -> bool) {
        assert!(
            expected(&classify_all(bytes)),
            "{:?} classified as {:?}",
            String::from_utf8_lossy(bytes),
            classify_all(bytes)
        );
    }

    #[test]
    fn a_plain_stream_request_is_served_here() {
        for path in [
            "/watch/a",
            "/watch?key=a&key=b",
            "/watch",
            "/watch/%2Fx",
            "/subscribe?topic=orders%2F%23",
            "/subscribe?topic=a&access_token=t",
        ] {
            let head =
                format!("GET {path} HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n");
            let Head::Stream(request) = classify_all(head.as_bytes()) else {
                panic!("{path} not served here");
            };
            assert_eq!(request.uri().to_string(), path);
            assert_eq!(request.version(), Version::HTTP_11);
            assert_eq!(request.headers()["accept"], "text/event-stream");
        }
        let Head::Stream(request) = classify_all(b"GET /watch/a HTTP/1.0\r\n\r\n") else {
            panic!("HTTP/1.0 not served here");
        };
        assert_eq!(request.version(), Version::HTTP_10);
    }

    #[test]
    fn everything_else_goes_to_hyper() {
        for head in [
            &b"PUT /keys/a HTTP/1.1\r\n\r\n"[..],
            b"POST /watch/a HTTP/1.1\r\n\r\n",
            b"HEAD /watch/a HTTP/1.1\r\n\r\n",
            b"GET /watchers HTTP/1.1\r\n\r\n",
            b"GET /subscribers HTTP/1.1\r\n\r\n",
            b"POST /subscribe?topic=a HTTP/1.1\r\n\r\n",
            b"GET /subscribe?topic=a HTTP/1.1\r\nContent-Length: 1\r\n\r\nx",
            b"GET /keys/a HTTP/1.1\r\n\r\n",
            b"get /watch/a HTTP/1.1\r\n\r\n",
            b"GET /watch/a HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc",
            b"GET /watch/a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"GET /watch/a HTTP/1.1\r\nUpgrade: websocket\r\n\r\n",
            b"GET /watch/a HTTP/1.1\r\nBad Header\r\n\r\n",
            b"GET /watch/a HTTP/2.0\r\n\r\n",
            b"\x16\x03\x01\x02\x00",
        ] {
            assert_classified(head, |head| matches!(head, Head::Other));
        }
        let many = format!(
            "GET /watch/a HTTP/1.1\r\n{}\r\n",
            "X-A: b\r\n".repeat(MAX_HEADERS + 1)
        );
        assert!(matches!(classify_all(many.as_bytes()), Head::Other));
    }

    #[test]
    fn a_head_in_pieces_waits_for_its_end() {
        for partial in [
            &b""[..],
            b"G",
            b"GET /wat",
            b"GET /",
            b"GET /subsc",
            b"GET /subscribe?topic=a HTTP/1.1\r\n",
            b"GET /watch/a HTTP/1.1\r\nHost: x\r\n",
        ] {
            assert_classified(partial, |head| matches!(head, Head::Incomplete));
        }
        // No new line feed since the last look: no parse.
        let head = b"GET /watch/a HTTP/1.1\r\nHost: x\r\n\r\n";
        assert!(matches!(classify(head, head.len(), MAX), Head::Incomplete));
        assert!(matches!(
            classify(head, head.len() - 1, MAX),
            Head::Stream(_)
        ));
    }

    #[test]
    fn the_http2_preface_goes_to_http2_once_whole() {
        assert!(matches!(classify_all(HTTP2_PREFACE), Head::Http2));
        let mut more = HTTP2_PREFACE.to_vec();
        more.extend_from_slice(b"\0\0\0\x04\0\0\0\0\0");
        assert!(matches!(classify_all(&more), Head::Http2));
        for partial in [&b"P"[..], b"PRI * HTTP/2.0\r\n", &HTTP2_PREFACE[..23]] {
            assert!(matches!(classify_all(partial), Head::Incomplete));
        }
        assert!(matches!(classify_all(b"PRI * HTTP/1.1\r\n"), Head::Other));
        assert!(matches!(classify_all(b"POST /batch"), Head::Other));
    }

    #[test]
    fn an_oversized_head_goes_to_hyper_for_its_431() {
        let head = format!("GET /watch/a HTTP/1.1\r\nX-Big: {}", "a".repeat(2048));
        assert!(matches!(classify(head.as_bytes(), 0, 1024), Head::Other));
    }

    #[test]
    fn the_head_says_how_the_body_ends_and_that_the_connection_closes() {
        let response = axum::http::Response::builder()
            .status(429)
            .header("content-type", "application/problem+json")
            .header("content-length", "999")
            .header("connection", "keep-alive")
            .body(())
            .unwrap();
        let (parts, ()) = response.into_parts();
        let head = String::from_utf8(encode_head(&parts, Framing::Length(12))).unwrap();
        assert!(
            head.starts_with("HTTP/1.1 429 Too Many Requests\r\n"),
            "{head}"
        );
        assert!(head.contains("content-type: application/problem+json\r\n"));
        assert!(head.contains("content-length: 12\r\n"));
        assert!(
            !head.contains("999") && !head.contains("keep-alive"),
            "{head}"
        );
        assert!(head.contains("\r\ndate: "));
        assert!(head.ends_with("connection: close\r\n\r\n"));
        let chunked = String::from_utf8(encode_head(&parts, Framing::Chunked)).unwrap();
        assert!(chunked.contains("transfer-encoding: chunked\r\n"));
        assert!(!chunked.contains("content-length"));
        let mut line = [0u8; CHUNK_SIZE_LINE];
        assert_eq!(chunk_size_line(300, &mut line), b"12c\r\n");
        assert_eq!(
            chunk_size_line(usize::MAX, &mut line).len(),
            CHUNK_SIZE_LINE
        );
    }
}
