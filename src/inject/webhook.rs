//! `statestore-gateway injector`: a mutating admission webhook. Pods
//! annotated `statestore-gateway/inject: enabled` get the sidecar as a JSON
//! Patch, computed as the difference between the pod and the same pod
//! after [`inject_object`] (the one implementation `inject` uses too).
//! Anything else is allowed unchanged.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use base64::Engine as _;
use serde::Deserialize;
use serde_json::{Value, json};
use thiserror::Error;
use tokio::net::TcpListener;

use crate::http::transport::listener::{self, ConnectionLimits, MAX_HEADER_BYTES};
use crate::http::transport::tls::{ALPN_HTTP1, CertificateFiles};
use crate::http::{BodyReadLimits, close_unless_body_read, read_body_first};

use super::manifest::{Unannotated, inject_object};
use super::values::SidecarValues;
use crate::settings::{self, SettingError};

/// The largest AdmissionReview accepted. The API server sends the pod
/// (objects are at most 1.5 MiB in etcd) and a little more.
pub const MAX_REVIEW_BYTES: usize = 3 * 1024 * 1024;

/// How long a client may take for the TLS handshake, for each request's
/// headers, and for its body (408 after it). The API server waits
/// `timeoutSeconds` for an answer (10 s by default, 5 in the chart) and
/// sends a review in milliseconds: a client slower than this is not one, and each phase
/// must end well before the API server gives up on the reviews queued
/// behind it.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(3);
const BODY_READ_TIMEOUT: Duration = Duration::from_secs(3);

/// Connections served at once; more wait in the listen backlog until one
/// closes (each costs about 50 KiB of TLS and HTTP buffers).
const MAX_CONNECTIONS: usize = 1024;

/// Why the webhook cannot start.
#[derive(Debug, Error)]
pub enum WebhookError {
    /// The certificate or key cannot be used.
    #[error("{0}")]
    Tls(#[from] SettingError),
    /// Listening failed.
    #[error("cannot accept connections: {0}")]
    Io(#[from] std::io::Error),
}

/// The router: `POST /mutate` and `GET /livez`. Public so that tests can
/// drive it without TLS.
pub fn router(values: SidecarValues) -> Router {
    Router::new()
        .route("/mutate", post(mutate))
        .route("/livez", get(|| async { "ok\n" }))
        .layer(DefaultBodyLimit::max(MAX_REVIEW_BYTES))
        // The body whole within its deadline before the handler: the JSON
        // extractor would wait for a slow body for ever.
        .layer(axum::middleware::from_fn_with_state(
            BodyReadLimits {
                max_bytes: MAX_REVIEW_BYTES,
                timeout: BODY_READ_TIMEOUT,
            },
            read_body_first,
        ))
        // A refusal before the body was read (too large, too slow, not
        // JSON) ends the connection and says so, as the API's answers do.
        .layer(axum::middleware::from_fn(close_unless_body_read))
        .with_state(Arc::new(values))
}

/// The parts of an AdmissionReview v1 request the webhook reads.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Review {
    api_version: String,
    kind: String,
    request: Option<ReviewRequest>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ReviewRequest {
    uid: String,
    kind: GroupVersionKind,
    operation: String,
    object: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct GroupVersionKind {
    group: String,
    version: String,
    kind: String,
}

/// A request that is not an AdmissionReview: 400 (or what axum found) in
/// plain text, for whoever reads the API server's log.
fn bad_request(status: StatusCode, message: String) -> Response {
    tracing::warn!(%status, %message, "refused a request to /mutate");
    (status, format!("{message}\n")).into_response()
}

async fn mutate(
    State(values): State<Arc<SidecarValues>>,
    review: Result<axum::Json<Review>, JsonRejection>,
) -> Response {
    let review = match review {
        Ok(axum::Json(review)) => review,
        Err(rejection) => return bad_request(rejection.status(), rejection.body_text()),
    };
    if review.api_version != "admission.k8s.io/v1" || review.kind != "AdmissionReview" {
        return bad_request(
            StatusCode::BAD_REQUEST,
            format!(
                "expected an admission.k8s.io/v1 AdmissionReview, got {}/{}",
                review.api_version, review.kind
            ),
        );
    }
    let Some(request) = review.request else {
        return bad_request(
            StatusCode::BAD_REQUEST,
            "the AdmissionReview has no request".into(),
        );
    };
    let response = review_response(&request, &values);
    axum::Json(json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": response,
    }))
    .into_response()
}

/// The `response` of an AdmissionReview: allowed, with a patch when the
/// pod asked for the sidecar; refused (400) when it asked with settings
/// that cannot work, so that the mistake shows in the owner's events
/// rather than as a pod silently without its sidecar.
fn review_response(request: &ReviewRequest, values: &SidecarValues) -> Value {
    let uid = &request.uid;
    let is_pod =
        request.kind.group.is_empty() && request.kind.version == "v1" && request.kind.kind == "Pod";
    let (true, "CREATE", Some(pod)) = (is_pod, request.operation.as_str(), &request.object) else {
        return json!({"uid": uid, "allowed": true});
    };
    let mut original = pod.clone();
    // An AdmissionReview's object has no apiVersion/kind of its own in
    // some API server versions: say what it is.
    if let Some(object) = original.as_object_mut() {
        object.insert("apiVersion".into(), "v1".into());
        object.insert("kind".into(), "Pod".into());
    }
    let mut patched = original.clone();
    match inject_object(&mut patched, values, Unannotated::Skip) {
        Ok(false) => json!({"uid": uid, "allowed": true}),
        Ok(true) => {
            let patch = json_patch::diff(&original, &patched);
            let patch = serde_json::to_vec(&patch).unwrap_or_default();
            json!({
                "uid": uid,
                "allowed": true,
                "patchType": "JSONPatch",
                "patch": base64::engine::general_purpose::STANDARD.encode(patch),
            })
        }
        Err((what, message)) => {
            let name = what.trim_start_matches(", ");
            json!({
                "uid": uid,
                "allowed": false,
                "status": {
                    "code": 400,
                    "message": format!("statestore-gateway sidecar for {name}: {message}"),
                },
            })
        }
    }
}

/// Serves the webhook over TLS on `listener` until `shutdown` resolves.
/// The certificate and key are read again whenever either file changes
/// (cert-manager renews them in place), checked at most once a second.
pub async fn serve(
    listener: TcpListener,
    cert_file: PathBuf,
    key_file: PathBuf,
    values: SidecarValues,
    shutdown: impl Future<Output = ()>,
) -> Result<(), WebhookError> {
    let files = CertificateFiles {
        cert_file,
        key_file,
        cert_setting: &settings::INJECTOR_TLS_CERT_FILE,
        key_setting: &settings::INJECTOR_TLS_KEY_FILE,
    };
    // The API server speaks HTTP/1.1 to webhooks.
    let acceptor = files.acceptor(&[ALPN_HTTP1])?;
    let limits = ConnectionLimits {
        header_read_timeout: HEADER_READ_TIMEOUT,
        max_header_bytes: MAX_HEADER_BYTES,
        max_connections: MAX_CONNECTIONS,
    };
    listener::serve(listener, router(values), limits, Some(acceptor), shutdown).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(object: Value) -> ReviewRequest {
        ReviewRequest {
            uid: "u-1".into(),
            kind: GroupVersionKind {
                group: String::new(),
                version: "v1".into(),
                kind: "Pod".into(),
            },
            operation: "CREATE".into(),
            object: Some(object),
        }
    }

    #[test]
    fn unannotated_pods_and_other_operations_are_allowed_unchanged() {
        let values = SidecarValues::chart_defaults();
        let pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a"}]}});
        let response = review_response(&request(pod.clone()), &values);
        assert_eq!(response, json!({"uid": "u-1", "allowed": true}));
        let mut update = request(pod);
        update.operation = "UPDATE".into();
        assert_eq!(
            review_response(&update, &values),
            json!({"uid": "u-1", "allowed": true})
        );
    }

    #[test]
    fn a_pod_with_unusable_settings_is_refused_with_the_reason() {
        let pod = json!({
            "metadata": {"name": "p", "annotations": {
                "statestore-gateway/inject": "enabled",
                "statestore-gateway/broker.keepAlive": "1",
            }},
            "spec": {"containers": [{"name": "a"}]},
        });
        let values =
            SidecarValues::chart_defaults().checked_by(crate::cli::serve::check_environment);
        let response = review_response(&request(pod), &values);
        assert_eq!(response["allowed"], false);
        assert_eq!(response["status"]["code"], 400);
        let message = response["status"]["message"].as_str().unwrap();
        assert!(
            message.contains("Pod/p") && message.contains("--keep-alive"),
            "{message}"
        );
    }
}
