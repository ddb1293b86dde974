//! Request parsing, once for every route: the key in a path, the query
//! parameters, the conditions, the fencing token, the representation asked
//! for, a watch's `Last-Event-ID`, a listing's preferred form and a body's
//! declared length, as axum extractors whose rejection is the API's problem
//! response ([`ApiError`]), and the parsers behind them.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{FromRequestParts, OriginalUri};
use axum::http::request::Parts;
use axum::http::{HeaderMap, header};
use bytes::Bytes;
use http_body_util::BodyExt as _;
use percent_encoding::percent_decode;

use crate::access::rules::{Access, Need};
use crate::http::headers::{Representation, accept_weight};
use crate::http::problem::ApiError;
use crate::http::state::AppState;
use crate::protocol::Hlc;
use crate::settings::parse_duration;

/// The request's path as the client sent it (before any nesting).
fn original_path(parts: &Parts) -> &str {
    parts
        .extensions
        .get::<OriginalUri>()
        .map_or(parts.uri.path(), |original| original.0.path())
}

/// The key the path names after its route's first segment, decoded
/// strictly and within `--max-key-bytes`, allowed to the caller for the
/// request's method (GET and HEAD read, others write: keys, locks and key
/// watches alike): never a reserved key, and with rules configured only
/// what they allow; else 403.
#[derive(Debug, Clone)]
pub struct Key(pub Bytes);

impl FromRequestParts<AppState> for Key {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let key = key_from_path(original_path(parts), state.limits.max_key_bytes)?;
        Access::of(parts, state.callers.authz.as_ref()).require(&key, Need::of(&parts.method))?;
        Ok(Self(key))
    }
}

/// The caller's access under the rules (see [`Access`]).
impl FromRequestParts<AppState> for Access {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Infallible> {
        Ok(Access::of(parts, state.callers.authz.as_ref()))
    }
}

/// The raw query; each handler names the parameters it takes with
/// [`Query::accept`], so that a typo is refused rather than ignored.
#[derive(Debug, Clone, Default)]
pub struct Query(Option<String>);

impl<S: Send + Sync> FromRequestParts<S> for Query {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Infallible> {
        Ok(Self(parts.uri.query().map(str::to_owned)))
    }
}

impl Query {
    /// The parameters, when each is one of `accepted` and given once.
    pub fn accept(&self, accepted: &[&'static str]) -> Result<QueryParams, ApiError> {
        QueryParams::parse(self.0.as_deref(), accepted)
    }

    /// The undecoded `name=value` pairs, in order (repeats included).
    pub fn pairs(&self) -> impl Iterator<Item = (&str, &str)> {
        query_pairs(self.0.as_deref())
    }
}

/// The one split of a query string into `name=value` pairs (empty pairs
/// skipped, a pair without `=` has an empty value), still encoded.
pub fn query_pairs(query: Option<&str>) -> impl Iterator<Item = (&str, &str)> {
    query
        .unwrap_or_default()
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| pair.split_once('=').unwrap_or((pair, "")))
}

/// A request's preconditions: `If-None-Match` (a malformed one is
/// refused) and whether it sent `If-Match`, which no route supports.
#[derive(Debug, Clone)]
pub struct Conditions {
    /// `If-None-Match`, every line combined.
    pub if_none_match: Option<IfNoneMatch>,
    if_match: bool,
}

impl<S: Send + Sync> FromRequestParts<S> for Conditions {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        Ok(Self {
            if_none_match: IfNoneMatch::from_headers(&parts.headers)?,
            if_match: parts.headers.contains_key(header::IF_MATCH),
        })
    }
}

impl Conditions {
    /// `If-Match` would promise a compare-and-set the store cannot do;
    /// refusing it beats silently dropping the client's precondition.
    pub fn refuse_if_match(&self) -> Result<(), ApiError> {
        if self.if_match {
            return Err(ApiError::BadHeader(
                "If-Match is not supported: use If-None-Match: * or nex=true on PUT, ?value= on DELETE"
                    .into(),
            ));
        }
        Ok(())
    }
}

/// The `Fencing-Token` header, checked against the gateway's clock.
#[derive(Debug, Clone)]
pub struct FencingToken(pub Option<Hlc>);

impl FromRequestParts<AppState> for FencingToken {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        fencing_token(&parts.headers, (state.clock)()).map(Self)
    }
}

/// The form of a key's value the client's `Accept` prefers.
impl<S: Send + Sync> FromRequestParts<S> for Representation {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Infallible> {
        Ok(if wants_json(&parts.headers) {
            Self::Json
        } else {
            Self::Raw
        })
    }
}

/// A watch's `Last-Event-ID`: the version the client saw last, to resume
/// after. An unparsable one is not the client's fault: the stream starts
/// afresh (`None`).
#[derive(Debug)]
pub struct LastEventId(pub Option<Hlc>);

impl<S: Send + Sync> FromRequestParts<S> for LastEventId {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Infallible> {
        Ok(Self(
            header_text(&parts.headers, "last-event-id")
                .and_then(|text| Hlc::parse(text.trim()).ok()),
        ))
    }
}

/// Whether a listing's client prefers one key per line (`text/plain`
/// weighted above `application/json`) to the JSON page.
#[derive(Debug)]
pub struct PrefersText(pub bool);

impl<S: Send + Sync> FromRequestParts<S> for PrefersText {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Infallible> {
        Ok(Self(prefers_text(&parts.headers)))
    }
}

fn prefers_text(headers: &HeaderMap) -> bool {
    let text = accept_weight(headers, "text/plain").unwrap_or(0.0);
    let json = accept_weight(headers, "application/json").unwrap_or(0.0);
    text > 0.0 && text > json
}

/// The body length a request declares (`Content-Length`), if any: a value
/// over the limit is refused before reading.
#[derive(Debug)]
pub struct DeclaredLength(pub Option<u64>);

impl<S: Send + Sync> FromRequestParts<S> for DeclaredLength {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Infallible> {
        Ok(Self(
            header_text(&parts.headers, header::CONTENT_LENGTH.as_str())
                .and_then(|text| text.parse().ok()),
        ))
    }
}

/// Reads a request body whole, up to `limit` bytes and within `within`:
/// `Content-Length` over the limit is refused before reading (413), a
/// chunked body as soon as it passes the limit; a body that has not arrived
/// in time is 408, so a slow client cannot hold its connection for ever.
pub async fn read_body(
    body: &mut Body,
    declared: Option<u64>,
    limit: usize,
    within: Duration,
) -> Result<Bytes, ApiError> {
    if declared.is_some_and(|length| length > limit as u64) {
        return Err(ApiError::ValueTooLarge { max: limit });
    }
    // Reserve for what arrives, not for what a client merely declares: a
    // Content-Length alone must not hold megabytes for the body timeout.
    const INITIAL_BODY_CAPACITY: usize = 64 * 1024;
    let capacity = declared.map_or(0, |length| (length as usize).min(INITIAL_BODY_CAPACITY));
    let read = async move {
        let mut value = Vec::with_capacity(capacity);
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|error| ApiError::BodyRead(error.to_string()))?;
            // Trailers carry no value bytes.
            let Ok(chunk) = frame.into_data() else {
                continue;
            };
            let length = value.len() + chunk.len();
            if length > limit {
                return Err(ApiError::ValueTooLarge { max: limit });
            }
            if length > value.capacity() {
                // Doubling, but never past the declared length: a body
                // holds its own size, not up to twice it.
                let grown = (2 * value.capacity()).max(length);
                let room = declared
                    .and_then(|declared| usize::try_from(declared).ok())
                    .filter(|&declared| declared >= length)
                    .map_or(grown, |declared| grown.min(declared));
                value.reserve_exact(room - value.len());
            }
            value.extend_from_slice(&chunk);
        }
        Ok(Bytes::from(value))
    };
    tokio::time::timeout(within, read)
        .await
        .map_err(|_| ApiError::BodyTimeout(within))?
}

/// A header's value when present and visible ASCII, for headers whose
/// absence or garbling means "not given".
fn header_text<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|value| value.to_str().ok())
}

/// The header carrying a write's fencing token (an HLC, e.g. a lease's version).
pub const FENCING_TOKEN_HEADER: &str = "fencing-token";

/// The longest `Fencing-Token` accepted. It travels as the MQTT5 user
/// property `__ft`, a string of at most 65,535 bytes that rumqttc truncates
/// silently, corrupting the packet and dropping the broker connection (and
/// every request in flight on it); real tokens are versions of a few dozen
/// bytes.
pub const MAX_FENCING_TOKEN_BYTES: usize = 1024;

/// The key after a path's first segment (`/keys/`, `/watch/`, `/locks/`),
/// percent-decoded strictly.
pub fn key_from_path(path: &str, max_key_bytes: usize) -> Result<Bytes, ApiError> {
    let raw = path
        .strip_prefix('/')
        .and_then(|rest| rest.split_once('/'))
        .map_or("", |(_, key)| key);
    decode_key(raw, false, max_key_bytes)
}

/// A percent-encoded key (from a path, or with `plus_as_space` from a
/// query string), decoded strictly and checked against the limit.
pub fn decode_key(raw: &str, plus_as_space: bool, max_key_bytes: usize) -> Result<Bytes, ApiError> {
    if raw.is_empty() {
        return Err(ApiError::EmptyKey);
    }
    // Each decoded byte takes one to three characters: refuse a path that
    // cannot fit before decoding it.
    let shortest = raw.len().div_ceil(3);
    if shortest > max_key_bytes {
        return Err(ApiError::KeyTooLong {
            len: shortest,
            max: max_key_bytes,
        });
    }
    let key = percent_decode_strict(raw.as_bytes(), plus_as_space)
        .ok_or(ApiError::BadPercentEncoding("key"))?;
    checked_key(key, max_key_bytes)
}

/// A decoded key, refused when empty (400) or over the limit (414): the
/// one check of a key's bytes, wherever the key came from.
pub fn checked_key(key: impl Into<Bytes>, max_key_bytes: usize) -> Result<Bytes, ApiError> {
    let key = key.into();
    if key.is_empty() {
        return Err(ApiError::EmptyKey);
    }
    if key.len() > max_key_bytes {
        return Err(ApiError::KeyTooLong {
            len: key.len(),
            max: max_key_bytes,
        });
    }
    Ok(key)
}

/// Percent-decodes `input`, refusing a `%` not followed by two hex digits
/// (`percent_decode` alone passes those through). With `plus_as_space`, `+`
/// is a space, as in form-encoded query strings.
pub fn percent_decode_strict(input: &[u8], plus_as_space: bool) -> Option<Vec<u8>> {
    let mut index = 0;
    while index < input.len() {
        if input[index] == b'%' {
            let digits = input.get(index + 1..index + 3)?;
            if !digits.iter().all(u8::is_ascii_hexdigit) {
                return None;
            }
            index += 3;
        } else {
            index += 1;
        }
    }
    Some(form_decode(input, plus_as_space))
}

/// Percent-decodes `input`, leniently (a `%` without two hex digits stays
/// as it is); with `plus_as_space`, `+` is a space first (form encoding).
pub fn form_decode(input: &[u8], plus_as_space: bool) -> Vec<u8> {
    if plus_as_space && input.contains(&b'+') {
        let spaced: Vec<u8> = input
            .iter()
            .map(|&byte| if byte == b'+' { b' ' } else { byte })
            .collect();
        return percent_decode(&spaced).collect();
    }
    // Every key in a path comes through here: most have nothing to decode,
    // and the decoder's iterator would grow its Vec a byte at a time.
    if !input.contains(&b'%') {
        return input.to_vec();
    }
    let mut decoded = Vec::with_capacity(input.len());
    decoded.extend(percent_decode(input));
    decoded
}

/// The query parameters a method accepts; unknown or repeated ones are
/// refused so a typo (`?tll=30s`) never silently drops a condition.
#[derive(Debug, Default)]
pub struct QueryParams {
    values: Vec<(&'static str, Vec<u8>)>,
}

impl QueryParams {
    pub fn parse(query: Option<&str>, accepted: &[&'static str]) -> Result<Self, ApiError> {
        let mut params = Self::default();
        let Some(query) = query else {
            return Ok(params);
        };
        for (raw_name, raw_value) in query_pairs(Some(query)) {
            let name = percent_decode_strict(raw_name.as_bytes(), true)
                .ok_or(ApiError::BadPercentEncoding("query"))?;
            let value = percent_decode_strict(raw_value.as_bytes(), true)
                .ok_or(ApiError::BadPercentEncoding("query"))?;
            let Some(&name) = accepted.iter().find(|known| known.as_bytes() == name) else {
                let shown = String::from_utf8_lossy(&name)
                    .chars()
                    .take(64)
                    .collect::<String>();
                return Err(ApiError::BadQuery(if accepted.is_empty() {
                    format!("unknown query parameter {shown:?}: this request takes none")
                } else {
                    format!(
                        "unknown query parameter {shown:?}: this request takes {}",
                        accepted.join(", ")
                    )
                }));
            };
            if params.values.iter().any(|(seen, _)| *seen == name) {
                return Err(ApiError::BadQuery(format!(
                    "query parameter {name:?} is given more than once"
                )));
            }
            params.values.push((name, value));
        }
        Ok(params)
    }

    pub fn take(&mut self, name: &str) -> Option<Vec<u8>> {
        let index = self.values.iter().position(|(known, _)| *known == name)?;
        Some(self.values.swap_remove(index).1)
    }

    pub fn take_bool(&mut self, name: &str) -> Result<bool, ApiError> {
        match self.take(name).as_deref() {
            None | Some(b"false" | b"0") => Ok(false),
            Some(b"" | b"true" | b"1") => Ok(true),
            Some(other) => Err(ApiError::BadQuery(format!(
                "query parameter {name:?} must be true or false, not {:?}",
                String::from_utf8_lossy(other)
                    .chars()
                    .take(32)
                    .collect::<String>()
            ))),
        }
    }
}

/// `ttl` in milliseconds: `500ms`, `30s`, `2m`, `1h` or plain milliseconds.
pub fn parse_ttl(raw: &[u8]) -> Result<u64, ApiError> {
    let shown = || {
        String::from_utf8_lossy(raw)
            .chars()
            .take(32)
            .collect::<String>()
    };
    let text = std::str::from_utf8(raw).map_err(|_| ApiError::BadTtl(shown()))?;
    let duration = parse_duration(text).map_err(|_| ApiError::BadTtl(shown()))?;
    let ms = u64::try_from(duration.as_millis()).map_err(|_| ApiError::BadTtl(shown()))?;
    if ms == 0 {
        return Err(ApiError::BadTtl(shown()));
    }
    Ok(ms)
}

/// `If-None-Match`: `*` or a list of entity tags (weak ones compare equal
/// to strong ones, as RFC 9110 says for this header).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IfNoneMatch {
    /// `*`: any current value.
    Any,
    /// The opaque parts of the listed tags.
    Tags(Vec<String>),
}

impl IfNoneMatch {
    /// Every `If-None-Match` line of the request, combined; a malformed
    /// header is refused rather than ignored.
    pub fn from_headers(headers: &HeaderMap) -> Result<Option<Self>, ApiError> {
        let mut tags = Vec::new();
        let mut any = false;
        let mut seen = false;
        for value in headers.get_all(header::IF_NONE_MATCH) {
            seen = true;
            let text = value
                .to_str()
                .map_err(|_| ApiError::BadHeader("If-None-Match is not visible ASCII".into()))?;
            match Self::parse(text) {
                Some(Self::Any) => any = true,
                Some(Self::Tags(list)) => tags.extend(list),
                None => {
                    return Err(ApiError::BadHeader(format!(
                        "malformed If-None-Match {:?}: use * or quoted entity tags",
                        text.chars().take(64).collect::<String>()
                    )));
                }
            }
        }
        Ok(match (seen, any) {
            (false, _) => None,
            (true, true) => Some(Self::Any),
            (true, false) => Some(Self::Tags(tags)),
        })
    }

    /// Parses one header value: `*`, or `"a", W/"b"`.
    pub fn parse(text: &str) -> Option<Self> {
        let text = text.trim();
        if text == "*" {
            return Some(Self::Any);
        }
        let mut tags = Vec::new();
        let mut rest = text;
        loop {
            rest = rest.trim_start_matches([' ', '\t', ',']);
            if rest.is_empty() {
                break;
            }
            let quoted = rest.strip_prefix("W/").unwrap_or(rest);
            let inner = quoted.strip_prefix('"')?;
            let end = inner.find('"')?;
            tags.push(inner[..end].to_owned());
            rest = &inner[end + 1..];
            let next = rest.trim_start_matches([' ', '\t']);
            if !(next.is_empty() || next.starts_with(',')) {
                return None;
            }
            rest = next;
        }
        if tags.is_empty() {
            return None;
        }
        Some(Self::Tags(tags))
    }

    /// Whether the current version (of an existing key) matches, in the
    /// representation about to be sent: a tag of the other one does not.
    pub fn matches(&self, version: Option<&Hlc>, representation: Representation) -> bool {
        match self {
            Self::Any => true,
            Self::Tags(tags) => version.is_some_and(|version| {
                let text = representation.entity_tag(version);
                tags.iter().any(|tag| {
                    *tag == text
                        || (representation == Representation::Raw
                            && Hlc::parse(tag).is_ok_and(|parsed| &parsed == version))
                })
            }),
        }
    }
}

/// The `Fencing-Token` header as an HLC, refused when it is more than 60 s
/// ahead of our clock (the store would refuse it too). Surrounding quotes
/// are accepted, so a version copied from an `ETag` works as is.
pub fn fencing_token(headers: &HeaderMap, now_ms: u64) -> Result<Option<Hlc>, ApiError> {
    let mut values = headers.get_all(FENCING_TOKEN_HEADER).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(ApiError::BadFencingToken("given more than once".into()));
    }
    let text = value
        .to_str()
        .map_err(|_| ApiError::BadFencingToken("not visible ASCII".into()))?;
    parse_fencing_token(text, now_ms).map(Some)
}

/// A fencing token's text (a version, quoted or not) as an HLC, refused
/// when too long or more than 60 s ahead of our clock.
pub fn parse_fencing_token(text: &str, now_ms: u64) -> Result<Hlc, ApiError> {
    if text.len() > MAX_FENCING_TOKEN_BYTES {
        return Err(ApiError::BadFencingToken(format!(
            "longer than {MAX_FENCING_TOKEN_BYTES} bytes"
        )));
    }
    let text = text.trim();
    let text = text
        .strip_prefix('"')
        .and_then(|inner| inner.strip_suffix('"'))
        .unwrap_or(text);
    let token = Hlc::parse(text).map_err(|error| ApiError::BadFencingToken(error.to_string()))?;
    if token.is_too_far_ahead_of(now_ms) {
        return Err(ApiError::FencingTokenTooFarAhead);
    }
    Ok(token)
}

/// Whether the client asked for the JSON form: `application/json` listed
/// with a non-zero weight greater than any explicit `application/octet-stream`.
pub fn wants_json(headers: &HeaderMap) -> bool {
    let json = accept_weight(headers, "application/json");
    let octets = accept_weight(headers, "application/octet-stream");
    match (json, octets) {
        (Some(json), None) => json > 0.0,
        (Some(json), Some(octets)) => json > 0.0 && json > octets,
        (None, _) => false,
    }
}

#[cfg(test)]
mod tests {
    use axum::http::{HeaderValue, Uri};

    use super::*;

    fn uri(text: &str) -> Uri {
        text.parse().unwrap()
    }

    #[test]
    fn text_is_chosen_only_when_preferred() {
        let accept = |value: &'static str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::ACCEPT, HeaderValue::from_static(value));
            prefers_text(&headers)
        };
        assert!(accept("text/plain"));
        assert!(accept("text/plain, application/json;q=0.5"));
        assert!(!accept("*/*"));
        assert!(!accept("application/json, text/plain"));
        assert!(!accept("text/plain;q=0"));
        assert!(!prefers_text(&HeaderMap::new()));
    }

    #[test]
    fn key_is_percent_decoded_to_raw_bytes() {
        let key = key_from_path(uri("/keys/a%2Fb/c%00%ff+x").path(), 1024).unwrap();
        assert_eq!(key.as_ref(), b"a/b/c\x00\xff+x");
    }

    #[test]
    fn every_byte_round_trips_through_the_key_path() {
        let all: Vec<u8> = (0..=255).collect();
        let encoded: String = all.iter().map(|byte| format!("%{byte:02X}")).collect();
        let key = key_from_path(uri(&format!("/keys/{encoded}")).path(), 1024).unwrap();
        assert_eq!(key.as_ref(), all.as_slice());
    }

    #[test]
    fn malformed_escapes_are_refused() {
        for path in [
            "/keys/%zz",
            "/keys/%4",
            "/keys/a%",
            "/keys/%g0x",
            "/keys/ok%2",
        ] {
            assert!(
                matches!(
                    key_from_path(uri(path).path(), 1024),
                    Err(ApiError::BadPercentEncoding("key"))
                ),
                "{path}"
            );
        }
    }

    #[test]
    fn empty_and_oversized_keys_are_refused() {
        assert!(matches!(
            key_from_path(uri("/keys/").path(), 10),
            Err(ApiError::EmptyKey)
        ));
        assert!(matches!(
            key_from_path(uri("/keys/0123456789a").path(), 10),
            Err(ApiError::KeyTooLong { len: 11, max: 10 })
        ));
        assert!(key_from_path(uri("/keys/0123456789").path(), 10).is_ok());
        // Thirty escapes decode to ten bytes: within the limit.
        let escaped = "%41".repeat(10);
        assert!(key_from_path(uri(&format!("/keys/{escaped}")).path(), 10).is_ok());
        // A path too long to fit is refused without decoding.
        let long = "%41".repeat(11);
        assert!(matches!(
            key_from_path(uri(&format!("/keys/{long}")).path(), 10),
            Err(ApiError::KeyTooLong { .. })
        ));
    }

    #[test]
    fn query_plus_is_a_space_and_escapes_are_strict() {
        assert_eq!(
            percent_decode_strict(b"a+b%2B%00", true).unwrap(),
            b"a b+\x00"
        );
        assert_eq!(percent_decode_strict(b"a+b", false).unwrap(), b"a+b");
        assert!(percent_decode_strict(b"%zz", true).is_none());
    }

    #[test]
    fn query_refuses_unknown_and_repeated_parameters() {
        let mut params = QueryParams::parse(Some("ttl=30s&nex=true"), &["ttl", "nex"]).unwrap();
        assert_eq!(params.take("ttl").unwrap(), b"30s");
        assert!(params.take_bool("nex").unwrap());
        assert!(!params.take_bool("persist").unwrap());
        assert!(matches!(
            QueryParams::parse(Some("tll=30s"), &["ttl"]),
            Err(ApiError::BadQuery(_))
        ));
        assert!(matches!(
            QueryParams::parse(Some("ttl=1&ttl=2"), &["ttl"]),
            Err(ApiError::BadQuery(_))
        ));
        assert!(matches!(
            QueryParams::parse(Some("x=1"), &[]),
            Err(ApiError::BadQuery(_))
        ));
        assert!(matches!(
            QueryParams::parse(Some("ttl=%zz"), &["ttl"]),
            Err(ApiError::BadPercentEncoding("query"))
        ));
        let mut params = QueryParams::parse(Some("nex=maybe"), &["nex"]).unwrap();
        assert!(matches!(
            params.take_bool("nex"),
            Err(ApiError::BadQuery(_))
        ));
    }

    #[test]
    fn ttl_accepts_units_and_plain_milliseconds() {
        assert_eq!(parse_ttl(b"30s").unwrap(), 30_000);
        assert_eq!(parse_ttl(b"500ms").unwrap(), 500);
        assert_eq!(parse_ttl(b"2m").unwrap(), 120_000);
        assert_eq!(parse_ttl(b"1500").unwrap(), 1_500);
        for bad in [&b"0"[..], b"0s", b"", b"-1", b"1.5s", b"10x", b"s", b"\xff"] {
            assert!(
                matches!(parse_ttl(bad), Err(ApiError::BadTtl(_))),
                "{bad:?}"
            );
        }
        assert!(matches!(
            parse_ttl(b"99999999999999999999"),
            Err(ApiError::BadTtl(_))
        ));
    }

    #[test]
    fn if_none_match_parses_star_lists_and_weak_tags() {
        assert_eq!(IfNoneMatch::parse("*"), Some(IfNoneMatch::Any));
        assert_eq!(
            IfNoneMatch::parse(r#""a", W/"b",  "c,d""#),
            Some(IfNoneMatch::Tags(vec![
                "a".into(),
                "b".into(),
                "c,d".into()
            ]))
        );
        for bad in ["", "a", r#""a"x"#, r#""a"#, "W/", r#""a" "b""#] {
            assert_eq!(IfNoneMatch::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn if_none_match_compares_versions_as_clocks() {
        let version = Hlc::parse("1696374425000:1:StateStore").unwrap();
        let raw = Representation::Raw;
        let padded = IfNoneMatch::parse(&format!("W/\"x\", \"{version}\"")).unwrap();
        assert!(padded.matches(Some(&version), raw));
        let unpadded = IfNoneMatch::parse("\"1696374425000:1:StateStore\"").unwrap();
        assert!(unpadded.matches(Some(&version), raw));
        let other = IfNoneMatch::parse("\"1696374425000:2:StateStore\"").unwrap();
        assert!(!other.matches(Some(&version), raw));
        assert!(!other.matches(None, raw));
        assert!(IfNoneMatch::Any.matches(None, raw));
    }

    #[test]
    fn if_none_match_tells_the_json_form_from_the_raw_one() {
        let version = Hlc::parse("1696374425000:1:StateStore").unwrap();
        let json = IfNoneMatch::parse(&format!("\"{version}+json\"")).unwrap();
        assert!(json.matches(Some(&version), Representation::Json));
        assert!(!json.matches(Some(&version), Representation::Raw));
        let raw = IfNoneMatch::parse(&format!("\"{version}\"")).unwrap();
        assert!(!raw.matches(Some(&version), Representation::Json));
        assert!(IfNoneMatch::Any.matches(Some(&version), Representation::Json));
    }

    #[test]
    fn if_none_match_lines_are_combined_and_bad_ones_refused() {
        let mut headers = HeaderMap::new();
        headers.append(header::IF_NONE_MATCH, HeaderValue::from_static("\"a\""));
        headers.append(header::IF_NONE_MATCH, HeaderValue::from_static("\"b\""));
        assert_eq!(
            IfNoneMatch::from_headers(&headers).unwrap(),
            Some(IfNoneMatch::Tags(vec!["a".into(), "b".into()]))
        );
        headers.insert(header::IF_NONE_MATCH, HeaderValue::from_static("nope"));
        assert!(IfNoneMatch::from_headers(&headers).is_err());
        assert_eq!(IfNoneMatch::from_headers(&HeaderMap::new()).unwrap(), None);
    }

    #[test]
    fn fencing_token_is_parsed_and_checked_against_our_clock() {
        let now = 1_700_000_000_000;
        let mut headers = HeaderMap::new();
        assert_eq!(fencing_token(&headers, now).unwrap(), None);
        headers.insert(
            FENCING_TOKEN_HEADER,
            HeaderValue::from_static("\"001700000000000:00003:StateStore\""),
        );
        let token = fencing_token(&headers, now).unwrap().unwrap();
        assert_eq!((token.wall_ms, token.counter), (now, 3));
        headers.insert(
            FENCING_TOKEN_HEADER,
            HeaderValue::from_static("1700000061000:0:x"),
        );
        assert!(matches!(
            fencing_token(&headers, now),
            Err(ApiError::FencingTokenTooFarAhead)
        ));
        headers.insert(FENCING_TOKEN_HEADER, HeaderValue::from_static("12:ab:x"));
        assert!(matches!(
            fencing_token(&headers, now),
            Err(ApiError::BadFencingToken(_))
        ));
    }

    #[test]
    fn a_fencing_token_too_long_for_mqtt_is_refused() {
        let now = 1_700_000_000_000;
        let token = |node_len: usize| {
            let text = format!("{now}:0:{}", "n".repeat(node_len));
            let mut headers = HeaderMap::new();
            headers.insert(FENCING_TOKEN_HEADER, HeaderValue::from_str(&text).unwrap());
            fencing_token(&headers, now)
        };
        let fits = MAX_FENCING_TOKEN_BYTES - "1700000000000:0:".len();
        assert!(token(fits).unwrap().is_some());
        assert!(matches!(token(fits + 1), Err(ApiError::BadFencingToken(_))));
        assert!(matches!(token(70_000), Err(ApiError::BadFencingToken(_))));
    }

    #[test]
    fn json_is_chosen_only_when_preferred() {
        let accept = |value: &'static str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::ACCEPT, HeaderValue::from_static(value));
            wants_json(&headers)
        };
        assert!(accept("application/json"));
        assert!(accept("text/html, application/json;q=0.9"));
        assert!(accept("application/JSON"));
        assert!(!accept("*/*"));
        assert!(!accept("application/json;q=0"));
        assert!(!accept("application/octet-stream, application/json"));
        assert!(accept("application/octet-stream;q=0.5, application/json"));
        assert!(!wants_json(&HeaderMap::new()));
    }
}

#[cfg(test)]
mod proptests {
    use super::*;
    use axum::http::{HeaderValue, Uri};
    use percent_encoding::{AsciiSet, CONTROLS, NON_ALPHANUMERIC};
    use proptest::prelude::*;

    /// What must be escaped in a path segment so it parses as one URI path.
    const PATH: &AsciiSet = &CONTROLS
        .add(b' ')
        .add(b'"')
        .add(b'#')
        .add(b'%')
        .add(b'<')
        .add(b'>')
        .add(b'?')
        .add(b'`')
        .add(b'{')
        .add(b'}')
        .add(b'\\')
        .add(b'^')
        .add(b'|');

    /// Text made of what URIs and escapes are made of.
    fn escape_like() -> impl Strategy<Value = String> {
        "(%|%[0-9a-fA-F]{0,2}|%[g-zG-Z]{1,2}|\\+|/|[a-z0-9]{1,3}|[\u{80}-\u{10ffff}])*"
    }

    /// Percent-encodes every byte, or just the ones that must be, or a mix.
    fn encode_key(key: &[u8], style: u8) -> String {
        match style % 3 {
            0 => percent_encoding::percent_encode(key, NON_ALPHANUMERIC).to_string(),
            1 => key.iter().map(|byte| format!("%{byte:02x}")).collect(),
            _ => percent_encoding::percent_encode(key, PATH).to_string(),
        }
    }

    fn headers(name: &'static str, value: &[u8]) -> Option<HeaderMap> {
        let value = HeaderValue::from_bytes(value).ok()?;
        let mut headers = HeaderMap::new();
        headers.insert(name, value);
        Some(headers)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]

        #[test]
        fn strict_decoding_never_panics(input in prop::collection::vec(any::<u8>(), 0..64), plus in any::<bool>()) {
            if let Some(decoded) = percent_decode_strict(&input, plus) {
                prop_assert!(decoded.len() <= input.len());
            }
        }

        #[test]
        fn strict_decoding_of_escape_like_text_agrees_with_its_rule(text in escape_like()) {
            let bytes = text.as_bytes();
            let well_formed = bytes.iter().enumerate().all(|(i, &byte)| {
                byte != b'%'
                    || bytes.get(i + 1..i + 3).is_some_and(|hex| hex.iter().all(u8::is_ascii_hexdigit))
            });
            prop_assert_eq!(percent_decode_strict(bytes, false).is_some(), well_formed);
        }

        #[test]
        fn encoded_bytes_decode_back(bytes in prop::collection::vec(any::<u8>(), 0..64), style in any::<u8>()) {
            let encoded = encode_key(&bytes, style);
            prop_assert_eq!(percent_decode_strict(encoded.as_bytes(), false), Some(bytes.clone()));
            // Form encoding: a space may be written `+`, a plus must be escaped.
            let form = encoded.replace('+', "%2B").replace("%20", "+");
            prop_assert_eq!(percent_decode_strict(form.as_bytes(), true), Some(bytes));
        }

        #[test]
        fn any_key_within_the_limit_survives_the_path(
            key in prop::collection::vec(any::<u8>(), 1..=64),
            style in any::<u8>(),
        ) {
            let path = format!("/keys/{}", encode_key(&key, style));
            let uri: Uri = path.parse().map_err(|e| TestCaseError::fail(format!("{path}: {e}")))?;
            prop_assert_eq!(key_from_path(uri.path(), 64).map_err(|e| e.to_string()), Ok(Bytes::from(key)));
        }

        #[test]
        fn keys_over_the_limit_are_414(key in prop::collection::vec(any::<u8>(), 17..64), style in any::<u8>()) {
            let raw = encode_key(&key, style);
            let error = decode_key(&raw, false, 16).map(|_| ());
            prop_assert!(matches!(error, Err(ApiError::KeyTooLong { .. })), "{error:?}");
            prop_assert_eq!(
                error.map_err(|e| e.problem().status),
                Err(414)
            );
        }

        #[test]
        fn any_path_gives_a_key_or_a_client_error(text in escape_like(), max in 1usize..32, plus in any::<bool>()) {
            match decode_key(&text, plus, max) {
                Ok(key) => prop_assert!(!key.is_empty() && key.len() <= max),
                Err(error) => {
                    let status = error.problem().status;
                    prop_assert!(status == 400 || status == 414, "{error:?}");
                }
            }
            let _ = key_from_path(&text, max);
        }

        #[test]
        fn any_ttl_is_positive_milliseconds_or_400(raw in prop::collection::vec(any::<u8>(), 0..24)) {
            match parse_ttl(&raw) {
                Ok(ms) => prop_assert!(ms > 0),
                Err(error) => prop_assert_eq!(error.problem().status, 400),
            }
        }

        #[test]
        fn ttls_with_units_are_exact(n in 1u64..1_000_000, unit in 0usize..5) {
            let (suffix, scale) = [("", 1), ("ms", 1), ("s", 1_000), ("m", 60_000), ("h", 3_600_000)][unit];
            prop_assert_eq!(
                parse_ttl(format!("{n}{suffix}").as_bytes()).map_err(|e| e.to_string()),
                Ok(n * scale)
            );
        }

        #[test]
        fn if_none_match_parses_or_refuses_any_text(text in "[ \t,*W/\"a-z0-9]{0,32}") {
            if let Some(IfNoneMatch::Tags(tags)) = IfNoneMatch::parse(&text) {
                prop_assert!(!tags.is_empty());
                prop_assert!(tags.iter().all(|tag| !tag.contains('"')));
            }
        }

        #[test]
        fn if_none_match_lists_give_back_their_tags(
            tags in prop::collection::vec(("[!#-~]{0,20}", any::<bool>()), 1..6)
        ) {
            let text = tags
                .iter()
                .map(|(tag, weak)| format!("{}\"{tag}\"", if *weak { "W/" } else { "" }))
                .collect::<Vec<_>>()
                .join(", ");
            let expected: Vec<String> = tags.into_iter().map(|(tag, _)| tag).collect();
            prop_assert_eq!(IfNoneMatch::parse(&text), Some(IfNoneMatch::Tags(expected)));
        }

        #[test]
        fn any_fencing_token_header_is_a_clock_or_400(value in prop::collection::vec(any::<u8>(), 0..48)) {
            if let Some(headers) = headers(FENCING_TOKEN_HEADER, &value) {
                match fencing_token(&headers, 1_700_000_000_000) {
                    Ok(token) => prop_assert!(token.is_some()),
                    Err(error) => prop_assert_eq!(error.problem().status, 400),
                }
            }
        }

        #[test]
        fn versions_are_valid_fencing_tokens_quoted_or_not(
            wall in 0u64..1_700_000_060_000,
            counter in any::<u64>(),
            node in "[!-9;-~]{0,16}",
            quoted in any::<bool>(),
        ) {
            let version = Hlc { wall_ms: wall, counter, node: node.into() };
            let text = if quoted { format!("\"{version}\"") } else { version.to_string() };
            let headers = headers(FENCING_TOKEN_HEADER, text.as_bytes())
                .ok_or_else(|| TestCaseError::fail("not a header value"))?;
            prop_assert_eq!(
                fencing_token(&headers, 1_700_000_000_000).map_err(|e| e.to_string()),
                Ok(Some(version))
            );
        }

        #[test]
        fn any_query_is_parsed_or_refused_with_400(query in "[a-z=&%+0-9]{0,40}") {
            if let Err(error) = QueryParams::parse(Some(&query), &["ttl", "nex", "persist", "value"]) {
                prop_assert_eq!(error.problem().status, 400);
            }
        }

        #[test]
        fn any_accept_header_is_a_choice(value in "[a-z/*;=., 0-9qQ-]{0,48}") {
            if let Some(headers) = headers("accept", value.as_bytes()) {
                let _ = wants_json(&headers);
            }
        }
    }
}
