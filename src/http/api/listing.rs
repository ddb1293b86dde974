//! The key listing: `GET /keys?match=<glob>&limit=N&cursor=<next>` onto the
//! store's SCAN.
//!
//! One response holds up to `limit` keys, filled from as many SCAN pages as
//! it takes. Its `next` cursor names the store page it stopped in, how
//! many of that page's keys were already returned and the last of them, so
//! the next response resumes exactly there even when a store page was only
//! partly used (after the last key when it is still in the page, or
//! after its place in a byte-ordered page, so keys deleted from the page
//! or inserted before it meanwhile shift nothing). A cursor holds at most
//! [`KEY_IN_CURSOR`] bytes of that key and a digest of the pattern, so it
//! stays small whatever their length. The
//! gateway holds one store page and one response at a time, whatever the
//! store's size, and the next store page, read ahead
//! ([`crate::store::scan_ahead`]) so that the store works while a page
//! goes out; the cursor's listing id finds it.
//!
//! With `values=true` each listed key is then read (GET, a bounded number
//! at a time) and its entry carries `value`, `value_base64` and `version`;
//! a key deleted between the SCAN and its GET is left out. Such a response
//! also stops once its values reach [`PAGE_VALUE_BYTES`], its cursor right
//! after its last entry, and its JSON is written piece by piece: it holds
//! its values once, never their JSON whole.

use std::time::Duration;

use std::convert::Infallible;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use base64::Engine;
use base64::engine::general_purpose::{STANDARD as BASE64, URL_SAFE_NO_PAD as BASE64URL};
use bytes::Bytes;
use futures_util::StreamExt as _;
use futures_util::stream::{self, FuturesOrdered};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use serde::Serialize;
use sha2::{Digest, Sha256};
use tokio::time::Instant;

use super::extract::{PrefersText, Query};
use super::keys::{Joined, json_into, method_not_allowed, value_fields};
use crate::access::rules::{Access, Need};
use crate::http::headers::set_common_headers;
use crate::http::problem::ApiError;
use crate::http::state::AppState;
use crate::protocol::{Hlc, StoreError};
use crate::store::scan_ahead::Ahead;
use crate::store::{RequestError, Versioned};

/// Keys per response when `limit` is not given.
pub const DEFAULT_LIMIT: usize = 1_000;

/// The largest `limit`.
pub const MAX_LIMIT: usize = 10_000;

/// GETs one `values=true` response keeps in flight: a page of 10,000 keys
/// must not take a connection's whole in-flight window.
const CONCURRENT_READS: usize = 32;

/// The value bytes after which a `values=true` response stops (having
/// listed at least one entry), its `next` cursor resuming after its last
/// entry: a page of large values is held once, and only this much of it.
pub const PAGE_VALUE_BYTES: usize = 4 * 1024 * 1024;

/// The most bytes of the last key returned that a cursor holds; a longer
/// key is held as these many bytes and its SHA-256.
pub const KEY_IN_CURSOR: usize = 512;

/// The listing route. `/keys/` (a trailing slash) stays the empty key.
pub fn routes() -> Router<AppState> {
    Router::new().route("/keys", get(list_keys).fallback(method_not_allowed))
}

/// `GET /keys`: one page of the keys matching `match`.
async fn list_keys(
    State(state): State<AppState>,
    access: Access,
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
    let (listing, start) = match query.take("cursor") {
        None => (None, Position::default()),
        Some(raw) => Cursor::decode(&raw, &pattern)?,
    };
    // A version-2 cursor names no listing: its next one starts naming one.
    let listing = listing.unwrap_or_else(rand::random);
    // Stop asking the store once this is spent, so that one response
    // stays well inside the request backstop however sparse the matches.
    let budget = state.request_timeout() / 2;
    let page = fill(
        &state,
        &access,
        &pattern,
        listing,
        start,
        (limit.unwrap_or(DEFAULT_LIMIT), values),
        budget,
    )
    .await?;
    let listed = if values {
        read_values(&state, page).await?
    } else {
        Listed {
            entries: page.keys.into_iter().map(Entry::key_only).collect(),
            next: page.next,
        }
    };
    Ok(respond(&pattern, listing, limit, values, listed, text))
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

/// GETs each key in the listing's order, a bounded number at a time; a
/// key deleted since its SCAN is left out. Stops after the entry whose
/// value brings the values read to [`PAGE_VALUE_BYTES`], the next
/// response resuming after it; keeps no more reads in flight than the
/// values read so far say the rest of that budget holds, so that few
/// reads are wasted.
async fn read_values(state: &AppState, page: Page) -> Result<Listed, ApiError> {
    let Page { keys, places, next } = page;
    let total = keys.len();
    let mut keys = keys.into_iter().zip(places);
    let mut reading = FuturesOrdered::new();
    let (mut entries, mut bytes, mut read) = (Vec::new(), 0usize, 0usize);
    loop {
        while reading.len() < CONCURRENT_READS {
            let average = bytes.div_ceil(read.max(1));
            let expected = bytes + (reading.len() + 1) * average;
            if !reading.is_empty() && (read == 0 || expected >= PAGE_VALUE_BYTES) {
                break;
            }
            let Some((key, place)) = keys.next() else {
                break;
            };
            reading.push_back(async move {
                let value = state.store.get(key.clone()).await;
                (key, place, value)
            });
        }
        let Some((key, place, value)) = reading.next().await else {
            return Ok(Listed { entries, next });
        };
        read += 1;
        if let Some(value) = value? {
            bytes += value.value.len();
            entries.push(Entry {
                key: key.clone(),
                value: Some(value),
            });
        }
        if bytes >= PAGE_VALUE_BYTES && read < total {
            let (token, index) = place;
            let next = Position {
                token,
                skip: index + 1,
                last: Some(Last::of(&key)),
            };
            return Ok(Listed {
                entries,
                next: Some(next),
            });
        }
    }
}

/// Where a listing stands: the store token of the page it is in (`None`:
/// the first page), how many of that page's keys were returned, and the
/// last of them (`None` when none was).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Position {
    token: Option<Bytes>,
    skip: usize,
    last: Option<Last>,
}

/// The last key returned, as a cursor holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Last {
    /// A key of up to [`KEY_IN_CURSOR`] bytes.
    Key(Bytes),
    /// A longer key: its first [`KEY_IN_CURSOR`] bytes and its SHA-256.
    Long { start: Bytes, digest: [u8; 32] },
}

impl Last {
    fn of(key: &Bytes) -> Last {
        if key.len() <= KEY_IN_CURSOR {
            Last::Key(key.clone())
        } else {
            Last::Long {
                start: key.slice(..KEY_IN_CURSOR),
                digest: Sha256::digest(key).into(),
            }
        }
    }

    /// Whether `key` is this one.
    fn is(&self, key: &[u8]) -> bool {
        match self {
            Last::Key(last) => key == last,
            Last::Long { start, digest } => {
                key.len() > KEY_IN_CURSOR
                    && key.starts_with(start)
                    && Sha256::digest(key).as_slice() == digest
            }
        }
    }

    /// Whether `key` comes before this one in byte order, or, for a long
    /// key, shares no more than its first bytes (so those may repeat).
    fn is_past(&self, key: &[u8]) -> bool {
        match self {
            Last::Key(last) => key <= last,
            Last::Long { start, .. } => key < start,
        }
    }

    fn bytes(&self) -> Vec<u8> {
        match self {
            Last::Key(key) => key.to_vec(),
            Last::Long { start, digest } => [start.as_ref(), digest].concat(),
        }
    }

    fn from_bytes(bytes: &[u8]) -> Option<Last> {
        match bytes.len() {
            n if n <= KEY_IN_CURSOR => Some(Last::Key(Bytes::copy_from_slice(bytes))),
            n if n == KEY_IN_CURSOR + 32 => {
                let (start, digest) = bytes.split_at(KEY_IN_CURSOR);
                Some(Last::Long {
                    start: Bytes::copy_from_slice(start),
                    digest: digest.try_into().ok()?,
                })
            }
            _ => None,
        }
    }
}

/// One response's keys, where each was found (the store token of its
/// page and its index there), and where the next response starts (`None`:
/// the listing is complete).
#[derive(Debug, Default)]
struct Page {
    keys: Vec<Bytes>,
    places: Vec<(Option<Bytes>, usize)>,
    next: Option<Position>,
}

/// One response's entries, and where the next response starts.
#[derive(Debug, Default)]
struct Listed {
    entries: Vec<Entry>,
    next: Option<Position>,
}

/// SCANs from `at` until `limit` keys the caller may read are in hand,
/// the store has no more, or the `budget` is spent. Each page's successor
/// is read ahead while the page is used, and parked for the `listing`'s
/// next request when this one stops before it.
async fn fill(
    state: &AppState,
    access: &Access,
    pattern: &Bytes,
    listing: u64,
    mut at: Position,
    (limit, values): (usize, bool),
    budget: Duration,
) -> Result<Page, ApiError> {
    let deadline = Instant::now() + budget;
    let mut listed = Page::default();
    let mut from_client = at.token.is_some();
    let mut ahead = at
        .token
        .as_ref()
        .and_then(|token| state.scans_ahead.take(listing, pattern, token));
    loop {
        let read = match ahead.take() {
            Some(ahead) => ahead.page().await,
            None => None,
        };
        let read = match read {
            Some(read) => read,
            None => state.store.scan(pattern.clone(), at.token.clone()).await,
        };
        let page = read.map_err(|error| match error {
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
        ahead = page.token.as_ref().map(|token| {
            state
                .scans_ahead
                .take(listing, pattern, token)
                .unwrap_or_else(|| Ahead::start(&state.store, pattern.clone(), token.clone()))
        });
        let park = |ahead: Option<Ahead>| {
            if let (Some(ahead), Some(token)) = (ahead, &page.token) {
                let pattern = pattern.clone();
                state
                    .scans_ahead
                    .park(listing, pattern, token.clone(), ahead);
            }
        };
        let skip = resume_at(&at, &page.keys);
        let take = if access.is_unrestricted() {
            let take = (limit - listed.keys.len()).min(page.keys.len() - skip);
            listed
                .keys
                .extend(page.keys[skip..skip + take].iter().cloned());
            // Only values pages stop by bytes and need each key's place.
            if values {
                listed
                    .places
                    .extend((skip..skip + take).map(|index| (at.token.clone(), index)));
            }
            take
        } else {
            take_readable(access, &page.keys, (&at.token, skip), limit, &mut listed)
        };
        if skip + take < page.keys.len() {
            listed.next = Some(Position {
                token: at.token,
                skip: skip + take,
                last: Some(Last::of(&page.keys[skip + take - 1])),
            });
            park(ahead);
            return Ok(listed);
        }
        let Some(token) = page.token.clone() else {
            return Ok(listed);
        };
        // A byte-ordered page wholly before the last key returned (keys
        // inserted before it pushed it on): the next pages are filtered
        // by it too, until one goes past it.
        let last = if take == 0 && in_byte_order(&page.keys) {
            at.last
        } else {
            None
        };
        at = Position {
            token: Some(token),
            skip: 0,
            last,
        };
        if listed.keys.len() >= limit || Instant::now() >= deadline {
            listed.next = Some(at);
            park(ahead.take());
            return Ok(listed);
        }
    }
}

/// Moves the keys of the store page `keys` from `skip` on that the caller
/// may read into `listed` (with their place: `token`, the page's, and their
/// index) until it holds `limit`; returns how many keys from `skip` were
/// used: up to and including the last one listed when `listed` filled up
/// (so the cursor names only a key the caller was given), else all of them.
fn take_readable(
    access: &Access,
    keys: &[Bytes],
    (token, skip): (&Option<Bytes>, usize),
    limit: usize,
    listed: &mut Page,
) -> usize {
    for (index, key) in keys.iter().enumerate().skip(skip) {
        if listed.keys.len() >= limit {
            return index - skip;
        }
        if access.allows(key, Need::Read) {
            listed.keys.push(key.clone());
            listed.places.push((token.clone(), index));
        }
    }
    keys.len() - skip
}

/// Where in a store page a listing at `at` resumes: after the last key
/// returned while the page holds it; when the page is in byte order (as the
/// emulator's are), after every key up to it in that order, so that keys
/// inserted before it or its deletion shift nothing (a long key not in the
/// page: after every key before its first [`KEY_IN_CURSOR`] bytes);
/// otherwise by count, a page that shrank below it being used up.
fn resume_at(at: &Position, keys: &[Bytes]) -> usize {
    let Some(last) = &at.last else {
        return at.skip.min(keys.len());
    };
    if let Some(index) = keys.iter().position(|key| last.is(key)) {
        return index + 1;
    }
    if in_byte_order(keys) {
        return keys.partition_point(|key| last.is_past(key));
    }
    at.skip.min(keys.len())
}

/// Whether `keys` ascend in byte order.
fn in_byte_order(keys: &[Bytes]) -> bool {
    keys.windows(2).all(|pair| pair[0] < pair[1])
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

/// The opaque `cursor`: base64url of `3 | skip (u32) | token length + 1
/// (u32, 0 = none) | last key length + 1 (u32, 0 = none) | token | last
/// key (see [`Last`]) | SHA-256 of the pattern | listing id (u64)`.
/// The pattern's digest rides along so a cursor used with another `match`
/// is refused rather than resuming a different listing at a wrong place;
/// the `Link` carries the pattern itself. The listing id finds the page
/// read ahead for it; version 2 is the same without it.
struct Cursor;

impl Cursor {
    const VERSION: u8 = 3;
    const WITHOUT_LISTING: u8 = 2;
    const HEADER: usize = 13;
    const DIGEST: usize = 32;

    fn encode(at: &Position, pattern: &[u8], listing: u64) -> String {
        let token = at.token.as_deref();
        let last = at.last.as_ref().map(Last::bytes);
        let len = |field: Option<&[u8]>| field.map_or(0, <[u8]>::len);
        let mut bytes =
            Vec::with_capacity(Self::HEADER + len(token) + len(last.as_deref()) + Self::DIGEST + 8);
        bytes.push(Self::VERSION);
        // Pages, tokens and keys are far below u32::MAX; saturate regardless.
        let word = |n: usize| u32::try_from(n).unwrap_or(u32::MAX).to_be_bytes();
        let field = |field: Option<&[u8]>| word(field.map_or(0, |bytes| bytes.len() + 1));
        bytes.extend_from_slice(&word(at.skip));
        bytes.extend_from_slice(&field(token));
        bytes.extend_from_slice(&field(last.as_deref()));
        bytes.extend_from_slice(token.unwrap_or_default());
        bytes.extend_from_slice(last.as_deref().unwrap_or_default());
        bytes.extend_from_slice(&Sha256::digest(pattern));
        bytes.extend_from_slice(&listing.to_be_bytes());
        BASE64URL.encode(bytes)
    }

    /// The listing the cursor belongs to (`None` for version 2) and where
    /// it stands.
    fn decode(raw: &[u8], pattern: &[u8]) -> Result<(Option<u64>, Position), ApiError> {
        let bad = || ApiError::BadCursor("it is not a cursor this gateway issued".into());
        let mut bytes = BASE64URL.decode(raw).map_err(|_| bad())?;
        let listing = match bytes.first() {
            Some(&Self::VERSION) => {
                let at = bytes.len().checked_sub(8).ok_or_else(bad)?;
                let id = u64::from_be_bytes(bytes[at..].try_into().map_err(|_| bad())?);
                bytes.truncate(at);
                Some(id)
            }
            Some(&Self::WITHOUT_LISTING) => None,
            _ => return Err(bad()),
        };
        let (header, rest) = bytes.split_at_checked(Self::HEADER).ok_or_else(bad)?;
        let word = |at: usize| {
            let mut word = [0; 4];
            word.copy_from_slice(&header[at..at + 4]);
            u32::from_be_bytes(word) as usize
        };
        let field = |rest: &[u8], length: usize| match length {
            0 => Some((None, rest.to_vec())),
            n => rest
                .split_at_checked(n - 1)
                .map(|(field, rest)| (Some(field.to_vec()), rest.to_vec())),
        };
        let skip = word(1);
        let (token, rest) = field(rest, word(5)).ok_or_else(bad)?;
        let (last, digest) = field(&rest, word(9)).ok_or_else(bad)?;
        let last = match last {
            None => None,
            Some(bytes) => Some(Last::from_bytes(&bytes).ok_or_else(bad)?),
        };
        if digest.len() != Self::DIGEST {
            return Err(bad());
        }
        if digest != Sha256::digest(pattern).as_slice() {
            return Err(ApiError::BadCursor(
                "it belongs to a listing with another match".into(),
            ));
        }
        Ok((
            listing,
            Position {
                token: token.map(Bytes::from),
                skip,
                last,
            },
        ))
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
    listing: u64,
    limit: Option<usize>,
    values: bool,
    listed: Listed,
    text: bool,
) -> Response {
    let next = listed
        .next
        .as_ref()
        .map(|at| Cursor::encode(at, pattern, listing));
    let mut response = if text {
        let mut body = String::new();
        for entry in &listed.entries {
            push_line(&mut body, &entry.key);
        }
        let mut response = (StatusCode::OK, body).into_response();
        set_common_headers(response.headers_mut(), "text/plain; charset=utf-8");
        response
    } else if values {
        let pieces = json_pieces(listed.entries, next.clone());
        let pieces = Joined::new(stream::iter(pieces)).map(Ok::<_, Infallible>);
        let mut response = Response::new(Body::from_stream(pieces));
        set_common_headers(response.headers_mut(), "application/json");
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

/// `{"keys": [{"key", "key_base64"}, ...], "next"}` written straight into
/// one buffer: a tree of `serde_json::Value`s for 10,000 keys cost more
/// than the SCANs behind it.
fn json_body(entries: &[Entry], next: Option<&str>) -> Vec<u8> {
    #[derive(Serialize)]
    struct Json<'a> {
        key: Option<&'a str>,
        key_base64: &'a str,
    }
    // An entry is `{"key":"<text>","key_base64":"<base64>"},`: exact
    // unless its text needs escapes (the buffer then grows once).
    let size: usize = entries
        .iter()
        .map(|entry| 27 + entry.key.len() + entry.key.len().div_ceil(3) * 4)
        .sum();
    let mut body = Vec::with_capacity(size + 64);
    let mut key_base64 = String::new();
    body.extend_from_slice(b"{\"keys\":[");
    for (index, entry) in entries.iter().enumerate() {
        if index > 0 {
            body.push(b',');
        }
        key_base64.clear();
        BASE64.encode_string(&entry.key, &mut key_base64);
        let json = Json {
            key: std::str::from_utf8(&entry.key).ok(),
            key_base64: &key_base64,
        };
        // Writing into a Vec of a struct of strings cannot fail.
        let _ = serde_json::to_writer(&mut body, &json);
    }
    body.extend_from_slice(b"],\"next\":");
    let _ = serde_json::to_writer(&mut body, &next);
    body.push(b'}');
    body
}

/// `{"keys": [{"key", "key_base64", "value", "value_base64", "version"},
/// ...], "next"}` of entries read with their values, in pieces, each value
/// as a single JSON read writes it ([`value_fields`]).
fn json_pieces(entries: Vec<Entry>, next: Option<String>) -> impl Iterator<Item = Bytes> + Send {
    let entries = entries
        .into_iter()
        .enumerate()
        .flat_map(|(index, Entry { key, value })| {
            let mut head = Vec::with_capacity(key.len() * 3 + 32);
            if index > 0 {
                head.push(b',');
            }
            head.extend_from_slice(br#"{"key":"#);
            json_into(&mut head, &std::str::from_utf8(&key).ok());
            head.extend_from_slice(br#","key_base64":"#);
            json_into(&mut head, &BASE64.encode(&key));
            let mut tail = Vec::new();
            let value = value.map(|Versioned { value, version }| {
                head.push(b',');
                tail.extend_from_slice(br#","version":"#);
                json_into(&mut tail, &version.as_ref().map(Hlc::encode));
                value
            });
            tail.push(b'}');
            std::iter::once(Bytes::from(head))
                .chain(value.into_iter().flat_map(value_fields))
                .chain(std::iter::once(Bytes::from(tail)))
        });
    let mut end = br#"],"next":"#.to_vec();
    json_into(&mut end, &next);
    end.push(b'}');
    std::iter::once(Bytes::from_static(br#"{"keys":["#))
        .chain(entries)
        .chain(std::iter::once(Bytes::from(end)))
}

/// One key and a newline: printable UTF-8 as it is, every other byte (and
/// `%`) as `%XX`, so each line is one key and decodes back to its bytes.
fn push_line(out: &mut String, key: &[u8]) {
    for chunk in key.utf8_chunks() {
        for ch in chunk.valid().chars() {
            // Line and paragraph separators and the byte-order mark are
            // not control characters, but split or vanish in many tools.
            if ch == '%' || ch.is_control() || matches!(ch, '\u{2028}' | '\u{2029}' | '\u{feff}') {
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
    fn a_listing_resumes_after_its_last_key_wherever_it_moved() {
        let keys = |names: &[&'static str]| -> Vec<Bytes> {
            names
                .iter()
                .map(|name| Bytes::from_static(name.as_bytes()))
                .collect()
        };
        let at = Position {
            token: None,
            skip: 2,
            last: Some(Last::Key(Bytes::from_static(b"k5"))),
        };
        // Still in the page: right after it.
        assert_eq!(resume_at(&at, &keys(&["k0", "k5", "k6"])), 2);
        // Pushed on or deleted, in a byte-ordered page: after its place.
        assert_eq!(resume_at(&at, &keys(&["k0", "k1", "k2", "k3"])), 4);
        assert_eq!(resume_at(&at, &keys(&["k4", "k6", "k7"])), 1);
        // Another order: by count.
        assert_eq!(resume_at(&at, &keys(&["k9", "k1", "k2", "k3"])), 2);
        let fresh = Position {
            last: None,
            ..at.clone()
        };
        assert_eq!(resume_at(&fresh, &keys(&["k0"])), 1);
    }

    #[test]
    fn a_long_last_key_is_held_short_and_still_found() {
        let long = |tail: &str| Bytes::from(format!("{}{tail}", "x".repeat(50_000)));
        let last = Last::of(&long("2"));
        assert!(matches!(&last, Last::Long { start, .. } if start.len() == KEY_IN_CURSOR));
        assert!(last.is(&long("2")) && !last.is(&long("1")) && !last.is(b"x"));
        let at = Position {
            token: Some(Bytes::from(format!("1;{}", "x".repeat(544)))),
            skip: 1,
            last: Some(last),
        };
        let cursor = Cursor::encode(&at, "y".repeat(50_000).as_bytes(), 7);
        assert!(cursor.len() < 2_000, "{} bytes", cursor.len());
        assert_eq!(
            Cursor::decode(cursor.as_bytes(), "y".repeat(50_000).as_bytes()).unwrap(),
            (Some(7), at.clone())
        );
        // Still in the page: right after it; gone: after the keys before
        // its first bytes, so only keys sharing them may repeat.
        let page = [Bytes::from_static(b"a"), long("1"), long("2"), long("3")];
        assert_eq!(resume_at(&at, &page), 3);
        let gone = [
            Bytes::from_static(b"a"),
            long("1"),
            long("3"),
            Bytes::from_static(b"z"),
        ];
        assert_eq!(resume_at(&at, &gone), 1);
    }

    #[test]
    fn cursors_round_trip_with_their_pattern_only() {
        for at in [
            Position::default(),
            Position {
                token: Some(Bytes::from_static(b"7;sensor/\x00\xff")),
                skip: 12,
                last: Some(Last::Key(Bytes::from_static(b"sensor/\x01"))),
            },
            Position {
                token: Some(Bytes::new()),
                skip: 0,
                last: Some(Last::Key(Bytes::new())),
            },
        ] {
            let cursor = Cursor::encode(&at, b"sensor/*", u64::MAX);
            assert!(
                cursor
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            );
            assert_eq!(
                Cursor::decode(cursor.as_bytes(), b"sensor/*").unwrap(),
                (Some(u64::MAX), at.clone())
            );
            // Version 2, without a listing id, still resumes.
            let mut bytes = BASE64URL.decode(&cursor).unwrap();
            bytes.truncate(bytes.len() - 8);
            bytes[0] = 2;
            assert_eq!(
                Cursor::decode(BASE64URL.encode(bytes).as_bytes(), b"sensor/*").unwrap(),
                (None, at.clone())
            );
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
                last: Some(Last::Key(Bytes::from_static(b"k1"))),
            },
            b"*",
            1,
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
        let body: Vec<u8> = json_pieces(entries.to_vec(), None).flatten().collect();
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
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
