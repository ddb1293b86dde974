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
//! The gateway's own records ([`crate::store::reserved`]) are never
//! listed, whatever the caller's rules.
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
use axum::http::{HeaderValue, header};
use axum::response::Response;
use axum::routing::get;
use base64::Engine;
use base64::engine::general_purpose::{STANDARD as BASE64, URL_SAFE_NO_PAD as BASE64URL};
use bytes::Bytes;
use futures_util::StreamExt as _;
use futures_util::stream::{self, FuturesOrdered};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
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

/// The most room a listing's body takes beyond the keys in hand on the
/// guess that the rest of its keys are like them.
const RESERVE_AHEAD: usize = 4 * 1024 * 1024;

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
    let mut query = query.accept(&["match", "limit", "cursor", "values", "key_base64"])?;
    let values = query.take_bool("values")?;
    if values && text {
        return Err(ApiError::BadQuery(
            "values=true lists JSON entries; ask for Accept: application/json".into(),
        ));
    }
    let key_base64 = query
        .take("key_base64")
        .map(|raw| KeyBase64::parse(&raw))
        .transpose()?;
    if key_base64.is_some() && text {
        return Err(ApiError::BadQuery(
            "key_base64 shapes JSON entries; ask for Accept: application/json".into(),
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
    let form = Form {
        text,
        values,
        key_base64: key_base64.unwrap_or_default(),
    };
    let page = fill(
        &state,
        &access,
        &pattern,
        listing,
        start,
        (limit.unwrap_or(DEFAULT_LIMIT), form.out()),
        budget,
    )
    .await?;
    let link = Link {
        limit,
        key_base64,
        values,
    };
    let (body, next) = match page.out {
        Out::Keys { keys, places } => {
            let listed = read_values(&state, keys, places, page.next).await?;
            (Written::Values(listed.entries), listed.next)
        }
        Out::Json { body, .. } => (Written::Json(body), page.next),
        Out::Text(body) => (Written::Text(body), page.next),
    };
    Ok(respond(&pattern, listing, link, form, body, next))
}

/// How the entries of a JSON listing carry their key's bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum KeyBase64 {
    /// `key_base64` in every entry (the default).
    #[default]
    Always,
    /// `key_base64` only in the entries whose `key` is null (not UTF-8).
    IfNotUtf8,
}

impl KeyBase64 {
    fn parse(raw: &[u8]) -> Result<KeyBase64, ApiError> {
        match raw {
            b"always" => Ok(KeyBase64::Always),
            b"if_not_utf8" => Ok(KeyBase64::IfNotUtf8),
            other => Err(ApiError::BadQuery(format!(
                "key_base64 must be always or if_not_utf8, not {:?}",
                String::from_utf8_lossy(other)
                    .chars()
                    .take(32)
                    .collect::<String>()
            ))),
        }
    }

    fn name(self) -> &'static str {
        match self {
            KeyBase64::Always => "always",
            KeyBase64::IfNotUtf8 => "if_not_utf8",
        }
    }
}

/// The response asked for: text lines, or JSON entries with or without
/// values, their keys as [`KeyBase64`] says.
#[derive(Debug, Clone, Copy)]
struct Form {
    text: bool,
    values: bool,
    key_base64: KeyBase64,
}

impl Form {
    /// Where [`fill`] puts the keys of this form.
    fn out(self) -> Out {
        if self.text {
            Out::Text(String::new())
        } else if self.values {
            Out::Keys {
                keys: Vec::new(),
                places: Vec::new(),
            }
        } else {
            Out::Json {
                body: br#"{"keys":["#.to_vec(),
                key_base64: self.key_base64,
            }
        }
    }
}

/// The query parameters a `Link` to the next page repeats besides `match`.
#[derive(Debug, Clone, Copy)]
struct Link {
    limit: Option<usize>,
    key_base64: Option<KeyBase64>,
    values: bool,
}

/// A response's body as [`fill`] and [`read_values`] left it.
#[derive(Debug)]
enum Written {
    /// The JSON document up to its last entry.
    Json(Vec<u8>),
    /// The text form, whole.
    Text(String),
    /// Entries with their values, written piece by piece.
    Values(Vec<Entry>),
}

/// One listed key, with its value and version when they were asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    key: Bytes,
    value: Option<Versioned<Bytes>>,
}

/// GETs each key in the listing's order, a bounded number at a time; a
/// key deleted since its SCAN is left out. Stops after the entry whose
/// value brings the values read to [`PAGE_VALUE_BYTES`], the next
/// response resuming after it; keeps no more reads in flight than the
/// values read so far say the rest of that budget holds, so that few
/// reads are wasted.
async fn read_values(
    state: &AppState,
    keys: Vec<Bytes>,
    places: Vec<(Option<Bytes>, usize)>,
    next: Option<Position>,
) -> Result<Listed, ApiError> {
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

/// One response's keys as [`Out`] holds them, how many there are, and
/// where the next response starts (`None`: the listing is complete).
#[derive(Debug)]
struct Page {
    count: usize,
    out: Out,
    next: Option<Position>,
}

/// Where a response's keys go as each store page comes.
#[derive(Debug)]
enum Out {
    /// The keys and where each was found (the store token of its page and
    /// its index there): `values=true` reads each, and may stop early.
    Keys {
        keys: Vec<Bytes>,
        places: Vec<(Option<Bytes>, usize)>,
    },
    /// The JSON document, written entry by entry: a store page is let go
    /// once its keys are written, so a response holds its body and at
    /// most two store pages (the one in use and the one read ahead),
    /// never its keys besides.
    Json {
        body: Vec<u8>,
        key_base64: KeyBase64,
    },
    /// The text form's lines, likewise.
    Text(String),
}

impl Page {
    fn new(out: Out) -> Page {
        Page {
            count: 0,
            out,
            next: None,
        }
    }

    /// Lists `key`, found at `index` in the store page at `token`.
    fn push(&mut self, key: &Bytes, token: &Option<Bytes>, index: usize) {
        match &mut self.out {
            Out::Keys { keys, places } => {
                keys.push(key.clone());
                places.push((token.clone(), index));
            }
            Out::Json { body, key_base64 } => {
                if self.count > 0 {
                    body.push(b',');
                }
                key_fields(body, key, *key_base64);
                body.push(b'}');
            }
            Out::Text(text) => push_line(text, key),
        }
        self.count += 1;
    }

    /// Makes room for `keys` and, by their average size, the rest of a
    /// response of `limit` keys, in one allocation where the keys are
    /// alike rather than in doublings that copy the body each time.
    fn reserve(&mut self, keys: &[Bytes], limit: usize) {
        let (needed, capacity) = match &self.out {
            Out::Keys { .. } => return,
            Out::Json { body, key_base64 } => (
                keys.iter()
                    .map(|key| json_entry_len(key, *key_base64))
                    .sum::<usize>(),
                body.capacity() - body.len(),
            ),
            Out::Text(text) => (
                keys.iter().map(|key| key.len() + 1).sum::<usize>(),
                text.capacity() - text.len(),
            ),
        };
        if keys.is_empty() || needed <= capacity {
            return;
        }
        let rest = limit.saturating_sub(self.count).max(keys.len());
        // The end of the document (`],"next":<cursor>}`) fits in the slack;
        // long keys reserve no more than their own size and a bit.
        let wanted = (needed.div_ceil(keys.len()) * rest + 64).min(needed + RESERVE_AHEAD);
        match &mut self.out {
            Out::Json { body, .. } => body.reserve_exact(wanted),
            Out::Text(text) => text.reserve_exact(wanted),
            Out::Keys { .. } => {}
        }
    }
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
    (limit, out): (usize, Out),
    budget: Duration,
) -> Result<Page, ApiError> {
    let deadline = Instant::now() + budget;
    let mut listed = Page::new(out);
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
        let take = if access.reads_all(&page.keys[skip..]) {
            let take = (limit - listed.count).min(page.keys.len() - skip);
            let keys = &page.keys[skip..skip + take];
            listed.reserve(keys, limit);
            for (index, key) in (skip..).zip(keys) {
                listed.push(key, &at.token, index);
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
        if listed.count >= limit || Instant::now() >= deadline {
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
        if listed.count >= limit {
            return index - skip;
        }
        if access.allows(key, Need::Read) {
            listed.push(key, token, index);
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
    link: Link,
    form: Form,
    body: Written,
    next: Option<Position>,
) -> Response {
    let next = next.as_ref().map(|at| Cursor::encode(at, pattern, listing));
    let (body, content_type) = match body {
        Written::Text(body) => (Body::from(body), "text/plain; charset=utf-8"),
        Written::Values(entries) => {
            let pieces = json_pieces(entries, form.key_base64, next.clone());
            let pieces = Joined::new(stream::iter(pieces)).map(Ok::<_, Infallible>);
            (Body::from_stream(pieces), "application/json")
        }
        Written::Json(mut body) => {
            json_end(&mut body, next.as_deref());
            (Body::from(body), "application/json")
        }
    };
    let mut response = Response::new(body);
    set_common_headers(response.headers_mut(), content_type);
    if let Some(cursor) = next {
        // Pattern bytes that are not UTF-8 go out as %XX of each byte.
        let pattern = match std::str::from_utf8(pattern) {
            Ok(text) => utf8_percent_encode(text, QUERY_VALUE).to_string(),
            Err(_) => percent_encoding::percent_encode(pattern, QUERY_VALUE).to_string(),
        };
        let limit = link
            .limit
            .map(|limit| format!("&limit={limit}"))
            .unwrap_or_default();
        let values = if link.values { "&values=true" } else { "" };
        let key_base64 = link
            .key_base64
            .map(|form| format!("&key_base64={}", form.name()))
            .unwrap_or_default();
        let link = format!(
            "</keys?match={pattern}{limit}{values}{key_base64}&cursor={cursor}>; rel=\"next\""
        );
        if let Ok(value) = HeaderValue::from_str(&link) {
            response.headers_mut().insert(header::LINK, value);
        }
    }
    response
}

/// `{"key":<text or null>,"key_base64":"<base64>"` of one entry, left
/// open for more fields; with [`KeyBase64::IfNotUtf8`] a UTF-8 key has no
/// `key_base64`. Written by hand: serde per field cost more than the
/// SCAN behind a key, and base64 goes straight into `out`.
fn key_fields(out: &mut Vec<u8>, key: &[u8], key_base64: KeyBase64) {
    out.extend_from_slice(br#"{"key":"#);
    match std::str::from_utf8(key) {
        Ok(text) => {
            json_str(out, text);
            if key_base64 == KeyBase64::IfNotUtf8 {
                return;
            }
        }
        Err(_) => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(br#","key_base64":""#);
    let at = out.len();
    out.resize(at + base64::encoded_len(key.len(), true).unwrap_or(0), 0);
    // The room is exactly the encoded length.
    let _ = BASE64.encode_slice(key, &mut out[at..]);
    out.push(b'"');
}

/// A JSON string of `text`: as it is when nothing in it needs an escape
/// (the usual key), else as serde_json escapes it; the same bytes both ways.
fn json_str(out: &mut Vec<u8>, text: &str) {
    if text
        .bytes()
        .all(|byte| byte >= 0x20 && byte != b'"' && byte != b'\\')
    {
        out.push(b'"');
        out.extend_from_slice(text.as_bytes());
        out.push(b'"');
    } else {
        json_into(out, text);
    }
}

/// The length of a key's entry as [`key_fields`] writes it, a `}` and a
/// `,` included (exact unless its text needs escapes).
fn json_entry_len(key: &[u8], key_base64: KeyBase64) -> usize {
    let base64 = base64::encoded_len(key.len(), true).unwrap_or(0);
    match (std::str::from_utf8(key).is_ok(), key_base64) {
        (true, KeyBase64::IfNotUtf8) => 11 + key.len(),
        (true, KeyBase64::Always) => 27 + key.len() + base64,
        (false, _) => 29 + base64,
    }
}

/// Ends the document [`Out::Json`] started: `],"next":<cursor or null>}`.
fn json_end(body: &mut Vec<u8>, next: Option<&str>) {
    body.extend_from_slice(br#"],"next":"#);
    json_into(body, &next);
    body.push(b'}');
}

/// `{"keys": [{"key", "key_base64"}, ...], "next"}` of `keys`, as a
/// response of them is written.
#[cfg(test)]
fn json_body(keys: &[Bytes], key_base64: KeyBase64, next: Option<&str>) -> Vec<u8> {
    let mut page = Page::new(
        Form {
            text: false,
            values: false,
            key_base64,
        }
        .out(),
    );
    page.reserve(keys, keys.len());
    for (index, key) in keys.iter().enumerate() {
        page.push(key, &None, index);
    }
    let Out::Json { mut body, .. } = page.out else {
        unreachable!("a JSON form");
    };
    json_end(&mut body, next);
    body
}

/// `{"keys": [{"key", "key_base64", "value", "value_base64", "version"},
/// ...], "next"}` of entries read with their values, in pieces, each value
/// as a single JSON read writes it ([`value_fields`]).
fn json_pieces(
    entries: Vec<Entry>,
    key_base64: KeyBase64,
    next: Option<String>,
) -> impl Iterator<Item = Bytes> + Send {
    let entries = entries
        .into_iter()
        .enumerate()
        .flat_map(move |(index, Entry { key, value })| {
            let mut head = Vec::with_capacity(key.len() * 3 + 32);
            if index > 0 {
                head.push(b',');
            }
            key_fields(&mut head, &key, key_base64);
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
    let mut end = Vec::new();
    json_end(&mut end, next.as_deref());
    std::iter::once(Bytes::from_static(br#"{"keys":["#))
        .chain(entries)
        .chain(std::iter::once(Bytes::from(end)))
}

/// One key and a newline: printable UTF-8 as it is, every other byte (and
/// `%`) as `%XX`, so each line is one key and decodes back to its bytes.
fn push_line(out: &mut String, key: &[u8]) {
    // The usual key: printable ASCII without `%`, as it is.
    if key
        .iter()
        .all(|&byte| (0x20..0x7f).contains(&byte) && byte != b'%')
    {
        // All ASCII: UTF-8.
        out.push_str(std::str::from_utf8(key).unwrap_or_default());
        out.push('\n');
        return;
    }
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
            let body: serde_json::Value =
                serde_json::from_slice(&json_body(&keys, KeyBase64::Always, next)).unwrap();
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
            let body: serde_json::Value =
                serde_json::from_slice(&json_body(&keys, KeyBase64::IfNotUtf8, next)).unwrap();
            assert_eq!(
                body,
                serde_json::json!({
                    "keys": [
                        {"key": "sensor/1"},
                        {"key": "q\"uote\\\né"},
                        {"key": null, "key_base64": "/wA="},
                    ],
                    "next": next,
                })
            );
        }
        for key_base64 in [KeyBase64::Always, KeyBase64::IfNotUtf8] {
            let empty: serde_json::Value =
                serde_json::from_slice(&json_body(&[], key_base64, None)).unwrap();
            assert_eq!(empty, serde_json::json!({"keys": [], "next": null}));
        }
    }

    #[test]
    fn keys_are_written_as_serde_json_writes_them_in_the_size_foreseen() {
        let mut keys: Vec<Bytes> = (0u8..=255).map(|byte| Bytes::from(vec![byte])).collect();
        keys.extend(
            [
                &b"sensor/000001/temperature"[..],
                b"",
                "température\u{2028}\u{7f}".as_bytes(),
                b"a\"b\\c/d\te",
                b"\xc3",
            ]
            .map(Bytes::from_static),
        );
        for key in &keys {
            let text = std::str::from_utf8(key).ok();
            let mut fast = Vec::new();
            key_fields(&mut fast, key, KeyBase64::Always);
            fast.push(b'}');
            let expected = serde_json::to_vec(&serde_json::json!({
                "key": text,
                "key_base64": BASE64.encode(key),
            }))
            .unwrap();
            assert_eq!(fast, expected, "{key:?}");
            let plain = text
                .is_some_and(|text| serde_json::to_string(text).unwrap().len() == text.len() + 2);
            if plain || text.is_none() {
                // The comma before it included.
                assert_eq!(json_entry_len(key, KeyBase64::Always), fast.len() + 1);
            }
            let mut compact = Vec::new();
            key_fields(&mut compact, key, KeyBase64::IfNotUtf8);
            compact.push(b'}');
            let expected = match text {
                Some(text) => serde_json::json!({"key": text}),
                None => serde_json::json!({"key": null, "key_base64": BASE64.encode(key)}),
            };
            assert_eq!(compact, serde_json::to_vec(&expected).unwrap(), "{key:?}");
            if plain || text.is_none() {
                assert_eq!(json_entry_len(key, KeyBase64::IfNotUtf8), compact.len() + 1);
            }
        }
    }

    /// The document [`json_pieces`] writes of `entries`, parsed.
    fn pieces_json(
        entries: &[Entry],
        key_base64: KeyBase64,
        next: Option<String>,
    ) -> serde_json::Value {
        let body: Vec<u8> = json_pieces(entries.to_vec(), key_base64, next)
            .flatten()
            .collect();
        serde_json::from_slice(&body).unwrap()
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
        assert_eq!(
            pieces_json(&entries, KeyBase64::Always, None),
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
        assert_eq!(
            pieces_json(&entries, KeyBase64::IfNotUtf8, Some("AQ".into())),
            serde_json::json!({
                "keys": [
                    {"key": "sensor/1", "value": "21.5",
                     "value_base64": "MjEuNQ==", "version": version.to_string()},
                    {"key": null, "key_base64": "/w==", "value": null,
                     "value_base64": "/gA=", "version": null},
                ],
                "next": "AQ",
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
