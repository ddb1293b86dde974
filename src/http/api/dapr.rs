//! Dapr's state and lock HTTP API (`/v1.0/...`), so that apps written for
//! a Dapr sidecar (the JS SDK speaks HTTP) run unchanged against the
//! gateway. The shapes are the Dapr runtime's; what each operation does in
//! the store is [`crate::dapr`]'s. Errors are Dapr's `{"errorCode",
//! "message"}` bodies, mapped in one place ([`DaprHttpError`]).

use std::collections::HashMap;

use axum::Router;
use axum::body::Body;
use axum::extract::{FromRequest, FromRequestParts, Path, RawQuery, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::Bytes;
use futures_util::stream::{self, StreamExt as _};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde::de::IgnoredAny;

use super::extract;
use crate::access::rules::{Access, Need};
use crate::dapr::{Concurrency, DaprError, Delete, Save, UnlockStatus, ttl_from_metadata};
use crate::http::problem::{FailureLog, Severity};
use crate::http::state::AppState;
use crate::store::Versioned;

/// The Dapr routes that need a caller (behind the guard).
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1.0/metadata", get(metadata))
        .route("/v1.0/state/{store}", post(save))
        .route("/v1.0/state/{store}/bulk", post(get_bulk).put(get_bulk))
        .route(
            "/v1.0/state/{store}/transaction",
            post(transaction).put(transaction),
        )
        .route("/v1.0/state/{store}/{*key}", get(get_state).delete(delete))
        .route("/v1.0-alpha1/lock/{store}", post(try_lock))
        .route("/v1.0-alpha1/unlock/{store}", post(unlock))
}

/// Dapr's health routes: public, as Dapr's are (the Python SDK polls
/// `/v1.0/healthz/outbound` before its first call).
pub fn health_routes() -> Router<AppState> {
    Router::new()
        .route("/v1.0/healthz", get(healthz))
        .route("/v1.0/healthz/outbound", get(healthz))
}

/// A Dapr error answer: a status and Dapr's error code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaprHttpError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl DaprHttpError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
        }
    }

    fn malformed(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "ERR_MALFORMED_REQUEST", message)
    }

    fn forbidden(key: &[u8]) -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            "ERR_PERMISSION_DENIED",
            format!(
                "access to key {:?} is not allowed",
                String::from_utf8_lossy(key)
            ),
        )
    }

    /// A lock operation's failure: the store's, a 500 under `code`.
    fn internal(code: &'static str, error: impl std::fmt::Display) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, code, error.to_string())
    }

    /// A state operation's failure, under that operation's error code.
    fn state(code: &'static str, error: DaprError) -> Self {
        let status = match error {
            DaprError::EtagMismatch => StatusCode::CONFLICT,
            DaprError::MalformedEtag(_) => StatusCode::BAD_REQUEST,
            DaprError::DuplicateKey => StatusCode::BAD_REQUEST,
            DaprError::LeaseBusy(_) | DaprError::TransactionsOff | DaprError::Store(_) => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
        };
        Self::new(status, code, error.to_string())
    }
}

impl IntoResponse for DaprHttpError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({"errorCode": self.code, "message": self.message});
        let severity = if self.status.is_server_error() {
            Severity::Error
        } else {
            Severity::Info
        };
        let mut response = (self.status, axum::Json(body)).into_response();
        response.extensions_mut().insert(FailureLog {
            severity,
            cause: format!("{}: {}", self.code, self.message),
        });
        response
    }
}

type Answer = Result<Response, DaprHttpError>;

fn state_store(state: &AppState, store: &str) -> Result<(), DaprHttpError> {
    if store == state.dapr.settings().state_store {
        return Ok(());
    }
    Err(DaprHttpError::new(
        StatusCode::BAD_REQUEST,
        "ERR_STATE_STORE_NOT_FOUND",
        format!("state store {store} is not found"),
    ))
}

fn lock_store(state: &AppState, store: &str) -> Result<(), DaprHttpError> {
    if store == state.dapr.settings().lock_store {
        return Ok(());
    }
    Err(DaprHttpError::new(
        StatusCode::BAD_REQUEST,
        "ERR_LOCK_STORE_NOT_FOUND",
        format!("lock store {store} is not found"),
    ))
}

/// The key's store key, if its length is within the limit and the caller
/// may do `need` to it.
fn checked_key(
    state: &AppState,
    access: &Access,
    key: &str,
    need: Need,
) -> Result<Bytes, DaprHttpError> {
    if key.is_empty() {
        return Err(DaprHttpError::malformed("a key must not be empty"));
    }
    let store_key = state.dapr.store_key(key);
    if store_key.len() > state.limits.max_key_bytes {
        return Err(DaprHttpError::malformed(format!(
            "a key may have at most {} bytes",
            state.limits.max_key_bytes
        )));
    }
    if access.require(&store_key, need).is_err() {
        return Err(DaprHttpError::forbidden(&store_key));
    }
    Ok(store_key)
}

/// Reads a JSON body (at most the batch body limit, within the request
/// timeout).
async fn json_body<T: DeserializeOwned>(
    state: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> Result<T, DaprHttpError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok()?.parse().ok());
    let mut body = body;
    let bytes = extract::read_body(
        &mut body,
        declared,
        state.limits.max_batch_bytes,
        state.request_timeout(),
    )
    .await
    .map_err(|error| DaprHttpError::malformed(error.to_string()))?;
    serde_json::from_slice(&bytes).map_err(|error| DaprHttpError::malformed(error.to_string()))
}

/// The JSON body of a request to the state store its path names (`{store}`),
/// read once the name is checked.
struct StateBody<T>(T);

/// The JSON body of a request to the lock store its path names.
struct LockBody<T>(T);

impl<T: DeserializeOwned> FromRequest<AppState> for StateBody<T> {
    type Rejection = DaprHttpError;

    async fn from_request(request: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        store_body(request, state, state_store).await.map(Self)
    }
}

impl<T: DeserializeOwned> FromRequest<AppState> for LockBody<T> {
    type Rejection = DaprHttpError;

    async fn from_request(request: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        store_body(request, state, lock_store).await.map(Self)
    }
}

/// The body of `request`, once `store_is` accepts the store its path names.
async fn store_body<T: DeserializeOwned>(
    request: Request,
    state: &AppState,
    store_is: fn(&AppState, &str) -> Result<(), DaprHttpError>,
) -> Result<T, DaprHttpError> {
    let (mut parts, body) = request.into_parts();
    let Path(store) = Path::<String>::from_request_parts(&mut parts, state)
        .await
        .map_err(|rejection| DaprHttpError::malformed(rejection.body_text()))?;
    store_is(state, &store)?;
    json_body(state, &parts.headers, body).await
}

/// The `metadata.<name>` query parameters.
fn query_metadata(query: Option<&str>) -> HashMap<String, String> {
    extract::query_pairs(query)
        .filter_map(|(name, value)| {
            let name = name.strip_prefix("metadata.")?;
            let value = extract::form_decode(value.as_bytes(), true);
            Some((
                name.to_owned(),
                String::from_utf8_lossy(&value).into_owned(),
            ))
        })
        .collect()
}

fn query_value(query: Option<&str>, wanted: &str) -> Option<String> {
    extract::query_pairs(query)
        .find(|(name, _)| *name == wanted)
        .map(|(_, value)| {
            String::from_utf8_lossy(&extract::form_decode(value.as_bytes(), true)).into_owned()
        })
}

/// 413 when a request carries more than `--max-batch-ops` items.
fn at_most_batch_ops(state: &AppState, count: usize, what: &str) -> Result<(), DaprHttpError> {
    if count <= state.limits.max_batch_ops {
        return Ok(());
    }
    Err(DaprHttpError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "ERR_MALFORMED_REQUEST",
        format!("at most {} {what}", state.limits.max_batch_ops),
    ))
}

fn concurrency(text: Option<&str>) -> Result<Concurrency, DaprHttpError> {
    match text {
        None | Some("" | "last-write") => Ok(Concurrency::LastWrite),
        Some("first-write") => Ok(Concurrency::FirstWrite),
        Some(other) => Err(DaprHttpError::malformed(format!(
            "unknown concurrency {other:?}: expected first-write or last-write"
        ))),
    }
}

/// `GET /v1.0/healthz` and `/v1.0/healthz/outbound`: 204 once the store
/// can be reached.
async fn healthz(State(state): State<AppState>) -> Answer {
    if state.store.pool().is_ready() && !state.is_draining() {
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    Err(DaprHttpError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "ERR_HEALTH_NOT_READY",
        "the gateway is not connected to the state store",
    ))
}

/// `GET /v1.0/metadata`: the app id and the two components, with the
/// capabilities that hold.
async fn metadata(State(state): State<AppState>) -> Answer {
    let settings = state.dapr.settings();
    let body = serde_json::json!({
        "id": settings.app_id,
        "runtimeVersion": concat!("statestore-gateway/", env!("CARGO_PKG_VERSION")),
        "components": [
            {
                "name": settings.state_store,
                "type": crate::dapr::STATE_COMPONENT_TYPE,
                "version": "v1",
                "capabilities": state.dapr.capabilities(),
            },
            {
                "name": settings.lock_store,
                "type": crate::dapr::LOCK_COMPONENT_TYPE,
                "version": "v1",
            },
        ],
        "extended": {},
    });
    Ok(axum::Json(body).into_response())
}

/// One item of a save, as Dapr's HTTP API takes it.
#[derive(Debug, Deserialize)]
struct StateItem {
    key: String,
    #[serde(default)]
    value: serde_json::Value,
    #[serde(default)]
    etag: Option<String>,
    #[serde(default)]
    metadata: Option<HashMap<String, MetadataValue>>,
    #[serde(default)]
    options: Option<StateOptions>,
}

/// Metadata values are strings in Dapr; numbers are taken as their text.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum MetadataValue {
    Text(String),
    Number(serde_json::Number),
    Other(IgnoredAny),
}

impl MetadataValue {
    fn text(&self) -> Option<String> {
        match self {
            MetadataValue::Text(text) => Some(text.clone()),
            MetadataValue::Number(number) => Some(number.to_string()),
            MetadataValue::Other(_) => None,
        }
    }
}

#[derive(Debug, Default, Deserialize)]
struct StateOptions {
    #[serde(default)]
    concurrency: Option<String>,
}

/// The save of one item, checked.
fn save_of(
    state: &AppState,
    access: &Access,
    item: StateItem,
    query_ttl: Option<&str>,
) -> Result<Save, DaprHttpError> {
    checked_key(state, access, &item.key, Need::Write)?;
    let ttl = item
        .metadata
        .as_ref()
        .and_then(|metadata| metadata.get("ttlInSeconds"))
        .and_then(MetadataValue::text);
    let ttl_ms =
        ttl_from_metadata(ttl.as_deref().or(query_ttl)).map_err(DaprHttpError::malformed)?;
    let value = Bytes::from(
        serde_json::to_vec(&item.value)
            .map_err(|error| DaprHttpError::malformed(error.to_string()))?,
    );
    if value.len() > state.value_limit() {
        return Err(DaprHttpError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "ERR_MALFORMED_REQUEST",
            format!("a value may have at most {} bytes", state.value_limit()),
        ));
    }
    Ok(Save {
        key: item.key,
        value,
        etag: item.etag.filter(|etag| !etag.is_empty()),
        concurrency: concurrency(item.options.unwrap_or_default().concurrency.as_deref())?,
        ttl_ms,
    })
}

/// `POST /v1.0/state/{store}`: saves every item (each as its own write).
async fn save(
    State(state): State<AppState>,
    RawQuery(query): RawQuery,
    access: Access,
    StateBody(items): StateBody<Vec<StateItem>>,
) -> Answer {
    at_most_batch_ops(&state, items.len(), "items per request")?;
    let query_ttl = query_metadata(query.as_deref()).remove("ttlInSeconds");
    let saves = items
        .into_iter()
        .map(|item| save_of(&state, &access, item, query_ttl.as_deref()))
        .collect::<Result<Vec<_>, _>>()?;
    let results: Vec<_> = stream::iter(saves)
        .map(|save| state.dapr.save(save))
        .buffered(16)
        .collect()
        .await;
    for result in results {
        result.map_err(|error| DaprHttpError::state("ERR_STATE_SAVE", error))?;
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `GET /v1.0/state/{store}/{key}`: the stored bytes and the `ETag`, or
/// 204 when the key is absent.
async fn get_state(
    State(state): State<AppState>,
    Path((store, key)): Path<(String, String)>,
    access: Access,
) -> Answer {
    state_store(&state, &store)?;
    checked_key(&state, &access, &key, Need::Read)?;
    let read = state
        .dapr
        .get(&key)
        .await
        .map_err(|error| DaprHttpError::state("ERR_STATE_GET", error))?;
    let Some(Versioned { value, version }) = read else {
        return Ok(StatusCode::NO_CONTENT.into_response());
    };
    let mut response = Response::new(Body::from(value));
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if let Some(etag) = version.and_then(|version| HeaderValue::from_str(&version.encode()).ok()) {
        headers.insert(header::ETAG, etag);
    }
    Ok(response)
}

/// `DELETE /v1.0/state/{store}/{key}`: with `If-Match`, only at that etag.
async fn delete(
    State(state): State<AppState>,
    Path((store, key)): Path<(String, String)>,
    RawQuery(query): RawQuery,
    access: Access,
    headers: HeaderMap,
) -> Answer {
    state_store(&state, &store)?;
    checked_key(&state, &access, &key, Need::Write)?;
    let etag = match headers.get(header::IF_MATCH) {
        None => None,
        Some(value) => Some(
            value
                .to_str()
                .map_err(|_| {
                    DaprHttpError::new(
                        StatusCode::BAD_REQUEST,
                        "ERR_STATE_DELETE",
                        "If-Match is not text",
                    )
                })?
                .trim_matches('"')
                .to_owned(),
        ),
    };
    let delete = Delete {
        key,
        etag: etag.filter(|etag| !etag.is_empty()),
        concurrency: concurrency(query_value(query.as_deref(), "concurrency").as_deref())?,
    };
    state
        .dapr
        .delete(delete)
        .await
        .map_err(|error| DaprHttpError::state("ERR_STATE_DELETE", error))?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Debug, Deserialize)]
struct BulkRequest {
    keys: Vec<String>,
    #[serde(default)]
    parallelism: Option<i64>,
}

/// `POST|PUT /v1.0/state/{store}/bulk`: one item per key, in order:
/// `{key, data, etag}`, or `{key}` for an absent key.
async fn get_bulk(
    State(state): State<AppState>,
    access: Access,
    StateBody(request): StateBody<BulkRequest>,
) -> Answer {
    at_most_batch_ops(&state, request.keys.len(), "keys per request")?;
    for key in &request.keys {
        checked_key(&state, &access, key, Need::Read)?;
    }
    let parallelism = usize::try_from(request.parallelism.unwrap_or(0)).unwrap_or(0);
    let items = state.dapr.get_bulk(request.keys, parallelism).await;
    // Written out by hand: the stored JSON goes in as it is, not parsed.
    let mut out = Vec::with_capacity(
        2 + items
            .iter()
            .map(|(key, read)| {
                key.len()
                    + 64
                    + read
                        .as_ref()
                        .ok()
                        .and_then(Option::as_ref)
                        .map_or(0, |v| v.value.len())
            })
            .sum::<usize>(),
    );
    out.push(b'[');
    for (at, (key, read)) in items.into_iter().enumerate() {
        if at > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"key\":");
        serde_json::to_writer(&mut out, &key)
            .map_err(|error| DaprHttpError::malformed(error.to_string()))?;
        match read {
            Ok(None) => {}
            Ok(Some(Versioned { value, version })) => {
                if serde_json::from_slice::<IgnoredAny>(&value).is_ok() {
                    out.extend_from_slice(b",\"data\":");
                    out.extend_from_slice(&value);
                } else if let Ok(text) = std::str::from_utf8(&value) {
                    // Not JSON (written over gRPC or /keys): as a string.
                    out.extend_from_slice(b",\"data\":");
                    serde_json::to_writer(&mut out, text)
                        .map_err(|error| DaprHttpError::malformed(error.to_string()))?;
                } else {
                    out.extend_from_slice(b",\"error\":\"the value is not JSON or text\"");
                }
                if let Some(version) = version {
                    out.extend_from_slice(b",\"etag\":\"");
                    out.extend_from_slice(version.encode().as_bytes());
                    out.push(b'"');
                }
            }
            Err(error) => {
                out.extend_from_slice(b",\"error\":");
                serde_json::to_writer(&mut out, &error.to_string())
                    .map_err(|error| DaprHttpError::malformed(error.to_string()))?;
            }
        }
        out.push(b'}');
    }
    out.push(b']');
    Ok((
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        out,
    )
        .into_response())
}

#[derive(Debug, Deserialize)]
struct TransactionRequest {
    operations: Vec<TransactionOperation>,
}

#[derive(Debug, Deserialize)]
struct TransactionOperation {
    operation: String,
    request: StateItem,
}

/// `POST|PUT /v1.0/state/{store}/transaction`: every op or none (see
/// [`crate::dapr`]); any failure is 500 `ERR_STATE_TRANSACTION`, as Dapr
/// answers.
async fn transaction(
    State(state): State<AppState>,
    access: Access,
    StateBody(request): StateBody<TransactionRequest>,
) -> Answer {
    at_most_batch_ops(
        &state,
        request.operations.len(),
        "operations per transaction",
    )?;
    let mut ops = Vec::with_capacity(request.operations.len());
    for operation in request.operations {
        let delete = match operation.operation.as_str() {
            "upsert" => false,
            "delete" => true,
            other => {
                return Err(DaprHttpError::malformed(format!(
                    "unknown operation {other:?}: expected upsert or delete"
                )));
            }
        };
        let save = save_of(&state, &access, operation.request, None)?;
        ops.push(state.dapr.tx_op(save, delete).map_err(|error| {
            DaprHttpError::new(
                StatusCode::BAD_REQUEST,
                "ERR_STATE_TRANSACTION",
                error.to_string(),
            )
        })?);
    }
    state.dapr.transaction(ops).await.map_err(|error| {
        let status = match error {
            DaprError::DuplicateKey | DaprError::MalformedEtag(_) => StatusCode::BAD_REQUEST,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        DaprHttpError::new(status, "ERR_STATE_TRANSACTION", error.to_string())
    })?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Debug, Deserialize)]
struct LockRequest {
    #[serde(rename = "resourceId", alias = "resource_id", default)]
    resource_id: String,
    #[serde(rename = "lockOwner", alias = "lock_owner", default)]
    lock_owner: String,
    #[serde(rename = "expiryInSeconds", alias = "expiry_in_seconds", default)]
    expiry_in_seconds: i64,
}

/// A lock request's resource and owner, checked, and the caller's Write
/// on the resource.
fn lock_names(
    state: &AppState,
    access: &Access,
    request: &LockRequest,
) -> Result<(), DaprHttpError> {
    let (resource, owner) = (&request.resource_id, &request.lock_owner);
    if resource.is_empty() {
        return Err(DaprHttpError::malformed("resourceId is empty"));
    }
    if owner.is_empty() {
        return Err(DaprHttpError::malformed("lockOwner is empty"));
    }
    if owner.len() > state.locks.settings().max_holder_bytes {
        return Err(DaprHttpError::malformed(format!(
            "lockOwner may have at most {} bytes",
            state.locks.settings().max_holder_bytes
        )));
    }
    if resource.len() > state.limits.max_key_bytes {
        return Err(DaprHttpError::malformed(format!(
            "resourceId may have at most {} bytes",
            state.limits.max_key_bytes
        )));
    }
    if access.require(resource.as_bytes(), Need::Write).is_err() {
        return Err(DaprHttpError::forbidden(resource.as_bytes()));
    }
    Ok(())
}

/// `POST /v1.0-alpha1/lock/{lockstore}`: `{"success": true|false}`.
async fn try_lock(
    State(state): State<AppState>,
    access: Access,
    LockBody(request): LockBody<LockRequest>,
) -> Answer {
    lock_names(&state, &access, &request)?;
    let seconds = u64::try_from(request.expiry_in_seconds)
        .ok()
        .filter(|&s| s > 0)
        .ok_or_else(|| DaprHttpError::malformed("expiryInSeconds must be greater than zero"))?;
    let success = state
        .dapr
        .try_lock(
            &request.resource_id,
            &request.lock_owner,
            std::time::Duration::from_secs(seconds),
        )
        .await
        .map_err(|error| DaprHttpError::internal("ERR_TRY_LOCK", error))?;
    Ok(axum::Json(serde_json::json!({ "success": success })).into_response())
}

/// `POST /v1.0-alpha1/unlock/{lockstore}`: `{"status": 0|1|2}`.
async fn unlock(
    State(state): State<AppState>,
    access: Access,
    LockBody(request): LockBody<LockRequest>,
) -> Answer {
    lock_names(&state, &access, &request)?;
    let status = state
        .dapr
        .unlock(&request.resource_id, &request.lock_owner)
        .await
        .map_err(|error| DaprHttpError::internal("ERR_UNLOCK", error))?;
    let status = match status {
        UnlockStatus::Success => 0,
        UnlockStatus::LockDoesNotExist => 1,
        UnlockStatus::LockBelongsToOthers => 2,
    };
    Ok(axum::Json(serde_json::json!({ "status": status })).into_response())
}
