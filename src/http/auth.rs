//! The key API's bearer token: [`ApiToken`] and the middleware that
//! checks it (with the backstop timeout, one layer for both).

use std::borrow::Cow;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::authz::{Authz, Principal};
use super::problem::ApiError;
use super::state::ApiToken;
use super::{extract, locks, watch};

/// Who a request comes from, as the guard established it (a request
/// extension when the key API requires authentication).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// Presented the shared `--api-token-file` token.
    ApiToken,
    /// Presented a valid signed token: its `sub` claim.
    Subject(std::sync::Arc<str>),
}

/// What [`guard`] checks (one middleware for both: each layer costs a
/// service clone and a boxed future per request).
#[derive(Debug, Clone)]
pub(super) struct Guard {
    /// Required as `Authorization: Bearer <token>` when configured.
    pub(super) token: Option<ApiToken>,
    /// The per-key rules, when configured: each request gets its caller's
    /// [`Access`](super::authz::Access) under them.
    pub(super) authz: Option<Authz>,
    /// See [`Limits::backstop`].
    pub(super) backstop: Duration,
    /// Added to the backstop of lock requests, which may wait this long.
    pub(super) lock_wait: Duration,
}

/// The bearer token check (the caller it finds goes into the request's
/// extensions), then the request under the backstop timeout.
pub(super) async fn guard(
    State(guard): State<Guard>,
    mut request: Request,
    next: Next,
) -> Response {
    if let Some(token) = &guard.token {
        let presented = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|value| bearer_token(value.as_bytes()))
            .map(Cow::Borrowed)
            .or_else(|| query_token(&request).map(Cow::Owned));
        if !presented.is_some_and(|presented| token.matches(&presented)) {
            return ApiError::Unauthorized.into_response();
        }
        // Only the rules ask who it is: without them, no extension to
        // allocate per request.
        if guard.authz.is_some() {
            request.extensions_mut().insert(Caller::ApiToken);
        }
    }
    if let Some(authz) = &guard.authz {
        let principal = match request.extensions().get::<Caller>() {
            Some(Caller::ApiToken) => Principal::ApiToken,
            Some(Caller::Subject(subject)) => Principal::Subject(subject.clone()),
            None => Principal::Nobody,
        };
        let access = authz.access(principal);
        request.extensions_mut().insert(access);
    }
    let backstop = if request.uri().path().starts_with(locks::LOCKS_PREFIX) {
        guard.backstop + guard.lock_wait
    } else {
        guard.backstop
    };
    match tokio::time::timeout(backstop, next.run(request)).await {
        Ok(response) => response,
        Err(_) => ApiError::HandlerTimeout(backstop).into_response(),
    }
}

/// The `access_token` query parameter (RFC 6750, section 2.3) of a watch
/// request: a browser's `EventSource` cannot send an `Authorization`
/// header, so a dashboard on a gateway with a token has no other way.
/// Only watch streams take it; the gateway logs paths, never queries.
fn query_token(request: &Request) -> Option<Vec<u8>> {
    if request.method() != Method::GET || !watch::is_watch_path(request.uri().path()) {
        return None;
    }
    let (_, value) = extract::query_pairs(request.uri().query())
        .find(|(name, _)| *name == watch::ACCESS_TOKEN_PARAMETER)?;
    // Form encoding, as RFC 6750 says (and as the watch `key`s are).
    let decoded = extract::form_decode(value.as_bytes(), true);
    (!decoded.is_empty()).then_some(decoded)
}

/// The credentials of a `Bearer` authorization header (scheme case-insensitive).
fn bearer_token(header: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = header.split_at_checked(6)?;
    if !scheme.eq_ignore_ascii_case(b"bearer") || rest.first() != Some(&b' ') {
        return None;
    }
    let token = rest.trim_ascii();
    (!token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_token_is_taken_from_the_authorization_header() {
        assert_eq!(bearer_token(b"Bearer abc"), Some(&b"abc"[..]));
        assert_eq!(bearer_token(b"bearer   abc "), Some(&b"abc"[..]));
        assert_eq!(bearer_token(b"Basic abc"), None);
        assert_eq!(bearer_token(b"Bearer"), None);
        assert_eq!(bearer_token(b"Bearer "), None);
        assert_eq!(bearer_token(b"Bearerabc"), None);
    }

    #[test]
    fn api_token_compares_whole_tokens_and_never_prints() {
        let token = ApiToken::new(b"s3cret".to_vec());
        assert!(token.matches(b"s3cret"));
        assert!(!token.matches(b"s3cre"));
        assert!(!token.matches(b"s3cret!"));
        assert!(!format!("{token:?}").contains("s3cret"));
    }
}
