//! The admin listener: liveness, readiness and Prometheus metrics, on a
//! port apart from the key API (no bearer token; not exposed to clients).

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::http::state::AppState;

/// The Prometheus text exposition format's content type.
pub const METRICS_CONTENT_TYPE: &str = "text/plain; version=0.0.4";

/// `/livez`, `/readyz`, `/metrics`.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(state)
}

/// 200 while the process serves at all.
async fn livez() -> &'static str {
    "ok\n"
}

/// 200 once a pool member (and the Dapr outbox's relay, if any) is
/// subscribed; 503 while none is, while
/// another client with the gateway's client id keeps taking its MQTT
/// sessions, and once shutdown has started (so load balancers stop
/// sending first).
async fn readyz(State(state): State<AppState>) -> Response {
    if state.is_draining() {
        return (StatusCode::SERVICE_UNAVAILABLE, "shutting down\n").into_response();
    }
    let pool = state.store.pool();
    if let Some(client_id) = pool.session_taken_over() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "another MQTT client connects with client id {client_id} and takes this \
                 gateway's session: give each gateway its own client id (--client-id)\n"
            ),
        )
            .into_response();
    }
    if !pool.is_ready() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "no broker connection is subscribed\n",
        )
            .into_response();
    }
    if !state.dapr.outbox_ready() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "the Dapr outbox's relay is not subscribed yet\n",
        )
            .into_response();
    }
    (StatusCode::OK, "ready\n").into_response()
}

async fn metrics(State(state): State<AppState>) -> Response {
    let pending = i64::try_from(state.store.pool().pending_replies()).unwrap_or(i64::MAX);
    state.metrics.pending_replies.set(pending);
    let mut response = state.metrics.render().into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(METRICS_CONTENT_TYPE),
    );
    response
}
