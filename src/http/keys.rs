//! The key API: `GET`/`HEAD`/`PUT`/`DELETE /keys/{key}` onto the store's
//! GET, SET, DEL and VDEL.
//!
//! Keys are the rest of the path, percent-decoded to raw bytes (any byte,
//! `/` included), so the path is read from the request URI rather than with
//! axum's `Path`, which insists on UTF-8. Query values (`?value=`) are
//! form-encoded: `+` is a space there, as browsers and HTTP clients write
//! it, while `+` in the key path is a plus (RFC 3986).

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use serde_json::json;

use super::extract::{
    Conditions, DeclaredLength, FencingToken, IfNoneMatch, Key, Query, parse_ttl,
};
use super::headers::{Representation, set_common_headers, set_etag, set_read_headers};
use super::problem::{ApiError, Precondition};
use super::state::AppState;
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
pub(super) async fn method_not_allowed() -> ApiError {
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
    let value = state.store.get(key.clone()).await?;
    respond(KeyOutcome::Read {
        key,
        value,
        representation,
        if_none_match: conditions.if_none_match,
    })
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
    body: Body,
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
    let condition = match (only_if_absent, nex) {
        (true, true) => return Err(ApiError::ConflictingConditions),
        (true, false) => SetCondition::OnlyIfMissing,
        (false, true) => SetCondition::OnlyIfMissingOrEqual,
        (false, false) => SetCondition::Always,
    };
    let value = read_value(
        body,
        declared,
        state.value_limit(),
        state.limits.request_timeout,
    )
    .await?;
    let options = SetOptions {
        condition,
        expires_in_ms: ttl_ms,
    };
    let envelope = RequestOptions {
        fencing_token,
        persist,
    };
    let outcome = state
        .store
        .set(key.clone(), value, options, &envelope)
        .await?;
    if let SetOutcome::Applied(_) = outcome {
        // Patterns that match follow the key now, not at their next rescan.
        state.hub.wrote(&key);
    }
    respond(KeyOutcome::Written { outcome, condition })
}

/// `DELETE /keys/{key}`: DEL, or VDEL with `?value=`; `Fencing-Token` too.
async fn delete_key(
    State(state): State<AppState>,
    Key(key): Key,
    query: Query,
    conditions: Conditions,
    FencingToken(fencing_token): FencingToken,
) -> Result<Response, ApiError> {
    let expected = query.accept(&["value"])?.take("value");
    conditions.refuse_if_match()?;
    if conditions.if_none_match.is_some() {
        return Err(ApiError::BadHeader(
            "DELETE does not support If-None-Match; use ?value= to delete only a given value"
                .into(),
        ));
    }
    let outcome = match expected {
        Some(value) => KeyOutcome::DeletedValue(
            state
                .store
                .vdel(key, Bytes::from(value), fencing_token)
                .await?,
        ),
        None => KeyOutcome::Deleted(state.store.del(key, fencing_token).await?),
    };
    respond(outcome)
}

/// What a key request came to, as the store client decoded it.
#[derive(Debug)]
enum KeyOutcome {
    /// GET: the value, or `None` when the key does not exist.
    Read {
        key: Bytes,
        value: Option<Versioned<Bytes>>,
        representation: Representation,
        if_none_match: Option<IfNoneMatch>,
    },
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

/// The one mapping from a store outcome to an HTTP status (failures:
/// [`ApiError::problem`]).
fn respond(outcome: KeyOutcome) -> Result<Response, ApiError> {
    match outcome {
        KeyOutcome::Read {
            key,
            value: Some(Versioned { value, version }),
            representation,
            if_none_match,
        } => {
            if if_none_match
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
        KeyOutcome::Read { value: None, .. }
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
            let text = version.as_ref().map(Hlc::encode);
            let body = serde_json::to_vec(&json!({ "version": text })).unwrap_or_default();
            let mut http = (status, body).into_response();
            set_common_headers(http.headers_mut(), "application/json");
            set_etag(http.headers_mut(), version.as_ref());
            Ok(http)
        }
        KeyOutcome::Written {
            outcome: SetOutcome::NotApplied,
            condition,
        } => Err(ApiError::PreconditionFailed(match condition {
            SetCondition::OnlyIfMissing => Precondition::KeyAbsent,
            _ => Precondition::AbsentOrEqual,
        })),
        KeyOutcome::Deleted(DelOutcome::Deleted(version))
        | KeyOutcome::DeletedValue(VdelOutcome::Deleted(version)) => {
            let mut http = StatusCode::NO_CONTENT.into_response();
            set_common_headers(http.headers_mut(), "");
            set_etag(http.headers_mut(), version.as_ref());
            Ok(http)
        }
        KeyOutcome::DeletedValue(VdelOutcome::ValueDiffers) => {
            Err(ApiError::PreconditionFailed(Precondition::ValueMatches))
        }
    }
}

/// Reads the body up to `limit` bytes: `Content-Length` over the limit is
/// refused before reading, a chunked body as soon as it passes the limit.
async fn read_value(
    body: Body,
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
        let mut stream = body.into_data_stream();
        let mut value = BytesMut::with_capacity(capacity);
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|error| ApiError::BodyRead(error.to_string()))?;
            if value.len() + chunk.len() > limit {
                return Err(ApiError::ValueTooLarge { max: limit });
            }
            value.extend_from_slice(&chunk);
        }
        Ok(value.freeze())
    };
    tokio::time::timeout(within, read)
        .await
        .map_err(|_| ApiError::BodyTimeout(within))?
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
        let key_text = std::str::from_utf8(key).ok();
        let mut document = json!({
            "key": key_text,
            "value": std::str::from_utf8(&value).ok(),
            "value_base64": BASE64.encode(&value),
            "version": version.map(Hlc::encode),
        });
        if key_text.is_none() {
            document["key_base64"] = BASE64.encode(key).into();
        }
        let body = serde_json::to_vec(&document).unwrap_or_default();
        let mut response = (StatusCode::OK, body).into_response();
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
}
