//! The middleware in front of every API route: who calls (the checks of
//! [`access`]: the API token or a JWT, making the request's [`Caller`], then
//! its access under the per-key rules) and the backstop timeout, in one
//! layer; refusals are answered in the caller's protocol (HTTP or gRPC).

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tonic::Code;

use super::api::{extract, locks, watch};
use super::dapr::grpc;
use super::problem::ApiError;
use super::transport::stream_request::is_stream_request;
use crate::access::rules::Principal;
use crate::access::{self, AuthFailure, Caller, CallerChecks, presented_token};
use crate::metrics::Metrics;

/// What [`guard`] checks (one middleware for both: each layer costs a
/// service clone and a boxed future per request).
#[derive(Debug, Clone)]
pub(super) struct Guard {
    /// The shared token (`Authorization: Bearer <token>`), then any other
    /// bearer token as a JWT; each request gets its caller's
    /// [`Access`](crate::access::rules::Access) under the rules, when configured.
    pub(super) callers: CallerChecks,
    /// Counts refusals by reason.
    pub(super) metrics: Metrics,
    /// See [`AppState::backstop`](super::AppState::backstop).
    pub(super) backstop: Duration,
    /// Added to the backstop of lock requests, which may wait this long.
    pub(super) lock_wait: Duration,
}

/// The bearer token check (the caller it finds goes into the request's
/// extensions), the caller's access under the rules, then the request
/// under the backstop timeout.
pub(super) async fn guard(
    State(guard): State<Arc<Guard>>,
    mut request: Request,
    next: Next,
) -> Response {
    if guard.callers.api_token.is_some() || guard.callers.jwt.is_some() {
        let authenticated = authenticate(
            &guard.callers,
            request.headers(),
            request.method(),
            request.uri(),
        )
        .await;
        match authenticated {
            Ok(caller) => {
                request.extensions_mut().insert(caller);
            }
            Err(failure) => {
                guard
                    .metrics
                    .auth_failures
                    .with_label_values(&[failure.reason()])
                    .inc();
                if grpc::is_grpc(request.headers()) {
                    return grpc::status_response(Code::Unauthenticated, failure.to_string());
                }
                return ApiError::Unauthorized(failure).into_response();
            }
        }
    }
    if let Some(authz) = &guard.callers.authz {
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
    let grpc = grpc::is_grpc(request.headers());
    match tokio::time::timeout(backstop, next.run(request)).await {
        Ok(response) => response,
        Err(_) if grpc => grpc::status_response(
            Code::DeadlineExceeded,
            ApiError::HandlerTimeout(backstop).to_string(),
        ),
        Err(_) => ApiError::HandlerTimeout(backstop).into_response(),
    }
}

/// The caller a request's token makes: from its headers, or on a watch
/// its `access_token` query parameter.
/// (The request's parts, not the request: its body is not `Sync`, so a
/// reference to it cannot be held across the JWT check's await.)
async fn authenticate(
    callers: &CallerChecks,
    headers: &HeaderMap,
    method: &Method,
    uri: &Uri,
) -> Result<Caller, AuthFailure> {
    let presented = presented_token(headers)
        .map(Cow::Borrowed)
        .or_else(|| query_token(method, uri).map(Cow::Owned))
        .ok_or(AuthFailure::Missing)?;
    access::authenticate(callers, &presented).await
}

/// The `access_token` query parameter (RFC 6750, section 2.3) of a watch
/// or topic stream (`GET /subscribe`): a browser's `EventSource` cannot
/// send an `Authorization` header, so a dashboard on a gateway with a token
/// has no other way. Only these streams take it; the gateway logs paths,
/// never queries.
fn query_token(method: &Method, uri: &Uri) -> Option<Vec<u8>> {
    if !is_stream_request(method, uri.path()) {
        return None;
    }
    let (_, value) = extract::query_pairs(uri.query())
        .find(|(name, _)| *name == watch::ACCESS_TOKEN_PARAMETER)?;
    // Form encoding, as RFC 6750 says (and as the watch `key`s are).
    let decoded = extract::form_decode(value.as_bytes(), true);
    (!decoded.is_empty()).then_some(decoded)
}

#[cfg(test)]
mod tests {
    use axum::Router;
    use axum::body::Body;
    use axum::extract::Extension;
    use axum::middleware::from_fn_with_state;
    use jsonwebtoken::{Algorithm, EncodingKey, Header};
    use tower::ServiceExt as _;

    use super::*;
    use crate::access::ApiToken;
    use crate::access::jwt::{JwtSettings, KeySource, Verifier};

    /// A route answering with the caller the guard made, behind the guard.
    fn echo(checks: Guard) -> Router {
        Router::new()
            .route(
                "/keys/k",
                axum::routing::get(|caller: Option<Extension<Caller>>| async move {
                    format!("{:?}", caller.map(|Extension(caller)| caller))
                }),
            )
            .layer(from_fn_with_state(Arc::new(checks), guard))
    }

    fn checks(token: Option<&str>, jwt: Option<Verifier>) -> Guard {
        Guard {
            callers: CallerChecks {
                api_token: token.map(|token| ApiToken::new(token.as_bytes().to_vec())),
                jwt,
                authz: None,
            },
            metrics: Metrics::new(),
            backstop: Duration::from_secs(5),
            lock_wait: Duration::ZERO,
        }
    }

    async fn caller_of(router: &Router, bearer: Option<&str>) -> (u16, String) {
        let mut request = axum::http::Request::get("/keys/k");
        if let Some(bearer) = bearer {
            request = request.header(
                axum::http::header::AUTHORIZATION,
                format!("Bearer {bearer}"),
            );
        }
        let response = router
            .clone()
            .oneshot(request.body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = response.status().as_u16();
        let body = http_body_util::BodyExt::collect(response.into_body())
            .await
            .unwrap()
            .to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn the_caller_is_the_api_token_or_the_tokens_subject() {
        let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let key = EncodingKey::from_ec_der(pair.serialized_der());
        let mut jwk = jsonwebtoken::jwk::Jwk::from_encoding_key(&key, Algorithm::ES256).unwrap();
        jwk.common.key_id = Some("k1".into());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jwks.json");
        std::fs::write(&path, serde_json::json!({ "keys": [jwk] }).to_string()).unwrap();
        let settings = JwtSettings::new(KeySource::File(path), "https://issuer", "gateway");
        let verifier = Verifier::start(settings, Metrics::new()).unwrap();
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some("k1".into());
        let exp = crate::protocol::hlc::now_ms() / 1000 + 600;
        let claims = serde_json::json!({
            "iss": "https://issuer", "aud": "gateway", "sub": "system:serviceaccount:apps:ui", "exp": exp,
        });
        let jwt = jsonwebtoken::encode(&header, &claims, &key).unwrap();

        let both = echo(checks(Some("shared"), Some(verifier)));
        assert_eq!(
            caller_of(&both, Some("shared")).await,
            (200, "Some(ApiToken)".into())
        );
        assert_eq!(
            caller_of(&both, Some(&jwt)).await,
            (
                200,
                "Some(Subject(\"system:serviceaccount:apps:ui\"))".into()
            )
        );
        assert_eq!(caller_of(&both, Some("other")).await.0, 401);
        assert_eq!(caller_of(&both, None).await.0, 401);
        // Without authentication there is no caller.
        let open = echo(checks(None, None));
        assert_eq!(caller_of(&open, None).await, (200, "None".into()));
    }
}
