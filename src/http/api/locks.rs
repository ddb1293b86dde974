//! `/locks/{name}`: acquire (and wait), release and read a lock, the
//! SDKs' way (see [`crate::locks`]).
//!
//! - `PUT ?holder=&ttl=[&wait=]`: 200 `{name, holder, fencing_token}` and
//!   `Fencing-Token`; 409 naming the holder.
//! - `DELETE ?holder=`: 204; 409 another holds it; 404 nobody does.
//!
//! Taking and releasing need Write on the name; a 409 names the holder
//! and its fencing token (the key's value and version) only to a caller
//! that may also Read it. A request that waits needs Write still when its
//! turn to try comes (the rules may have been reloaded meanwhile).
//! - `GET`: 200 `{name, holder, fencing_token}`; 404 nobody holds it.

use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;
use serde_json::json;

use super::extract::{FENCING_TOKEN_HEADER, Key, Query, parse_ttl};
use super::keys::method_not_allowed;
use crate::access::rules::{Access, Need};
use crate::http::headers::set_common_headers;
use crate::http::problem::ApiError;
use crate::http::state::AppState;
use crate::locks::{Acquire, Acquired, Holding, LockSettings, Released};
use crate::protocol::Hlc;
use crate::settings::parse_duration;

/// Where lock routes start; the guard gives them the longest wait on top
/// of its backstop.
pub const LOCKS_PREFIX: &str = "/locks/";

/// The lock routes.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route(
            "/locks/",
            get(empty_name)
                .put(empty_name)
                .delete(empty_name)
                .fallback(method_not_allowed),
        )
        .route(
            "/locks/{*name}",
            get(get_lock)
                .put(put_lock)
                .delete(delete_lock)
                .fallback(method_not_allowed),
        )
}

async fn empty_name() -> ApiError {
    ApiError::EmptyKey
}

/// `PUT /locks/{name}?holder=&ttl=[&wait=]`: acquire or renew.
async fn put_lock(
    State(state): State<AppState>,
    access: Access,
    Key(name): Key,
    query: Query,
) -> Result<Response, ApiError> {
    let mut query = query.accept(&["holder", "ttl", "wait"])?;
    let settings = state.locks.settings();
    let holder = holder(query.take("holder"), settings)?;
    let ttl_ms = match query.take("ttl") {
        Some(raw) => parse_ttl(&raw)?,
        None => {
            return Err(ApiError::BadTtl(
                "(missing: a lock needs ttl=, the time it lasts unless renewed)".into(),
            ));
        }
    };
    let wait = query
        .take("wait")
        .map(|raw| parse_wait(&raw, settings))
        .transpose()?
        .unwrap_or_default();
    let request = Acquire {
        name: name.clone(),
        holder: holder.clone(),
        ttl_ms,
        wait,
    };
    // A request that waits is checked again before each try: a reload of
    // the rules that withdrew its Write meanwhile refuses it (403).
    let allowed = || access.allows_now(&name, Need::Write);
    match state.locks.acquire(&request, &allowed).await? {
        Acquired::Held(fencing_token) => {
            // Patterns that match follow the lock's key now.
            state.hub.wrote(&name);
            Ok(lock_response(
                &name,
                &Holding {
                    holder,
                    fencing_token,
                },
            ))
        }
        Acquired::Refused(holding) => Err(held(&access, &name, holding)),
        Acquired::NotAllowed => Err(access.denied(Need::Write).into()),
    }
}

/// `DELETE /locks/{name}?holder=`: release (VDEL).
async fn delete_lock(
    State(state): State<AppState>,
    access: Access,
    Key(name): Key,
    query: Query,
) -> Result<Response, ApiError> {
    let mut query = query.accept(&["holder"])?;
    let holder = holder(query.take("holder"), state.locks.settings())?;
    match state.locks.release(name.clone(), holder).await? {
        Released::Released => {
            let mut response = StatusCode::NO_CONTENT.into_response();
            set_common_headers(response.headers_mut(), "");
            Ok(response)
        }
        Released::NotHeld => Err(ApiError::LockNotHeld),
        Released::HeldByAnother(holding) => Err(held(&access, &name, holding)),
    }
}

/// The 409 of a lock someone else holds: naming the holder and its
/// fencing token, the key's value and version, only to a caller that may
/// read the key.
fn held(access: &Access, name: &[u8], holding: Option<Holding>) -> ApiError {
    match holding {
        Some(_) if !access.allows(name, Need::Read) => ApiError::LockHeldUnnamed,
        holding => ApiError::LockHeld(holding),
    }
}

/// `GET /locks/{name}`: who holds it.
async fn get_lock(
    State(state): State<AppState>,
    Key(name): Key,
    query: Query,
) -> Result<Response, ApiError> {
    query.accept(&[])?;
    match state.locks.holder(name.clone()).await? {
        Some(holding) => Ok(lock_response(&name, &holding)),
        None => Err(ApiError::LockNotHeld),
    }
}

/// `holder=`: present, non-empty, within the limit.
fn holder(raw: Option<Vec<u8>>, settings: &LockSettings) -> Result<Bytes, ApiError> {
    let Some(raw) = raw else {
        return Err(ApiError::BadHolder(
            "holder= is required: the name the lock is held under".into(),
        ));
    };
    if raw.is_empty() {
        return Err(ApiError::BadHolder("holder= must not be empty".into()));
    }
    if raw.len() > settings.max_holder_bytes {
        return Err(ApiError::BadHolder(format!(
            "holder= is {} bytes long; the limit is {} bytes",
            raw.len(),
            settings.max_holder_bytes
        )));
    }
    Ok(Bytes::from(raw))
}

/// `wait=`: a duration (`0` is "do not wait") up to the configured maximum.
fn parse_wait(raw: &[u8], settings: &LockSettings) -> Result<Duration, ApiError> {
    let shown = String::from_utf8_lossy(raw)
        .chars()
        .take(32)
        .collect::<String>();
    let wait = std::str::from_utf8(raw)
        .ok()
        .and_then(|text| parse_duration(text).ok())
        .ok_or_else(|| {
            ApiError::BadWait(format!(
                "invalid wait {shown:?}: use a duration such as 500ms, 30s, 2m, or plain milliseconds"
            ))
        })?;
    if wait > settings.max_wait {
        return Err(ApiError::BadWait(format!(
            "wait {shown:?} is longer than the gateway's maximum of {} ms",
            settings.max_wait.as_millis()
        )));
    }
    Ok(wait)
}

/// 200 `{name, holder, fencing_token}` (`*_base64` for names that are not
/// UTF-8) with the token in `Fencing-Token`, as writes send it back.
fn lock_response(name: &[u8], holding: &Holding) -> Response {
    let token = holding.fencing_token.as_ref().map(Hlc::to_string);
    let mut document = json!({
        "name": std::str::from_utf8(name).ok(),
        "holder": std::str::from_utf8(&holding.holder).ok(),
        "fencing_token": token,
    });
    if document["name"].is_null() {
        document["name_base64"] = BASE64.encode(name).into();
    }
    if document["holder"].is_null() {
        document["holder_base64"] = BASE64.encode(&holding.holder).into();
    }
    let body = serde_json::to_vec(&document).unwrap_or_default();
    let mut response = (StatusCode::OK, body).into_response();
    set_common_headers(response.headers_mut(), "application/json");
    if let Some(token) = token
        && let Ok(value) = HeaderValue::from_str(&token)
    {
        response
            .headers_mut()
            .insert(HeaderName::from_static(FENCING_TOKEN_HEADER), value);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> LockSettings {
        LockSettings {
            max_wait: Duration::from_secs(60),
            max_holder_bytes: 4,
        }
    }

    #[test]
    fn holder_must_be_present_non_empty_and_short() {
        assert_eq!(
            holder(Some(b"me".to_vec()), &settings()).unwrap(),
            Bytes::from_static(b"me")
        );
        for bad in [None, Some(Vec::new()), Some(b"12345".to_vec())] {
            assert!(matches!(
                holder(bad, &settings()),
                Err(ApiError::BadHolder(_))
            ));
        }
    }

    #[test]
    fn wait_is_a_duration_up_to_the_maximum() {
        assert_eq!(parse_wait(b"0", &settings()).unwrap(), Duration::ZERO);
        assert_eq!(
            parse_wait(b"30s", &settings()).unwrap(),
            Duration::from_secs(30)
        );
        assert_eq!(
            parse_wait(b"1m", &settings()).unwrap(),
            Duration::from_secs(60)
        );
        for bad in [&b"61s"[..], b"soon", b"", b"-1s", b"\xff"] {
            assert!(
                matches!(parse_wait(bad, &settings()), Err(ApiError::BadWait(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_lock_answer_names_holder_and_token_in_body_and_header() {
        let token = Hlc::new(1_700_000_000_000, "StateStore");
        let response = lock_response(
            b"job",
            &Holding {
                holder: Bytes::from_static(b"\xffme"),
                fencing_token: Some(token.clone()),
            },
        );
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(
            response.headers()[FENCING_TOKEN_HEADER].to_str().unwrap(),
            token.to_string()
        );
    }
}
