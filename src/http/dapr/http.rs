//! Dapr's state and lock HTTP API (`/v1.0/...`), so that apps written for
//! a Dapr sidecar (the JS SDK speaks HTTP) run unchanged against the
//! gateway. Only the wire shapes live here: the rules are
//! [`super::check`]'s, the answers [`super::answer`]'s, what each
//! operation does in the store [`crate::dapr`]'s.

use std::collections::HashMap;

use axum::Router;
use axum::body::Body;
use axum::extract::{FromRequest, FromRequestParts, Path, RawQuery, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::Bytes;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde::de::IgnoredAny;

use super::answer::{Failure, Operation};
use super::check::{self, Check, Counted, OperationKind, Refusal, SaveItem};
use crate::access::rules::{Access, Need};
use crate::dapr::Delete;
use crate::http::api::extract;
use crate::http::state::AppState;
use crate::store::Versioned;

/// The Dapr routes that need a caller (behind the guard).
pub(super) fn routes() -> Router<AppState> {
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
pub(super) fn health_routes() -> Router<AppState> {
    Router::new()
        .route("/v1.0/healthz", get(healthz))
        .route("/v1.0/healthz/outbound", get(healthz))
}

type Answer = Result<Response, Failure>;

/// Reads a JSON body (at most the batch body limit, within the request
/// timeout).
async fn json_body<T: DeserializeOwned>(
    state: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> Result<T, Refusal> {
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
    .map_err(|error| Refusal::Malformed(error.to_string()))?;
    serde_json::from_slice(&bytes).map_err(|error| Refusal::Malformed(error.to_string()))
}

/// The JSON body of a request to the state store its path names (`{store}`),
/// read once the name is checked.
struct StateBody<T>(T);

/// The JSON body of a request to the lock store its path names.
struct LockBody<T>(T);

impl<T: DeserializeOwned> FromRequest<AppState> for StateBody<T> {
    type Rejection = Failure;

    async fn from_request(request: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        Ok(Self(store_body(request, state, check::state_store).await?))
    }
}

impl<T: DeserializeOwned> FromRequest<AppState> for LockBody<T> {
    type Rejection = Failure;

    async fn from_request(request: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        Ok(Self(store_body(request, state, check::lock_store).await?))
    }
}

/// The body of `request`, once `store_is` accepts the store its path names.
async fn store_body<T: DeserializeOwned>(
    request: Request,
    state: &AppState,
    store_is: fn(&AppState, &str) -> Result<(), Refusal>,
) -> Result<T, Refusal> {
    let (mut parts, body) = request.into_parts();
    let Path(store) = Path::<String>::from_request_parts(&mut parts, state)
        .await
        .map_err(|rejection| Refusal::Malformed(rejection.body_text()))?;
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

/// `GET /v1.0/healthz` and `/v1.0/healthz/outbound`: 204 once the store
/// can be reached.
async fn healthz(State(state): State<AppState>) -> Answer {
    if state.store.pool().is_ready() && !state.is_draining() {
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    Err(Refusal::NotReady.into())
}

/// `GET /v1.0/metadata`: the app id and the two components, with the
/// capabilities that hold.
async fn metadata(State(state): State<AppState>) -> Answer {
    let components: Vec<_> = state
        .dapr
        .components()
        .into_iter()
        .map(|component| {
            let mut json = serde_json::json!({
                "name": component.name,
                "type": component.kind,
                "version": component.version,
            });
            if !component.capabilities.is_empty() {
                json["capabilities"] = serde_json::json!(component.capabilities);
            }
            json
        })
        .collect();
    let body = serde_json::json!({
        "id": state.dapr.settings().app_id,
        "runtimeVersion": crate::dapr::RUNTIME_VERSION,
        "components": components,
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

impl StateItem {
    /// The item as the rules read it: the value is its JSON text.
    fn into_save(self) -> Result<SaveItem, Refusal> {
        let ttl = self
            .metadata
            .as_ref()
            .and_then(|metadata| metadata.get("ttlInSeconds"))
            .and_then(MetadataValue::text);
        let value = serde_json::to_vec(&self.value)
            .map_err(|error| Refusal::Malformed(error.to_string()))?;
        Ok(SaveItem {
            concurrency: check::concurrency(
                self.options.unwrap_or_default().concurrency.as_deref(),
            )?,
            key: self.key,
            value: Bytes::from(value),
            etag: self.etag,
            ttl,
        })
    }
}

/// `POST /v1.0/state/{store}`: saves every item (each as its own write),
/// the query's metadata over each item's.
async fn save(
    State(state): State<AppState>,
    RawQuery(query): RawQuery,
    access: Access,
    StateBody(items): StateBody<Vec<StateItem>>,
) -> Answer {
    let check = Check::new(&state, &access);
    check.count(items.len(), Counted::Items)?;
    let query_ttl = query_metadata(query.as_deref()).remove("ttlInSeconds");
    let saves = items
        .into_iter()
        .map(|item| check.save(item.into_save()?, query_ttl.as_deref()))
        .collect::<Result<Vec<_>, _>>()?;
    state
        .dapr
        .save_all(saves)
        .await
        .map_err(Failure::on(Operation::Save))?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `GET /v1.0/state/{store}/{key}`: the stored bytes and the `ETag`, or
/// 204 when the key is absent.
async fn get_state(
    State(state): State<AppState>,
    Path((store, key)): Path<(String, String)>,
    access: Access,
) -> Answer {
    check::state_store(&state, &store)?;
    Check::new(&state, &access).key(&key, Need::Read)?;
    let read = state
        .dapr
        .get(&key)
        .await
        .map_err(Failure::on(Operation::Get))?;
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
    check::state_store(&state, &store)?;
    Check::new(&state, &access).key(&key, Need::Write)?;
    let etag = match headers.get(header::IF_MATCH) {
        None => None,
        Some(value) => Some(
            value
                .to_str()
                .map_err(|_| Refusal::Malformed("If-Match is not text".to_owned()))?
                .trim_matches('"')
                .to_owned(),
        ),
    };
    let delete = Delete {
        key,
        etag: etag.filter(|etag| !etag.is_empty()),
        concurrency: check::concurrency(query_value(query.as_deref(), "concurrency").as_deref())?,
    };
    state
        .dapr
        .delete(delete)
        .await
        .map_err(Failure::on(Operation::Delete))?;
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
    let check = Check::new(&state, &access);
    check.count(request.keys.len(), Counted::Keys)?;
    for key in &request.keys {
        check.key(key, Need::Read)?;
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
    let malformed = |error: serde_json::Error| Refusal::Malformed(error.to_string());
    out.push(b'[');
    for (at, (key, read)) in items.into_iter().enumerate() {
        if at > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"key\":");
        serde_json::to_writer(&mut out, &key).map_err(malformed)?;
        match read {
            Ok(None) => {}
            Ok(Some(Versioned { value, version })) => {
                if serde_json::from_slice::<IgnoredAny>(&value).is_ok() {
                    out.extend_from_slice(b",\"data\":");
                    out.extend_from_slice(&value);
                } else if let Ok(text) = std::str::from_utf8(&value) {
                    // Not JSON (written over gRPC or /keys): as a string.
                    out.extend_from_slice(b",\"data\":");
                    serde_json::to_writer(&mut out, text).map_err(malformed)?;
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
                serde_json::to_writer(&mut out, &error.to_string()).map_err(malformed)?;
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

/// `POST|PUT /v1.0/state/{store}/transaction`: every op or none, in order
/// (see [`crate::dapr`]), the query's metadata over each op's; any
/// failure is 500 `ERR_STATE_TRANSACTION`, as Dapr answers.
async fn transaction(
    State(state): State<AppState>,
    RawQuery(query): RawQuery,
    access: Access,
    StateBody(request): StateBody<TransactionRequest>,
) -> Answer {
    let check = Check::new(&state, &access);
    check.count(request.operations.len(), Counted::Operations)?;
    let query_ttl = query_metadata(query.as_deref()).remove("ttlInSeconds");
    let mut ops = Vec::with_capacity(request.operations.len());
    for operation in request.operations {
        let kind = check::operation(&operation.operation)?;
        let save = check.save(operation.request.into_save()?, query_ttl.as_deref())?;
        ops.push(
            state
                .dapr
                .tx_op(save, kind == OperationKind::Delete)
                .map_err(Failure::on(Operation::Transaction))?,
        );
    }
    state
        .dapr
        .transaction(ops)
        .await
        .map_err(Failure::on(Operation::Transaction))?;
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

/// `POST /v1.0-alpha1/lock/{lockstore}`: `{"success": true|false}`.
async fn try_lock(
    State(state): State<AppState>,
    access: Access,
    LockBody(request): LockBody<LockRequest>,
) -> Answer {
    Check::new(&state, &access).try_lock(&request.resource_id, &request.lock_owner)?;
    let expiry = check::expiry(request.expiry_in_seconds)?;
    let success = state
        .dapr
        .try_lock(&request.resource_id, &request.lock_owner, expiry)
        .await
        .map_err(Failure::on(Operation::TryLock))?;
    Ok(axum::Json(serde_json::json!({ "success": success })).into_response())
}

/// `POST /v1.0-alpha1/unlock/{lockstore}`: `{"status": 0|1|2}`.
async fn unlock(
    State(state): State<AppState>,
    access: Access,
    LockBody(request): LockBody<LockRequest>,
) -> Answer {
    Check::new(&state, &access).unlock(&request.resource_id, &request.lock_owner)?;
    let status = state
        .dapr
        .unlock(&request.resource_id, &request.lock_owner)
        .await
        .map_err(Failure::on(Operation::Unlock))?;
    // Numbered as Dapr's `UnlockResponse.Status`.
    Ok(axum::Json(serde_json::json!({ "status": status as i32 })).into_response())
}
