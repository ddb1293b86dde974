//! `GET /watch/{key}` and `GET /watch?key=a&key=b&match=sensor/*`: key
//! changes as Server-Sent Events, from the
//! [`WatchHub`](crate::watch::WatchHub); `match` follows every key matching
//! a glob (`listed` once a pattern's initial `sync`s are all out).
//!
//! Each event's `id:` is the key's version, so a reconnecting `EventSource`
//! sends it back as `Last-Event-ID` and, on a single-key stream, gets a
//! `sync` only if the key changed meanwhile.

use std::convert::Infallible;
use std::fmt::Write as _;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderName, HeaderValue, header};
use axum::response::Response;
use axum::routing::get;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;
use http_body::Frame;
use tokio::time::{Instant, Sleep};

use super::extract::{Key, LastEventId, Query, decode_key};
use super::keys::method_not_allowed;
use crate::access::rules::{Access, Need};
use crate::http::problem::ApiError;
use crate::http::state::AppState;
use crate::protocol::Hlc;
use crate::watch::{EventKind, KeyEvent, Selection, WatchError, WatchedValue, Watcher};

/// The first frame of every stream: how long (ms) a browser waits before
/// reconnecting a dropped stream.
const RETRY_FRAME: &[u8] = b"retry: 2000\n\n";

/// Sent when a stream has been quiet for the keep-alive interval, so
/// proxies and load balancers do not close it as idle.
const KEEP_ALIVE_FRAME: &[u8] = b": keep-alive\n\n";

/// The watch routes: their GETs are requests that
/// `transport::stream_request` recognises as stream requests.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/watch", get(watch_query).fallback(method_not_allowed))
        .route("/watch/", get(empty_key).fallback(method_not_allowed))
        .route(
            "/watch/{*key}",
            get(watch_path).fallback(method_not_allowed),
        )
}

/// `GET /watch/{key}`: unknown query parameters are refused, as for
/// every route; the API token is the one it takes.
async fn watch_path(
    State(state): State<AppState>,
    Key(key): Key,
    access: Access,
    query: Query,
    LastEventId(last_version): LastEventId,
) -> Result<Response, ApiError> {
    query.accept(&[ACCESS_TOKEN_PARAMETER])?;
    let selection = Selection::of_keys([key], state.hub.settings().max_keys_per_stream)?;
    start(&state, &access, selection, last_version).await
}

/// `GET /watch/`: the empty key, refused as `/keys/` refuses it.
async fn empty_key() -> ApiError {
    ApiError::EmptyKey
}

/// The query parameter that may carry the API token on watch requests
/// (see `query_token` in the HTTP guard); not a key.
pub const ACCESS_TOKEN_PARAMETER: &str = "access_token";

/// `GET /watch?key=a&key=b&match=sensor/*`
async fn watch_query(
    State(state): State<AppState>,
    access: Access,
    query: Query,
    LastEventId(last_version): LastEventId,
) -> Result<Response, ApiError> {
    // Refused as the names come rather than after decoding an unbounded list.
    let mut selection = Selection::new(state.hub.settings().max_keys_per_stream);
    // `key` and `match` are repeated: not for `Query::accept`.
    for (name, value) in query.pairs() {
        match name {
            ACCESS_TOKEN_PARAMETER => continue,
            "key" => {
                let key = decode_key(value, true, state.limits.max_key_bytes)?;
                access.require(&key, Need::Read)?;
                selection.add_key(key)?;
            }
            "match" => {
                selection.add_pattern(decode_pattern(value, state.limits.max_key_bytes)?)?;
            }
            _ => {
                return Err(ApiError::BadQuery(format!(
                    "unknown query parameter {name:?}; use key=<name> once per key, match=<glob> once per pattern"
                )));
            }
        }
    }
    start(&state, &access, selection, last_version).await
}

/// A `match` value: the listing's glob, form-decoded; not empty, at most
/// as long as a key.
fn decode_pattern(raw: &str, max_key_bytes: usize) -> Result<Bytes, ApiError> {
    if raw.is_empty() {
        return Err(ApiError::BadQuery(
            "match is empty: give a glob such as sensor/*".into(),
        ));
    }
    match decode_key(raw, true, max_key_bytes) {
        Err(ApiError::KeyTooLong { len, max }) => Err(ApiError::BadQuery(format!(
            "match is {len} bytes long; the limit is {max} bytes"
        ))),
        decoded => decoded,
    }
}

/// Starts the stream of the selection's keys (each already allowed to the
/// caller) and patterns (whose keys the caller may read, under the rules
/// of the moment).
async fn start(
    state: &AppState,
    access: &Access,
    selection: Selection,
    last_version: Option<Hlc>,
) -> Result<Response, ApiError> {
    if state.is_draining() {
        return Err(ApiError::Watch(WatchError::ShuttingDown));
    }
    let readable = access.live_read_filter();
    let watcher = state.hub.follow(selection, last_version, readable).await?;
    let mut response = Response::new(Body::new(WatchBody::new(watcher)));
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(
        HeaderName::from_static("x-accel-buffering"),
        HeaderValue::from_static("no"),
    );
    Ok(response)
}

pin_project_lite::pin_project! {
    /// The stream's bytes: `retry:` once, then each event's frame, and a
    /// keep-alive comment when nothing was sent for a whole `keep_alive`
    /// period (so at least one write every two periods). Each frame is one
    /// `Bytes` that every watcher of the key shares: a fan-out copies
    /// nothing per watcher, and the timer is not touched per event. The
    /// body holds the watcher and its timer itself, and no future: a
    /// stream costs what it keeps, 10,000 times over in a fan-out.
    struct WatchBody {
        watcher: Watcher,
        #[pin]
        keep_alive: Sleep,
        started: bool,
        // Whether an event was sent since the timer last fired.
        sent: bool,
    }
}

impl WatchBody {
    fn new(watcher: Watcher) -> Self {
        Self {
            keep_alive: tokio::time::sleep(watcher.keep_alive()),
            watcher,
            started: false,
            sent: false,
        }
    }
}

impl http_body::Body for WatchBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let mut this = self.project();
        if !*this.started {
            *this.started = true;
            return Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(RETRY_FRAME)))));
        }
        // Events first: a busy stream never waits on its timer.
        match this.watcher.poll_next(cx) {
            Poll::Ready(Some(event)) => {
                *this.sent = true;
                return Poll::Ready(Some(Ok(Frame::data(sse_frame(&event)))));
            }
            Poll::Ready(None) => return Poll::Ready(None),
            Poll::Pending => {}
        }
        loop {
            std::task::ready!(this.keep_alive.as_mut().poll(cx));
            // The next period starts now, however late this one fired.
            let period = this.watcher.keep_alive();
            this.keep_alive.as_mut().reset(Instant::now() + period);
            if !std::mem::take(this.sent) {
                return Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(KEEP_ALIVE_FRAME)))));
            }
        }
    }
}

/// The SSE frame of an event (`event:`, `id:`, one `data:` line
/// of JSON), rendered by the first watcher that sends it and shared by the
/// others: 10,000 watchers, one serialisation.
fn sse_frame(event: &KeyEvent) -> Bytes {
    event
        .rendered
        .get_or_init(|| {
            let json = event_json(event);
            let mut frame = String::with_capacity(json.len() + 64);
            // Writing to a String cannot fail.
            let _ = writeln!(frame, "event: {}", event_name(event.kind));
            if let Some(id) = &event.id {
                let _ = writeln!(frame, "id: {id}");
            }
            // Compact JSON has no line breaks: one `data:` line.
            let _ = write!(frame, "data: {json}\n\n");
            Bytes::from(frame)
        })
        .clone()
}

/// The SSE `event:` name, also the JSON `op`.
fn event_name(kind: EventKind) -> &'static str {
    match kind {
        EventKind::Sync { .. } => "sync",
        EventKind::Set => "set",
        EventKind::Delete => "delete",
        EventKind::Error | EventKind::PatternError => "error",
        EventKind::Listed { .. } => "listed",
    }
}

/// `{"key", "op", "version", "value", "value_base64", ...}`: text fields
/// are `null` when the bytes are not UTF-8, the base64 fields always hold
/// the exact bytes.
fn event_json(event: &KeyEvent) -> String {
    let mut data = serde_json::Map::new();
    // A pattern's own events name the pattern, not a key.
    if let EventKind::Listed { .. } | EventKind::PatternError = event.kind {
        match std::str::from_utf8(&event.key) {
            Ok(pattern) => data.insert("match".into(), pattern.into()),
            Err(_) => {
                data.insert("match".into(), serde_json::Value::Null);
                data.insert("match_base64".into(), BASE64.encode(&event.key).into())
            }
        };
        if let EventKind::Listed { keys } = event.kind {
            data.insert("keys".into(), keys.into());
        } else {
            data.insert("op".into(), "error".into());
            data.insert(
                "error".into(),
                event.error.clone().unwrap_or_default().into(),
            );
        }
        return serde_json::Value::Object(data).to_string();
    }
    match std::str::from_utf8(&event.key) {
        Ok(key) => {
            data.insert("key".into(), key.into());
        }
        Err(_) => {
            data.insert("key".into(), serde_json::Value::Null);
            data.insert("key_base64".into(), BASE64.encode(&event.key).into());
        }
    }
    data.insert("op".into(), event_name(event.kind).into());
    data.insert(
        "version".into(),
        event
            .version
            .as_ref()
            .map_or(serde_json::Value::Null, |v| v.to_string().into()),
    );
    let value = event.value.as_ref();
    let bytes = value.and_then(WatchedValue::bytes);
    data.insert(
        "value".into(),
        bytes
            .and_then(|v| std::str::from_utf8(v).ok())
            .map_or(serde_json::Value::Null, Into::into),
    );
    data.insert(
        "value_base64".into(),
        bytes.map_or(serde_json::Value::Null, |v| BASE64.encode(v).into()),
    );
    if let Some(WatchedValue::Omitted(length)) = value {
        data.insert("value_omitted".into(), true.into());
        data.insert("value_bytes".into(), (*length).into());
    }
    match event.kind {
        EventKind::Sync { resync, lagged } => {
            data.insert("exists".into(), value.is_some().into());
            data.insert("resync".into(), resync.into());
            if lagged {
                data.insert("lagged".into(), true.into());
            }
        }
        EventKind::Error => {
            data.insert(
                "error".into(),
                event.error.clone().unwrap_or_default().into(),
            );
        }
        EventKind::Set | EventKind::Delete | EventKind::Listed { .. } | EventKind::PatternError => {
        }
    }
    serde_json::Value::Object(data).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(kind: EventKind, key: &[u8], value: Option<&[u8]>) -> KeyEvent {
        KeyEvent::new(
            kind,
            Bytes::copy_from_slice(key),
            value.map(|v| Bytes::copy_from_slice(v).into()),
            Some(Hlc::new(1_700_000_000_000, "StateStore")),
            Some(Hlc::new(1_700_000_000_000, "StateStore")),
        )
    }

    fn json(event: &KeyEvent) -> serde_json::Value {
        serde_json::from_str(&event_json(event)).unwrap()
    }

    #[test]
    fn an_event_is_one_sse_frame_rendered_once() {
        let event = event(EventKind::Set, b"k", Some(b"line1\nline2"));
        let frame = sse_frame(&event);
        let text = std::str::from_utf8(&frame).unwrap();
        let data = text
            .strip_prefix("event: set\nid: 001700000000000:00000:StateStore\ndata: ")
            .and_then(|rest| rest.strip_suffix("\n\n"))
            .expect(text);
        assert!(!data.contains('\n'), "one data line: {text:?}");
        assert_eq!(
            json(&event),
            serde_json::from_str::<serde_json::Value>(data).unwrap()
        );
        // The second watcher gets the same bytes, not a copy.
        assert_eq!(sse_frame(&event).as_ptr(), frame.as_ptr());
    }

    #[test]
    fn an_event_without_id_has_no_id_line() {
        let mut absent = event(EventKind::Delete, b"k", None);
        absent.version = None;
        absent.id = None;
        let frame = sse_frame(&absent);
        assert!(frame.starts_with(b"event: delete\ndata: {"), "{frame:?}");
    }

    #[test]
    fn set_event_has_text_and_base64() {
        let data = json(&event(EventKind::Set, b"k", Some(b"hi")));
        assert_eq!(
            data,
            serde_json::json!({
                "key": "k", "op": "set", "version": "001700000000000:00000:StateStore",
                "value": "hi", "value_base64": "aGk="
            })
        );
    }

    #[test]
    fn binary_key_and_value_are_base64_only() {
        let data = json(&event(EventKind::Set, &[0xff, 0], Some(&[0xfe])));
        assert_eq!(data["key"], serde_json::Value::Null);
        assert_eq!(data["key_base64"], "/wA=");
        assert_eq!(data["value"], serde_json::Value::Null);
        assert_eq!(data["value_base64"], "/g==");
    }

    #[test]
    fn sync_of_an_absent_key_says_so() {
        let mut absent = event(
            EventKind::Sync {
                resync: true,
                lagged: false,
            },
            b"k",
            None,
        );
        absent.version = None;
        let data = json(&absent);
        assert_eq!(data["exists"], false);
        assert_eq!(data["resync"], true);
        assert_eq!(data["version"], serde_json::Value::Null);
        assert_eq!(data["value_base64"], serde_json::Value::Null);
        assert!(data.get("lagged").is_none());
    }

    #[test]
    fn pattern_events_name_the_pattern() {
        let mut listed = event(EventKind::Listed { keys: 3 }, b"sensor/*", None);
        listed.id = None;
        assert_eq!(
            json(&listed),
            serde_json::json!({"match": "sensor/*", "keys": 3})
        );
        assert!(sse_frame(&listed).starts_with(b"event: listed\ndata: {"));
        let mut refused = event(EventKind::PatternError, b"\xff*", None);
        refused.id = None;
        refused.error = Some("too many".into());
        assert_eq!(
            json(&refused),
            serde_json::json!({"match": null, "match_base64": "/yo=", "op": "error", "error": "too many"})
        );
        assert!(sse_frame(&refused).starts_with(b"event: error\ndata: {"));
    }

    #[test]
    fn a_value_over_the_event_limit_is_left_out_with_its_length() {
        let large = vec![b'a'; crate::watch::MAX_EVENT_VALUE_BYTES + 1];
        let data = json(&event(EventKind::Set, b"k", Some(&large)));
        assert_eq!(data["value"], serde_json::Value::Null);
        assert_eq!(data["value_base64"], serde_json::Value::Null);
        assert_eq!(data["value_omitted"], true);
        assert_eq!(data["value_bytes"], large.len());
        let at_limit = &large[1..];
        let data = json(&event(EventKind::Set, b"k", Some(at_limit)));
        assert_eq!(data["value"].as_str().map(str::len), Some(at_limit.len()));
        assert!(data.get("value_omitted").is_none());
    }

    #[test]
    fn delete_event_carries_its_version() {
        let data = json(&event(EventKind::Delete, b"k", None));
        assert_eq!(data["op"], "delete");
        assert_eq!(data["version"], "001700000000000:00000:StateStore");
    }
}
