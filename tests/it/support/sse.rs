//! A minimal Server-Sent Events reader over a real HTTP connection.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::{Buf as _, Bytes, BytesMut};
use futures_util::StreamExt as _;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// One event as the browser's `EventSource` would see it.
#[derive(Debug, Clone)]
pub struct SseEvent {
    /// `event:` (default `message`).
    pub event: String,
    /// `id:`, if the event set one.
    pub id: Option<String>,
    /// `data:` parsed as JSON.
    pub data: serde_json::Value,
}

/// An open stream.
pub struct SseStream {
    body: futures_util::stream::BoxStream<'static, reqwest::Result<bytes::Bytes>>,
    buffer: Vec<u8>,
    /// `retry:` values seen.
    pub retries: Vec<u64>,
    /// Comment lines seen (keep-alives).
    pub comments: usize,
    /// The response headers.
    pub headers: reqwest::header::HeaderMap,
}

impl std::fmt::Debug for SseStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SseStream").finish_non_exhaustive()
    }
}

/// Opens `url`; `Err` carries the status and body of a non-200 answer.
pub async fn open(
    client: &reqwest::Client,
    url: &str,
    last_event_id: Option<&str>,
) -> Result<SseStream, (u16, reqwest::header::HeaderMap, String)> {
    let mut request = client.get(url).header("accept", "text/event-stream");
    if let Some(id) = last_event_id {
        request = request.header("last-event-id", id);
    }
    let response = tokio::time::timeout(Duration::from_secs(15), request.send())
        .await
        .expect("the watch answers within 15 s")
        .expect("the watch request is sent");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    if status != 200 {
        let body = response.text().await.unwrap_or_default();
        return Err((status, headers, body));
    }
    Ok(SseStream {
        body: response.bytes_stream().boxed(),
        buffer: Vec::new(),
        retries: Vec::new(),
        comments: 0,
        headers,
    })
}

/// A response read off the wire by [`open_raw`].
#[derive(Debug)]
pub struct RawResponse {
    /// The status code.
    pub status: u16,
    /// The head exactly as sent (status line and header lines).
    pub head: String,
    /// The body so far, for answers that are not a stream.
    pub stream: SseStream,
}

/// Sends `requests` (one or more raw HTTP/1 requests) on a new connection
/// to `addr` and reads the response to the last of them by hand: chunked
/// bodies are decoded strictly, any other body is read until the close.
/// Earlier responses (keep-alive, `content-length` framed) are skipped.
pub async fn open_raw(addr: SocketAddr, requests: &[&str]) -> RawResponse {
    let mut tcp = TcpStream::connect(addr).await.expect("connect");
    let mut buffer = BytesMut::new();
    let (last, earlier) = requests.split_last().expect("a request");
    for request in earlier {
        tcp.write_all(request.as_bytes())
            .await
            .expect("send the request");
        let (_, head) = read_head(&mut tcp, &mut buffer).await;
        let length = header(&head, "content-length").expect("a keep-alive answer has a length");
        let length: usize = length.parse().expect("numeric content-length");
        fill(&mut tcp, &mut buffer, length).await;
        buffer.advance(length);
    }
    tcp.write_all(last.as_bytes())
        .await
        .expect("send the request");
    let (status, head) = read_head(&mut tcp, &mut buffer).await;
    let mut headers = reqwest::header::HeaderMap::new();
    for line in head.lines().skip(1) {
        let (name, value) = line.split_once(':').expect("a header line");
        headers.append(
            reqwest::header::HeaderName::from_bytes(name.trim().as_bytes()).expect("header name"),
            value.trim().parse().expect("header value"),
        );
    }
    let chunked = header(&head, "transfer-encoding").as_deref() == Some("chunked");
    let body = futures_util::stream::unfold(
        (tcp, buffer, chunked, false),
        |(mut tcp, mut buffer, chunked, ended)| async move {
            if ended {
                return None;
            }
            if !chunked {
                if buffer.is_empty() && tcp.read_buf(&mut buffer).await.ok()? == 0 {
                    return None;
                }
                let data = buffer.split().freeze();
                return Some((Ok(data), (tcp, buffer, chunked, false)));
            }
            let line = read_line(&mut tcp, &mut buffer).await?;
            let size = usize::from_str_radix(&line, 16).expect("hex chunk size");
            fill(&mut tcp, &mut buffer, size + 2).await;
            let data = buffer.split_to(size).freeze();
            assert_eq!(&buffer[..2], b"\r\n", "a chunk ends with CRLF");
            buffer.advance(2);
            if size == 0 {
                return Some((Ok(Bytes::new()), (tcp, buffer, chunked, true)));
            }
            Some((Ok(data), (tcp, buffer, chunked, false)))
        },
    );
    RawResponse {
        status,
        head,
        stream: SseStream {
            body: body.boxed(),
            buffer: Vec::new(),
            retries: Vec::new(),
            comments: 0,
            headers,
        },
    }
}

fn header(head: &str, name: &str) -> Option<String> {
    head.lines().skip(1).find_map(|line| {
        let (field, value) = line.split_once(':')?;
        field
            .trim()
            .eq_ignore_ascii_case(name)
            .then(|| value.trim().to_owned())
    })
}

/// Reads until `buffer` holds at least `len` bytes.
async fn fill(tcp: &mut TcpStream, buffer: &mut BytesMut, len: usize) {
    while buffer.len() < len {
        let read = tokio::time::timeout(Duration::from_secs(15), tcp.read_buf(buffer))
            .await
            .expect("bytes within 15 s")
            .expect("read");
        assert!(read > 0, "closed with {} of {len} bytes", buffer.len());
    }
}

/// One CRLF-terminated line, without the CRLF; `None` at a clean close.
async fn read_line(tcp: &mut TcpStream, buffer: &mut BytesMut) -> Option<String> {
    loop {
        if let Some(at) = buffer.windows(2).position(|pair| pair == b"\r\n") {
            let line = buffer.split_to(at);
            buffer.advance(2);
            return Some(String::from_utf8(line.to_vec()).expect("ASCII line"));
        }
        let read = tokio::time::timeout(Duration::from_secs(15), tcp.read_buf(buffer))
            .await
            .ok()?
            .ok()?;
        if read == 0 {
            assert!(buffer.is_empty(), "closed in the middle of a chunk");
            return None;
        }
    }
}

/// The status and head of the next response.
async fn read_head(tcp: &mut TcpStream, buffer: &mut BytesMut) -> (u16, String) {
    let mut head = Vec::new();
    loop {
        let line = read_line(tcp, buffer).await.expect("a complete head");
        if line.is_empty() {
            break;
        }
        head.push(line);
    }
    let status = head[0]
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .expect("a status line");
    (status, head.join("\n"))
}

/// What a stream did within a wait.
enum Next {
    Event(SseEvent),
    Quiet,
    Ended(String),
}

impl SseStream {
    /// The body's remaining bytes as text, until it ends (for error answers).
    pub async fn text(&mut self) -> String {
        let mut text = String::from_utf8_lossy(&self.buffer).into_owned();
        while let Ok(Some(chunk)) =
            tokio::time::timeout(Duration::from_secs(15), self.body.next()).await
        {
            text.push_str(&String::from_utf8_lossy(&chunk.expect("body bytes")));
        }
        text
    }

    /// Whether a chunked body of [`open_raw`] ends within `within` with its
    /// last chunk (read as an empty item): one cut short ends without it.
    pub async fn ends_with_last_chunk_within(&mut self, within: Duration) -> bool {
        let ending = async {
            let mut last_chunk = false;
            while let Some(item) = self.body.next().await {
                last_chunk = matches!(&item, Ok(chunk) if chunk.is_empty());
            }
            last_chunk
        };
        tokio::time::timeout(within, ending).await.unwrap_or(false)
    }

    /// The next event within `within`, or `None` if none came (or the stream ended).
    pub async fn next(&mut self, within: Duration) -> Option<SseEvent> {
        match self.next_or_end(within).await {
            Next::Event(event) => Some(event),
            Next::Quiet | Next::Ended(_) => None,
        }
    }

    /// The next event within `within`, telling a quiet stream from one that
    /// ended or failed.
    async fn next_or_end(&mut self, within: Duration) -> Next {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(end) = find_blank_line(&self.buffer) {
                let block: Vec<u8> = self.buffer.drain(..end.1).collect();
                if let Some(event) = self.parse(&block[..end.0]) {
                    return Next::Event(event);
                }
                continue;
            }
            match tokio::time::timeout_at(deadline, self.body.next()).await {
                Err(_) => return Next::Quiet,
                Ok(None) => return Next::Ended("the stream ended".into()),
                Ok(Some(Err(error))) => return Next::Ended(format!("the stream failed: {error}")),
                Ok(Some(Ok(chunk))) => self.buffer.extend_from_slice(&chunk),
            }
        }
    }

    /// Waits for the next event and checks its name.
    pub async fn expect(&mut self, event: &str) -> SseEvent {
        let got = self
            .next(Duration::from_secs(10))
            .await
            .unwrap_or_else(|| panic!("no {event} event within 10 s"));
        assert_eq!(got.event, event, "unexpected event {got:?}");
        got
    }

    /// Asserts that the stream stays open and no event arrives within
    /// `within`.
    pub async fn expect_silence(&mut self, within: Duration) {
        match self.next_or_end(within).await {
            Next::Quiet => {}
            Next::Event(event) => panic!("unexpected event {event:?}"),
            Next::Ended(why) => panic!("{why} where it should stay open and quiet"),
        }
    }

    fn parse(&mut self, block: &[u8]) -> Option<SseEvent> {
        let text = String::from_utf8_lossy(block);
        let mut event = String::from("message");
        let mut id = None;
        let mut data = Vec::new();
        for line in text.lines() {
            if line.starts_with(':') {
                self.comments += 1;
                continue;
            }
            let (field, value) = line.split_once(':').unwrap_or((line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            match field {
                "event" => event = value.to_owned(),
                "id" => id = Some(value.to_owned()),
                "data" => data.push(value.to_owned()),
                "retry" => self.retries.push(value.parse().expect("numeric retry")),
                _ => {}
            }
        }
        if data.is_empty() {
            return None;
        }
        let data = serde_json::from_str(&data.join("\n")).expect("event data is JSON");
        Some(SseEvent { event, id, data })
    }
}

/// (end of the block, end of the blank line) for the first `\n\n`.
fn find_blank_line(buffer: &[u8]) -> Option<(usize, usize)> {
    buffer
        .windows(2)
        .position(|pair| pair == b"\n\n")
        .map(|at| (at, at + 2))
}
