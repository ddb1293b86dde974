//! A minimal Server-Sent Events reader over a real HTTP connection.

use std::time::Duration;

use futures_util::StreamExt as _;

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

impl SseStream {
    /// The next event within `within`, or `None` if none came (or the stream ended).
    pub async fn next(&mut self, within: Duration) -> Option<SseEvent> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(end) = find_blank_line(&self.buffer) {
                let block: Vec<u8> = self.buffer.drain(..end.1).collect();
                if let Some(event) = self.parse(&block[..end.0]) {
                    return Some(event);
                }
                continue;
            }
            let chunk = tokio::time::timeout_at(deadline, self.body.next())
                .await
                .ok()??;
            self.buffer.extend_from_slice(&chunk.ok()?);
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

    /// Asserts that no event arrives within `within`.
    pub async fn expect_silence(&mut self, within: Duration) {
        if let Some(event) = self.next(within).await {
            panic!("unexpected event {event:?}");
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
