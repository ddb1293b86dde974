//! The key listing: `GET /keys?match=<glob>&limit=N&cursor=<next>` onto the
//! store's SCAN.
//!
//! One response holds up to `limit` keys, filled from as many SCAN pages as
//! it takes. Its `next` cursor names the store page it stopped in, how
//! many of that page's keys were already returned and the last of them, so
//! the next response resumes exactly there even when a store page was only
//! partly used (after the last key when it is still in the page, so keys
//! deleted from the page meanwhile shift nothing). The
//! gateway holds one store page and one response at a time, whatever the
//! store's size.
//!
//! With `values=true` each listed key is then read (GET, a bounded number
//! at a time) and its entry carries `value`, `value_base64` and `version`;
//! a key deleted between the SCAN and its GET is left out.

use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use base64::Engine;
use base64::engine::general_purpose::{STANDARD as BASE64, URL_SAFE_NO_PAD as BASE64URL};
use bytes::Bytes;
use futures_util::StreamExt as _;
use futures_util::stream;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use serde::Serialize;
use tokio::time::Instant;

use super::extract::{PrefersText, Query};
use super::headers::set_common_headers;
use super::keys::method_not_allowed;
use super::problem::ApiError;
use super::state::AppState;
use crate::protocol::{Hlc, StoreError};
use crate::store::{RequestError, Versioned};

/// Keys per response when `limit` is not given.
pub const DEFAULT_LIMIT: usize = 1_000;

/// The largest `limit`.
pub const MAX_LIMIT: usize = 10_000;

/// GETs one `values=true` response keeps in flight: a page of 10,000 keys
/// must not take a connection's whole in-flight window.
const CONCURRENT_READS: usize = 32;

/// The listing route. `/keys/` (a trailing slash) stays the empty key.
pub fn routes() -> Router<AppState> {
    Router::new().route("/keys", get(list_keys).fallback(method_not_allowed))
}

/// `GET /keys`: one page of the keys matching `match`.
async fn list_keys(
    State(state): State<AppState>,
    query: Query,
    PrefersText(text): PrefersText,
) -> Result<Response, ApiError> {
    let mut query = query.accept(&["match", "limit", "cursor", "values"])?;
    let values = query.take_bool("values")?;
    if values && text {
        return Err(ApiError::BadQuery(
            "values=true lists JSON entries; ask for Accept: application/json".into(),
        ));
    }
    let pattern = match query.take("match") {
        None => Bytes::from_static(b"*"),
        Some(raw) if raw.is_empty() => {
            return Err(ApiError::BadQuery(
                "match is empty: give a glob such as sensor/* (or leave it out for every key)"
                    .into(),
            ));
        }
        Some(raw) if raw.len() > state.limits.max_key_bytes => {
            return Err(ApiError::BadQuery(format!(
                "match is {} bytes long; the limit is {} bytes",
                raw.len(),
                state.limits.max_key_bytes
            )));
        }
        Some(raw) => Bytes::from(raw),
    };
    let limit = query
        .take("limit")
        .map(|raw| parse_limit(&raw))
        .transpose()?;
    let start = match query.take("cursor") {
        None => Position::default(),
        Some(raw) => Cursor::decode(&raw, &pattern)?,
    };
    // Stop asking the store once this is spent, so that one response
    // stays well inside the request backstop however sparse the matches.
    let budget = state.limits.request_timeout / 2;
    let page = fill(
        &state,
        &pattern,
        start,
        limit.unwrap_or(DEFAULT_LIMIT),
        budget,
    )
    .await?;
    let entries = if values {
        read_values(&state, page.keys).await?
    } else {
        page.keys.into_iter().map(Entry::key_only).collect()
    };
    let listed = Listed {
        entries,
        next: page.next,
    };
    Ok(respond(&pattern, limit, values, listed, text))
}

/// One listed key, with its value and version when they were asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    key: Bytes,
    value: Option<Versioned<Bytes>>,
}

impl Entry {
    fn key_only(key: Bytes) -> Self {
        Self { key, value: None }
    }
}

/// GETs each key, a bounded number at a time, in the listing's order; a
/// key deleted since its SCAN is left out.
async fn read_values(state: &AppState, keys: Vec<Bytes>) -> Result<Vec<Entry>, ApiError> {
    let read = stream::iter(keys)
        .map(|key| async move {
            let value = state.store.get(key.clone()).await?;
            Ok::<_, RequestError>(value.map(|value| Entry {
                key,
                value: Some(value),
            }))
        })
        .buffered(CONCURRENT_READS);
    futures_util::pin_mut!(read);
    let mut entries = Vec::new();
    while let Some(entry) = read.next().await {
        entries.extend(entry?);
    }
    Ok(entries)
}

/// Where a listing stands: the store token of the page it is in (`None`:
/// the first page), how many of that page's keys were returned, and the
/// last of them (`None` when none was).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Position {
    token: Option<Bytes>,
    skip: usize,
    last: Option<Bytes>,
}

/// One response's keys, and where the next response starts (`None`: the
/// listing is complete).
#[derive(Debug, Default)]
struct Page {
    keys: Vec<Bytes>,
    next: Option<Position>,
}

/// One response's entries, and where the next response starts.
#[derive(Debug, Default)]
struct Listed {
    entries: Vec<Entry>,
    next: Option<Position>,
}

/// SCANs from `at` until `limit` keys are in hand, the store has no more,
/// or the `budget` is spent.
async fn fill(
    state: &AppState,
    pattern: &Bytes,
    mut at: Position,
    limit: usize,
    budget: Duration,
) -> Result<Page, ApiError> {
    let deadline = Instant::now() + budget;
    let mut listed = Page::default();
    let mut from_client = at.token.is_some();
    loop {
        let page = state
            .store
            .scan(pattern.clone(), at.token.clone())
            .await
            .map_err(|error| match error {
                // The only token the client chose is the cursor's.
                RequestError::Refused {
                    error: StoreError::SyntaxError,
                    ..
                } if from_client => {
                    ApiError::BadCursor("the state store does not recognize its token".into())
                }
                other => ApiError::from(other),
            })?;
        from_client = false;
        // Resume after the last key returned while the page still holds
        // it; otherwise (it was deleted) by count, a page that shrank
        // below it being used up.
        let skip = at
            .last
            .as_ref()
            .and_then(|last| page.keys.iter().position(|key| key == last))
            .map_or(at.skip.min(page.keys.len()), |index| index + 1);
        let take = (limit - listed.keys.len()).min(page.keys.len() - skip);
        listed
            .keys
            .extend(page.keys[skip..skip + take].iter().cloned());
        if skip + take < page.keys.len() {
            listed.next = Some(Position {
                token: at.token,
                skip: skip + take,
                last: Some(page.keys[skip + take - 1].clone()),
            });
            return Ok(listed);
        }
        let Some(token) = page.token else {
            return Ok(listed);
        };
        at = Position {
            token: Some(token),
            skip: 0,
            last: None,
        };
        if listed.keys.len() >= limit || Instant::now() >= deadline {
            listed.next = Some(at);
            return Ok(listed);
        }
    }
}

/// `limit`: 1 to [`MAX_LIMIT`].
fn parse_limit(raw: &[u8]) -> Result<usize, ApiError> {
    std::str::from_utf8(raw)
        .ok()
        .and_then(|text| text.parse::<usize>().ok())
        .filter(|limit| (1..=MAX_LIMIT).contains(limit))
        .ok_or_else(|| {
            ApiError::BadQuery(format!(
                "limit must be a whole number from 1 to {MAX_LIMIT}, not {:?}",
                String::from_utf8_lossy(raw)
                    .chars()
                    .take(32)
                    .collect::<String>()
            ))
        })
}

/// The opaque `cursor`: base64url of `1 | skip (u32) | token length + 1
/// (u32, 0 = none) | last key length + 1 (u32, 0 = none) | token | last
/// key | pattern`.
/// The pattern rides along so a cursor used with another `match` is
/// refused rather than resuming a different listing at a wrong place.
struct Cursor;

impl Cursor {
    const VERSION: u8 = 1;
    const HEADER: usize = 13;

    fn encode(at: &Position, pattern: &[u8]) -> String {
        let (token, last) = (at.token.as_deref(), at.last.as_deref());
        let len = |field: Option<&[u8]>| field.map_or(0, <[u8]>::len);
        let mut bytes = Vec::with_capacity(Self::HEADER + len(token) + len(last) + pattern.len());
        bytes.push(Self::VERSION);
        // Pages, tokens and keys are far below u32::MAX; saturate regardless.
        let word = |n: usize| u32::try_from(n).unwrap_or(u32::MAX).to_be_bytes();
        let field = |field: Option<&[u8]>| word(field.map_or(0, |bytes| bytes.len() + 1));
        bytes.extend_from_slice(&word(at.skip));
        bytes.extend_from_slice(&field(token));
        bytes.extend_from_slice(&field(last));
        bytes.extend_from_slice(token.unwrap_or_default());
        bytes.extend_from_slice(last.unwrap_or_default());
        bytes.extend_from_slice(pattern);
        BASE64URL.encode(bytes)
    }

    fn decode(raw: &[u8], pattern: &[u8]) -> Result<Position, ApiError> {
        let bad = || ApiError::BadCursor("it is not a cursor this gateway issued".into());
        let bytes = BASE64URL.decode(raw).map_err(|_| bad())?;
        let (header, rest) = bytes.split_at_checked(Self::HEADER).ok_or_else(bad)?;
        if header[0] != Self::VERSION {
            return Err(bad());
        }
        let word = |at: usize| {
            let mut word = [0; 4];
            word.copy_from_slice(&header[at..at + 4]);
            u32::from_be_bytes(word) as usize
        };
        let field = |rest: &[u8], length: usize| match length {
            0 => Some((None, rest.to_vec())),
            n => rest
                .split_at_checked(n - 1)
                .map(|(field, rest)| (Some(Bytes::copy_from_slice(field)), rest.to_vec())),
        };
        let skip = word(1);
        let (token, rest) = field(rest, word(5)).ok_or_else(bad)?;
        let (last, cursor_pattern) = field(&rest, word(9)).ok_or_else(bad)?;
        if cursor_pattern != pattern {
            return Err(ApiError::BadCursor(
                "it belongs to a listing with another match".into(),
            ));
        }
        Ok(Position { token, skip, last })
    }
}

/// What a `match` needs escaped to sit in a query value of the `Link`
/// (RFC 3986 `pchar` less `&`, `=` and `+`, which form decoding reads).
const QUERY_VALUE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~')
    .remove(b'*')
    .remove(b'/')
    .remove(b':')
    .remove(b'@')
    .remove(b'!')
    .remove(b'$')
    .remove(b',')
    .remove(b';');

fn respond(
    pattern: &[u8],
    limit: Option<usize>,
    values: bool,
    listed: Listed,
    text: bool,
) -> Response {
    let next = listed.next.as_ref().map(|at| Cursor::encode(at, pattern));
    let mut response = if text {
        let mut body = String::new();
        for entry in &listed.entries {
            push_line(&mut body, &entry.key);
        }
        let mut response = (StatusCode::OK, body).into_response();
        set_common_headers(response.headers_mut(), "text/plain; charset=utf-8");
        response
    } else {
        let mut response =
            (StatusCode::OK, json_body(&listed.entries, next.as_deref())).into_response();
        set_common_headers(response.headers_mut(), "application/json");
        response
    };
    if let Some(cursor) = next {
        // Pattern bytes that are not UTF-8 go out as %XX of each byte.
        let pattern = match std::str::from_utf8(pattern) {
            Ok(text) => utf8_percent_encode(text, QUERY_VALUE).to_string(),
            Err(_) => percent_encoding::percent_encode(pattern, QUERY_VALUE).to_string(),
        };
        let limit = limit
            .map(|limit| format!("&limit={limit}"))
            .unwrap_or_default();
        let values = if values { "&values=true" } else { "" };
        let link = format!("</keys?match={pattern}{limit}{values}&cursor={cursor}>; rel=\"next\"");
        if let Ok(value) = HeaderValue::from_str(&link) {
            response.headers_mut().insert(header::LINK, value);
        }
    }
    response
}

/// `{"keys": [{"key", "key_base64"}, ...], "next"}` (with `value`,
/// `value_base64` and `version` in entries that were read) written straight
/// into one buffer: a tree of `serde_json::Value`s for 10,000 keys cost
/// more than the SCANs behind it.
fn json_body(entries: &[Entry], next: Option<&str>) -> Vec<u8> {
    #[derive(Serialize)]
    struct Json<'a> {
        key: Option<&'a str>,
        key_base64: &'a str,
        #[serde(flatten)]
        value: Option<Value<'a>>,
    }
    #[derive(Serialize)]
    struct Value<'a> {
        value: Option<&'a str>,
        value_base64: &'a str,
        version: Option<String>,
    }
    // Base64 is 4/3 of the bytes, the text up to their length again plus
    // quotes and names: about 3 times the key and value and 96 bytes.
    let size: usize = entries
        .iter()
        .map(|entry| {
            let value = entry.value.as_ref().map_or(0, |v| v.value.len());
            (entry.key.len() + value) * 3 + 96
        })
        .sum();
    let mut body = Vec::with_capacity(size + 64);
    let mut key_base64 = String::new();
    let mut value_base64 = String::new();
    body.extend_from_slice(b"{\"keys\":[");
    for (index, entry) in entries.iter().enumerate() {
        if index > 0 {
            body.push(b',');
        }
        key_base64.clear();
        BASE64.encode_string(&entry.key, &mut key_base64);
        value_base64.clear();
        let value = entry.value.as_ref().map(|versioned| {
            BASE64.encode_string(&versioned.value, &mut value_base64);
            Value {
                value: std::str::from_utf8(&versioned.value).ok(),
                value_base64: &value_base64,
                version: versioned.version.as_ref().map(Hlc::to_string),
            }
        });
        let json = Json {
            key: std::str::from_utf8(&entry.key).ok(),
            key_base64: &key_base64,
            value,
        };
        // Writing into a Vec of a struct of strings cannot fail.
        let _ = serde_json::to_writer(&mut body, &json);
    }
    body.extend_from_slice(b"],\"next\":");
    let _ = serde_json::to_writer(&mut body, &next);
    body.push(b'}');
    body
}

/// One key and a newline: printable UTF-8 as it is, every other byte (and
/// `%`) as `%XX`, so each line is one key and decodes back to its bytes.
fn push_line(out: &mut String, key: &[u8]) {
    for chunk in key.utf8_chunks() {
        for ch in chunk.valid().chars() {
            if ch == '%' || ch.is_control() {
                let mut buffer = [0; 4];
                for byte in ch.encode_utf8(&mut buffer).bytes() {
                    out.push_str(&format!("%{byte:02X}"));
                }
            } else {
                out.push(ch);
            }
        }
        for byte in chunk.invalid() {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_with_their_pattern_only() {
        for at in [
            Position::default(),
            Position {
                token: Some(Bytes::from_static(b"7;sensor/\x00\xff")),
                skip: 12,
                last: Some(Bytes::from_static(b"sensor/\x01")),
            },
            Position {
                token: Some(Bytes::new()),
                skip: 0,
                last: Some(Bytes::new()),
            },
        ] {
            let cursor = Cursor::encode(&at, b"sensor/*");
            assert!(
                cursor
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            );
            assert_eq!(Cursor::decode(cursor.as_bytes(), b"sensor/*").unwrap(), at);
            assert!(matches!(
                Cursor::decode(cursor.as_bytes(), b"*"),
                Err(ApiError::BadCursor(detail)) if detail.contains("another match")
            ));
        }
    }

    #[test]
    fn cursors_that_do_not_decode_are_refused() {
        let good = Cursor::encode(
            &Position {
                token: Some(Bytes::from_static(b"1;k")),
                skip: 1,
                last: Some(Bytes::from_static(b"k1")),
            },
            b"*",
        );
        let truncated = BASE64URL.encode(&BASE64URL.decode(&good).unwrap()[..10]);
        let mut other_version = BASE64URL.decode(&good).unwrap();
        other_version[0] = 9;
        for bad in [
            "".to_owned(),
            "!!".to_owned(),
            "AAAA".to_owned(),
            truncated,
            BASE64URL.encode(other_version),
            format!("{good}="),
        ] {
            assert!(
                matches!(
                    Cursor::decode(bad.as_bytes(), b"*"),
                    Err(ApiError::BadCursor(_))
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn json_body_is_the_documented_document() {
        let keys = [
            Bytes::from_static(b"sensor/1"),
            Bytes::from_static(b"q\"uote\\\n\xc3\xa9"),
            Bytes::from_static(b"\xff\x00"),
        ];
        for next in [None, Some("AQAAAA")] {
            let entries: Vec<Entry> = keys.iter().cloned().map(Entry::key_only).collect();
            let body: serde_json::Value =
                serde_json::from_slice(&json_body(&entries, next)).unwrap();
            assert_eq!(
                body,
                serde_json::json!({
                    "keys": [
                        {"key": "sensor/1", "key_base64": "c2Vuc29yLzE="},
                        {"key": "q\"uote\\\né", "key_base64": BASE64.encode(&keys[1])},
                        {"key": null, "key_base64": "/wA="},
                    ],
                    "next": next,
                })
            );
        }
        let empty: serde_json::Value = serde_json::from_slice(&json_body(&[], None)).unwrap();
        assert_eq!(empty, serde_json::json!({"keys": [], "next": null}));
    }

    #[test]
    fn entries_read_for_values_carry_value_and_version() {
        let version = Hlc::new(1_700_000_000_000, "StateStore");
        let entries = [
            Entry {
                key: Bytes::from_static(b"sensor/1"),
                value: Some(Versioned {
                    value: Bytes::from_static(b"21.5"),
                    version: Some(version.clone()),
                }),
            },
            Entry {
                key: Bytes::from_static(b"\xff"),
                value: Some(Versioned {
                    value: Bytes::from_static(b"\xfe\x00"),
                    version: None,
                }),
            },
        ];
        let body: serde_json::Value = serde_json::from_slice(&json_body(&entries, None)).unwrap();
        assert_eq!(
            body,
            serde_json::json!({
                "keys": [
                    {"key": "sensor/1", "key_base64": "c2Vuc29yLzE=", "value": "21.5",
                     "value_base64": "MjEuNQ==", "version": version.to_string()},
                    {"key": null, "key_base64": "/w==", "value": null,
                     "value_base64": "/gA=", "version": null},
                ],
                "next": null,
            })
        );
    }

    #[test]
    fn limit_is_one_to_ten_thousand() {
        assert_eq!(parse_limit(b"1").unwrap(), 1);
        assert_eq!(parse_limit(b"10000").unwrap(), MAX_LIMIT);
        for bad in [
            &b"0"[..],
            b"10001",
            b"",
            b"-1",
            b"1.5",
            b"ten",
            b"\xff",
            b"99999999999999999999999",
        ] {
            assert!(
                matches!(parse_limit(bad), Err(ApiError::BadQuery(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn text_lines_escape_what_is_not_printable() {
        let mut out = String::new();
        push_line(&mut out, b"sensor/1");
        push_line(&mut out, "température 50%".as_bytes());
        push_line(&mut out, b"a\nb\x00\xff");
        assert_eq!(out, "sensor/1\ntempérature 50%25\na%0Ab%00%FF\n");
    }
}
