//! The key API: `GET`/`HEAD`/`PUT`/`DELETE /keys/{key}` onto the store's
//! GET, SET, DEL and VDEL.
//!
//! Keys are the rest of the path, percent-decoded to raw bytes (any byte,
//! `/` included), so the path is read from the request URI rather than with
//! axum's `Path`, which insists on UTF-8. Query values (`?value=`) are
//! form-encoded: `+` is a space there, as browsers and HTTP clients write
//! it, while `+` in the key path is a plus (RFC 3986).

use std::pin::Pin;
use std::task::{Context, Poll};

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::{Bytes, BytesMut};
use futures_util::Stream;
use serde_json::json;

use super::extract::{
    Conditions, DeclaredLength, FencingToken, IfNoneMatch, Key, Query, parse_ttl, read_body,
};
use crate::http::headers::{Representation, set_common_headers, set_etag, set_read_headers};
use crate::http::problem::{ApiError, Precondition};
use crate::http::state::AppState;
use crate::mqtt::RequestOptions;
use crate::protocol::{Hlc, SetCondition, SetOptions};
use crate::store::{DelOutcome, SetOutcome, VdelOutcome, Versioned};

/// The key routes. `/keys/` alone is an empty key (400); methods other than
/// GET, HEAD, PUT and DELETE get 405 with `Allow`.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route(
            "/keys/",
            get(empty_key)
                .put(empty_key)
                .delete(empty_key)
                .fallback(method_not_allowed),
        )
        .route(
            "/keys/{*key}",
            get(get_key)
                .put(put_key)
                .delete(delete_key)
                .fallback(method_not_allowed),
        )
}

async fn empty_key() -> ApiError {
    ApiError::EmptyKey
}

/// axum adds the `Allow` header to what a method router's fallback returns.
pub(crate) async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}

/// `GET`/`HEAD /keys/{key}`: the raw value, or JSON with `Accept: application/json`.
async fn get_key(
    State(state): State<AppState>,
    Key(key): Key,
    query: Query,
    conditions: Conditions,
    representation: Representation,
) -> Result<Response, ApiError> {
    query.accept(&[])?;
    let outcome = KeyCommand::Get { key: key.clone() }.send(&state).await?;
    let Versioned { value, version } = match respond(outcome)? {
        Answer::Value(versioned) => versioned,
        other => return Ok(other.into_response()),
    };
    if conditions
        .if_none_match
        .is_some_and(|condition| condition.matches(version.as_ref(), representation))
    {
        return Ok(not_modified(version.as_ref(), representation));
    }
    Ok(value_response(
        &key,
        value,
        version.as_ref(),
        representation,
    ))
}

/// `PUT /keys/{key}`: SET, with `If-None-Match: *` (NX), `?nex=true` (NEX),
/// `?ttl=` (PX), `?persist=true` and `Fencing-Token`.
async fn put_key(
    State(state): State<AppState>,
    Key(key): Key,
    query: Query,
    conditions: Conditions,
    FencingToken(fencing_token): FencingToken,
    DeclaredLength(declared): DeclaredLength,
    mut body: Body,
) -> Result<Response, ApiError> {
    let mut query = query.accept(&["ttl", "nex", "persist"])?;
    let ttl_ms = query.take("ttl").map(|raw| parse_ttl(&raw)).transpose()?;
    let nex = query.take_bool("nex")?;
    let persist = query.take_bool("persist")?;
    conditions.refuse_if_match()?;
    let only_if_absent = match conditions.if_none_match {
        None => false,
        Some(IfNoneMatch::Any) => true,
        Some(IfNoneMatch::Tags(_)) => {
            return Err(ApiError::BadHeader(
                "PUT supports only If-None-Match: * (create only); entity tags cannot be compared atomically".into(),
            ));
        }
    };
    let condition = set_condition(only_if_absent, nex)?;
    let value = read_body(
        &mut body,
        declared,
        state.value_limit(),
        state.request_timeout(),
    )
    .await?;
    let command = KeyCommand::Set {
        key,
        value,
        options: SetOptions {
            condition,
            expires_in_ms: ttl_ms,
        },
        envelope: RequestOptions {
            fencing_token,
            persist,
            ..RequestOptions::default()
        },
    };
    Ok(respond(command.send(&state).await?)?.into_response())
}

/// `DELETE /keys/{key}`: DEL, or VDEL with `?value=`; `Fencing-Token` too.
async fn delete_key(
    State(state): State<AppState>,
    Key(key): Key,
    query: Query,
    conditions: Conditions,
    FencingToken(fencing_token): FencingToken,
) -> Result<Response, ApiError> {
    let expected = query.accept(&["value"])?.take("value").map(Bytes::from);
    conditions.refuse_if_match()?;
    if conditions.if_none_match.is_some() {
        return Err(ApiError::BadHeader(
            "DELETE does not support If-None-Match; use ?value= to delete only a given value"
                .into(),
        ));
    }
    let command = KeyCommand::Delete {
        key,
        expected,
        fencing_token,
    };
    Ok(respond(command.send(&state).await?)?.into_response())
}

/// The store command of a write's conditions: `If-None-Match: *` (NX) and
/// `nex=true` (NEX) exclude each other.
pub(super) fn set_condition(only_if_absent: bool, nex: bool) -> Result<SetCondition, ApiError> {
    match (only_if_absent, nex) {
        (true, true) => Err(ApiError::ConflictingConditions),
        (true, false) => Ok(SetCondition::OnlyIfMissing),
        (false, true) => Ok(SetCondition::OnlyIfMissingOrEqual),
        (false, false) => Ok(SetCondition::Always),
    }
}

/// A key request, parsed and checked: what a one-key request and each op
/// of a batch send to the store.
#[derive(Debug)]
pub(super) enum KeyCommand {
    /// GET.
    Get {
        /// The key.
        key: Bytes,
    },
    /// SET, with its condition, expiry, fencing token and persistence.
    Set {
        /// The key.
        key: Bytes,
        /// The value.
        value: Bytes,
        /// NX/NEX and PX.
        options: SetOptions,
        /// Fencing token and persistence.
        envelope: RequestOptions,
    },
    /// DEL, or VDEL with the value the key must hold.
    Delete {
        /// The key.
        key: Bytes,
        /// VDEL's value; `None`: DEL.
        expected: Option<Bytes>,
        /// Fences the delete when given.
        fencing_token: Option<Hlc>,
    },
}

impl KeyCommand {
    /// The key the command is about.
    pub(super) fn key(&self) -> &Bytes {
        match self {
            Self::Get { key } | Self::Set { key, .. } | Self::Delete { key, .. } => key,
        }
    }

    /// Sends the command to the store: what the store did, or why it has
    /// no outcome. A key it sets is told to the watch hub, so that the
    /// patterns that match follow it now, not at their next rescan.
    pub(super) async fn send(self, state: &AppState) -> Result<KeyOutcome, ApiError> {
        let store = &state.store;
        Ok(match self {
            Self::Get { key } => KeyOutcome::Read(store.get(key).await?),
            Self::Set {
                key,
                value,
                options,
                envelope,
            } => {
                let condition = options.condition;
                let outcome = store.set(key.clone(), value, options, &envelope).await?;
                if let SetOutcome::Applied(_) = outcome {
                    state.hub.wrote(&key);
                }
                KeyOutcome::Written { outcome, condition }
            }
            Self::Delete {
                key,
                expected: Some(value),
                fencing_token,
            } => KeyOutcome::DeletedValue(store.vdel(key, value, fencing_token).await?),
            Self::Delete {
                key,
                expected: None,
                fencing_token,
            } => KeyOutcome::Deleted(store.del(key, fencing_token).await?),
        })
    }
}

/// What a key request came to, as the store client decoded it.
#[derive(Debug)]
pub(super) enum KeyOutcome {
    /// GET: the value, or `None` when the key does not exist.
    Read(Option<Versioned<Bytes>>),
    /// PUT: what SET did under its condition.
    Written {
        outcome: SetOutcome,
        condition: SetCondition,
    },
    /// DELETE: what DEL did.
    Deleted(DelOutcome),
    /// DELETE with `?value=`: what VDEL did.
    DeletedValue(VdelOutcome),
}

/// A key request's success, before it is written as a response (one-key)
/// or as a batch result.
#[derive(Debug)]
pub(super) enum Answer {
    /// 200 with the value and its version.
    Value(Versioned<Bytes>),
    /// A write's status (200, or 201 when created only if absent) and
    /// the new version.
    Written(StatusCode, Option<Hlc>),
    /// 204, with the version of the delete.
    Deleted(Option<Hlc>),
}

impl Answer {
    /// The HTTP status of the answer.
    pub(super) fn status(&self) -> StatusCode {
        match self {
            Self::Value(_) => StatusCode::OK,
            Self::Written(status, _) => *status,
            Self::Deleted(_) => StatusCode::NO_CONTENT,
        }
    }

    /// The key's version after the request.
    pub(super) fn version(&self) -> Option<&Hlc> {
        match self {
            Self::Value(versioned) => versioned.version.as_ref(),
            Self::Written(_, version) | Self::Deleted(version) => version.as_ref(),
        }
    }
}

/// A write's answer: `{"version"}` and the `ETag`, or 204 with the
/// deleted version in the `ETag`. (Reads are written by [`get_key`], whose
/// form depends on `Accept` and `If-None-Match`.)
impl IntoResponse for Answer {
    fn into_response(self) -> Response {
        let status = self.status();
        let mut http = match &self {
            Self::Deleted(_) => {
                let mut http = status.into_response();
                set_common_headers(http.headers_mut(), "");
                http
            }
            _ => {
                let text = self.version().map(Hlc::encode);
                let body = serde_json::to_vec(&json!({ "version": text })).unwrap_or_default();
                let mut http = (status, body).into_response();
                set_common_headers(http.headers_mut(), "application/json");
                http
            }
        };
        set_etag(http.headers_mut(), self.version());
        http
    }
}

/// The one mapping from a store outcome to an answer and its status
/// (failures: [`ApiError::problem`]), for one-key requests and batch ops alike.
pub(super) fn respond(outcome: KeyOutcome) -> Result<Answer, ApiError> {
    match outcome {
        KeyOutcome::Read(Some(versioned)) => Ok(Answer::Value(versioned)),
        KeyOutcome::Read(None)
        | KeyOutcome::Deleted(DelOutcome::Missing)
        | KeyOutcome::DeletedValue(VdelOutcome::Missing) => Err(ApiError::KeyNotFound),
        KeyOutcome::Written {
            outcome: SetOutcome::Applied(version),
            condition,
        } => {
            let status = if condition == SetCondition::OnlyIfMissing {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            Ok(Answer::Written(status, version))
        }
        KeyOutcome::Written {
            outcome: SetOutcome::NotApplied,
            condition,
        } => Err(ApiError::PreconditionFailed(match condition {
            SetCondition::OnlyIfMissing => Precondition::KeyAbsent,
            _ => Precondition::AbsentOrEqual,
        })),
        KeyOutcome::Deleted(DelOutcome::Deleted(version))
        | KeyOutcome::DeletedValue(VdelOutcome::Deleted(version)) => Ok(Answer::Deleted(version)),
        KeyOutcome::DeletedValue(VdelOutcome::ValueDiffers) => {
            Err(ApiError::PreconditionFailed(Precondition::ValueMatches))
        }
    }
}

fn not_modified(version: Option<&Hlc>, representation: Representation) -> Response {
    let mut response = StatusCode::NOT_MODIFIED.into_response();
    set_common_headers(response.headers_mut(), "");
    set_read_headers(response.headers_mut(), version, representation);
    response
}

fn value_response(
    key: &[u8],
    value: Bytes,
    version: Option<&Hlc>,
    representation: Representation,
) -> Response {
    let mut response = if representation == Representation::Json {
        let mut response = Response::new(json_document(key, value, version));
        set_common_headers(response.headers_mut(), "application/json");
        response
    } else {
        let mut response = (StatusCode::OK, value).into_response();
        set_common_headers(response.headers_mut(), "application/octet-stream");
        response
    };
    set_read_headers(response.headers_mut(), version, representation);
    response
}

/// Bytes of the value encoded per piece of the JSON form: a multiple of 3,
/// so that only the last piece of base64 has padding.
const JSON_PIECE_BYTES: usize = 48 * 1024;

/// `{"key", "key_base64"?, "value", "value_base64", "version"}`, written
/// piece by piece as the client reads it (see [`value_fields`]).
fn json_document(key: &[u8], value: Bytes, version: Option<&Hlc>) -> Body {
    let key_text = std::str::from_utf8(key).ok();
    let mut head = br#"{"key":"#.to_vec();
    json_into(&mut head, &key_text);
    if key_text.is_none() {
        head.extend_from_slice(br#","key_base64":"#);
        json_into(&mut head, &BASE64.encode(key));
    }
    head.push(b',');
    let mut tail = br#","version":"#.to_vec();
    json_into(&mut tail, &version.map(Hlc::encode));
    tail.push(b'}');
    let pieces = std::iter::once(Bytes::from(head))
        .chain(value_fields(value))
        .chain(std::iter::once(Bytes::from(tail)))
        .map(Ok::<_, std::convert::Infallible>);
    Body::from_stream(futures_util::stream::iter(pieces))
}

/// `text` (UTF-8) as the inside of a JSON string, without its quotes, in
/// pieces of about [`JSON_PIECE_BYTES`] of it, each escaped as it is
/// taken: its escaped form (up to six times its size) is never held whole.
pub(crate) fn json_string_pieces(text: Bytes) -> impl Iterator<Item = Bytes> + Send + 'static {
    let mut text_at = 0;
    std::iter::from_fn(move || {
        if text_at >= text.len() {
            return None;
        }
        // End on a character boundary: not inside a UTF-8 sequence.
        let mut end = (text_at + JSON_PIECE_BYTES).min(text.len());
        while end < text.len() && text[end] & 0xC0 == 0x80 {
            end -= 1;
        }
        let piece = std::str::from_utf8(&text[text_at..end]).unwrap_or_default();
        text_at = end;
        let mut quoted = Vec::with_capacity(piece.len() + 2);
        json_into(&mut quoted, piece);
        // Without the quotes: the pieces are one string.
        let unquoted = 1..quoted.len() - 1;
        Some(Bytes::from(quoted).slice(unquoted))
    })
}

/// `"value":<text or null>,"value_base64":"<base64>"`, in pieces of about
/// [`JSON_PIECE_BYTES`] of the value each: a value's JSON form is up to
/// seven times its size (`\u0000` and base64), so it is never held whole;
/// whoever writes the pieces holds the value and one piece.
pub(super) fn value_fields(value: Bytes) -> impl Iterator<Item = Bytes> + Send + 'static {
    let is_text = std::str::from_utf8(&value).is_ok();
    let (opening, middle): (&'static [u8], &'static [u8]) = if is_text {
        (br#""value":""#, br#"","value_base64":""#)
    } else {
        (br#""value":null"#, br#","value_base64":""#)
    };
    let text_pieces = is_text
        .then(|| json_string_pieces(value.clone()))
        .into_iter()
        .flatten();
    let mut base64_at = 0;
    let base64_pieces = std::iter::from_fn(move || {
        if base64_at >= value.len() {
            return None;
        }
        let end = (base64_at + JSON_PIECE_BYTES).min(value.len());
        let piece = BASE64.encode(&value[base64_at..end]);
        base64_at = end;
        Some(Bytes::from(piece))
    });
    std::iter::once(Bytes::from_static(opening))
        .chain(text_pieces)
        .chain(std::iter::once(Bytes::from_static(middle)))
        .chain(base64_pieces)
        .chain(std::iter::once(Bytes::from_static(b"\"")))
}

/// Pieces smaller than this that are ready together go out as one chunk:
/// a batch's or listing's small entries are not a chunk (and a write) each.
const JOINED_BYTES: usize = 16 * 1024;

/// The pieces of a JSON answer, those ready at once joined up to
/// [`JOINED_BYTES`]; a piece that size or larger goes out as it is.
pub(crate) struct Joined<S> {
    pieces: Pin<Box<S>>,
    ended: bool,
}

impl<S: Stream<Item = Bytes>> Joined<S> {
    pub(crate) fn new(pieces: S) -> Self {
        Self {
            pieces: Box::pin(pieces),
            ended: false,
        }
    }
}

impl<S: Stream<Item = Bytes>> Stream for Joined<S> {
    type Item = Bytes;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        if self.ended {
            return Poll::Ready(None);
        }
        let mut joined = BytesMut::new();
        loop {
            let ready = match self.pieces.as_mut().poll_next(cx) {
                Poll::Ready(Some(piece)) if joined.is_empty() && piece.len() >= JOINED_BYTES => {
                    return Poll::Ready(Some(piece));
                }
                Poll::Ready(Some(piece)) => {
                    joined.extend_from_slice(&piece);
                    if joined.len() < JOINED_BYTES {
                        continue;
                    }
                    joined
                }
                Poll::Ready(None) => {
                    self.ended = true;
                    joined
                }
                Poll::Pending => joined,
            };
            return match ready.is_empty() {
                true if self.ended => Poll::Ready(None),
                true => Poll::Pending,
                false => Poll::Ready(Some(ready.freeze())),
            };
        }
    }
}

/// Appends the JSON of `value` (a string, `null`, ...).
pub(crate) fn json_into(out: &mut Vec<u8>, value: &(impl serde::Serialize + ?Sized)) {
    // Writing strings and options to a Vec cannot fail.
    let _ = serde_json::to_writer(out, value);
}

#[cfg(test)]
mod tests {
    use axum::http::header;

    use super::*;

    #[test]
    fn json_value_has_base64_and_null_for_non_utf8() {
        let version = Hlc::parse("1:2:S").unwrap();
        let response = value_response(
            b"k\xff",
            Bytes::from_static(b"\x00\xfe"),
            Some(&version),
            Representation::Json,
        );
        assert_eq!(response.headers()[header::CONTENT_TYPE], "application/json");
        assert_eq!(
            response.headers()[header::ETAG],
            "\"000000000000001:00002:S+json\""
        );
        assert_eq!(response.headers()[header::VARY], "Accept");
    }

    #[tokio::test]
    async fn the_json_form_written_in_pieces_is_the_whole_document() {
        use http_body_util::BodyExt as _;
        let version = Hlc::parse("1:2:S").unwrap();
        // Multi-byte characters across piece boundaries, quotes and control
        // characters, bytes that are not UTF-8, nothing at all.
        let text = "é\"\u{0}😀\n".repeat(JSON_PIECE_BYTES / 3);
        let mut binary = text.clone().into_bytes();
        binary.push(0xff);
        for (key, value) in [
            (&b"k"[..], text.into_bytes()),
            (b"k\xff", binary),
            (b"k", Vec::new()),
            (b"k", b"x".repeat(3 * JSON_PIECE_BYTES)),
        ] {
            let response = value_response(
                key,
                Bytes::from(value.clone()),
                Some(&version),
                Representation::Json,
            );
            let body = response.into_body().collect().await.unwrap().to_bytes();
            let document: serde_json::Value = serde_json::from_slice(&body).unwrap();
            let key_text = std::str::from_utf8(key).ok();
            let mut expected = json!({
                "key": key_text,
                "value": std::str::from_utf8(&value).ok(),
                "value_base64": BASE64.encode(&value),
                "version": "000000000000001:00002:S",
            });
            if key_text.is_none() {
                expected["key_base64"] = BASE64.encode(key).into();
            }
            assert_eq!(document, expected);
        }
    }
}
