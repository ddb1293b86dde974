//! Dapr's state and lock HTTP API (`/v1.0/...`), so that apps written for
//! a Dapr sidecar (the JS SDK speaks HTTP) run unchanged against the
//! gateway. Only the wire shapes live here: the rules are
//! [`super::check`]'s, the answers [`super::answer`]'s, what each
//! operation does in the store [`crate::dapr`]'s.
//!
//! A request costs about its body and the values it carries: a body may
//! have at most `--dapr-max-body-size` bytes (Dapr's 4 MiB by default);
//! its items, keys or operations are counted as it is parsed, those past
//! the limit never held; an item's `value` stays the JSON text it came
//! as (a slice of the body, or a compacted copy), never a parsed tree; a
//! bulk read's answer is written as its reads are done, a few values at a
//! time ([`crate::dapr::DaprStore::get_bulk`]).

use std::cell::Cell;
use std::collections::HashMap;
use std::convert::Infallible;
use std::fmt;
use std::marker::PhantomData;

use axum::Router;
use axum::body::Body;
use axum::extract::{FromRequest, FromRequestParts, Path, RawQuery, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use bytes::Bytes;
use futures_util::stream::{self, StreamExt as _};
use serde::Deserialize;
use serde::de::{self, DeserializeOwned, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

use super::answer::{Failure, Operation, Publishing};
use super::app_callback::deliver_configuration;
use super::check::{self, BulkFault, Check, Counted, OperationKind, Refusal, SaveItem};
use crate::access::rules::{Access, Need};
use crate::dapr::AppProtocol;
use crate::dapr::configuration::items_json;
use crate::dapr::query::Query;
use crate::dapr::{BulkRead, Change, DaprError, Delete, Event, TxOperation};
use crate::http::api::extract;
use crate::http::api::keys::{Joined, json_into, json_string_pieces};
use crate::http::problem::ApiError;
use crate::http::state::AppState;
use crate::store::Versioned;

/// The Dapr routes that need a caller (behind the guard).
pub(super) fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1.0/metadata", get(metadata))
        .route("/v1.0/metadata/{name}", put(set_metadata))
        .route("/v1.0/state/{store}", post(save))
        .route("/v1.0/state/{store}/bulk", post(get_bulk).put(get_bulk))
        .route(
            "/v1.0/state/{store}/transaction",
            post(transaction).put(transaction),
        )
        .route("/v1.0/state/{store}/{*key}", get(get_state).delete(delete))
        .route(
            "/v1.0-alpha1/state/{store}/query",
            post(query_state).put(query_state),
        )
        .route("/v1.0-alpha1/lock/{store}", post(try_lock))
        .merge(configuration_routes("/v1.0"))
        .merge(configuration_routes("/v1.0-alpha1"))
        .route(
            "/v1.0/publish/{pubsub}/{*topic}",
            post(publish).put(publish),
        )
        .route(
            "/v1.0/publish/{pubsub}",
            post(publish_no_topic).put(publish_no_topic),
        )
        .route(
            "/v1.0/publish/{pubsub}/",
            post(publish_no_topic).put(publish_no_topic),
        )
        .route(
            "/v1.0-alpha1/publish/bulk/{pubsub}/{*topic}",
            post(publish_bulk).put(publish_bulk),
        )
        .route(
            "/v1.0/publish/bulk/{pubsub}/{*topic}",
            post(publish_bulk).put(publish_bulk),
        )
        .route("/v1.0-alpha1/unlock/{store}", post(unlock))
}

/// The configuration routes under `version` (the SDKs still call the
/// alpha paths).
fn configuration_routes(version: &str) -> Router<AppState> {
    Router::new()
        .route(
            &format!("{version}/configuration/{{store}}"),
            get(get_configuration),
        )
        .route(
            &format!("{version}/configuration/{{store}}/subscribe"),
            get(subscribe_configuration),
        )
        .route(
            &format!("{version}/configuration/{{store}}/{{id}}/unsubscribe"),
            get(unsubscribe_configuration),
        )
}

/// Dapr's health routes: public, as Dapr's are (the Python SDK polls
/// `/v1.0/healthz/outbound` before its first call).
pub(super) fn health_routes() -> Router<AppState> {
    Router::new()
        .route("/v1.0/healthz", get(healthz))
        .route("/v1.0/healthz/outbound", get(healthz))
}

type Answer = Result<Response, Failure>;

/// The body of a request to the state store its path names (`{store}`),
/// read once the name is checked: its bytes, parsed by the handler (whose
/// values borrow from them).
struct StateBody(Bytes);

/// The JSON body of a request to the lock store its path names.
struct LockBody<T>(T);

impl FromRequest<AppState> for StateBody {
    type Rejection = Failure;

    async fn from_request(request: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        Ok(Self(store_body(request, state, check::state_store).await?))
    }
}

impl<T: DeserializeOwned> FromRequest<AppState> for LockBody<T> {
    type Rejection = Failure;

    async fn from_request(request: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        let body = store_body(request, state, check::lock_store).await?;
        Ok(Self(serde_json::from_slice(&body).map_err(malformed)?))
    }
}

/// A body of at most `--dapr-max-body-size`, read within the request
/// timeout.
async fn bounded_body(
    state: &AppState,
    headers: &HeaderMap,
    mut body: Body,
) -> Result<Bytes, Refusal> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok()?.parse().ok());
    let max = state.limits.dapr_max_body_size;
    extract::read_body(&mut body, declared, max, state.request_timeout())
        .await
        .map_err(|error| match error {
            ApiError::ValueTooLarge { .. } => Refusal::TooLarge(max),
            other => Refusal::Malformed(other.to_string()),
        })
}

/// The body of `request` (at most `--dapr-max-body-size`, within the
/// request timeout), once `store_is` accepts the store its path names.
async fn store_body(
    request: Request,
    state: &AppState,
    store_is: fn(&AppState, &str) -> Result<(), Refusal>,
) -> Result<Bytes, Refusal> {
    let (mut parts, body) = request.into_parts();
    let Path(store) = Path::<String>::from_request_parts(&mut parts, state)
        .await
        .map_err(|rejection| Refusal::Malformed(rejection.body_text()))?;
    store_is(state, &store)?;
    bounded_body(state, &parts.headers, body).await
}

fn malformed(error: serde_json::Error) -> Refusal {
    Refusal::Malformed(error.to_string())
}

/// A JSON array of `T`, refused as soon as it has one element more than
/// `max` (the elements past that one are never read).
fn json_list<'de, T: Deserialize<'de>>(
    json: &'de [u8],
    max: usize,
    what: Counted,
) -> Result<Vec<T>, Refusal> {
    let refused = Cell::new(None);
    let mut deserializer = serde_json::Deserializer::from_slice(json);
    let list = (&mut deserializer)
        .deserialize_seq(AtMost {
            max,
            what,
            refused: &refused,
            element: PhantomData,
        })
        .and_then(|list| deserializer.end().map(|()| list));
    match (list, refused.take()) {
        (_, Some(refusal)) => Err(refusal),
        (list, None) => list.map_err(malformed),
    }
}

/// Reads an array's elements up to `max`; one more sets `refused`.
struct AtMost<'a, T> {
    max: usize,
    what: Counted,
    refused: &'a Cell<Option<Refusal>>,
    element: PhantomData<T>,
}

impl<'de, T: Deserialize<'de>> Visitor<'de> for AtMost<'_, T> {
    type Value = Vec<T>;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("a list")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut list = Vec::new();
        loop {
            if list.len() == self.max {
                // One more, skipped unread, is one too many.
                if seq.next_element::<IgnoredAny>()?.is_some()
                    && let Err(refusal) = check::at_most(self.max, self.max + 1, self.what)
                {
                    self.refused.set(Some(refusal));
                    return Err(de::Error::custom("too many"));
                }
                return Ok(list);
            }
            match seq.next_element()? {
                Some(element) => list.push(element),
                None => return Ok(list),
            }
        }
    }
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

/// `POST|PUT /v1.0/publish/{pubsub}/{topic}`: the body as one event
/// (its `Content-Type` the event's), `metadata.*` from the query; 204
/// once the broker acknowledged it.
async fn publish(
    State(state): State<AppState>,
    Path((pubsub, topic)): Path<(String, String)>,
    RawQuery(query): RawQuery,
    access: Access,
    headers: HeaderMap,
    body: Body,
) -> Answer {
    let metadata = query_metadata(query.as_deref());
    check::publish_target(&state, &pubsub, &topic, &metadata)?;
    Check::new(&state, &access).publish(&pubsub, &topic)?;
    let data = bounded_body(&state, &headers, body).await?;
    let event = Event {
        topic: topic.clone(),
        data,
        content_type: content_type(&headers),
        metadata: metadata.clone(),
    };
    let app_id = &state.dapr.settings().app_id;
    state.dapr.publish(&pubsub, event).await.map_err(|error| {
        Failure::of_publish(
            Publishing {
                pubsub: &pubsub,
                topic: &topic,
                app_id,
                metadata: &metadata,
            },
            &error,
        )
    })?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `POST|PUT /v1.0/publish/{pubsub}` without a topic.
async fn publish_no_topic(
    State(state): State<AppState>,
    Path(pubsub): Path<String>,
    RawQuery(query): RawQuery,
) -> Answer {
    let metadata = query_metadata(query.as_deref());
    Err(check::publish_target(&state, &pubsub, "", &metadata)
        .err()
        .unwrap_or_else(|| Refusal::TopicEmpty {
            pubsub,
            metadata: metadata.into_iter().collect(),
        })
        .into())
}

/// The request's content type (empty: none).
fn content_type(headers: &HeaderMap) -> String {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

/// One event of a bulk publish, as Dapr's HTTP API takes it. Go reads
/// JSON field names in any case, and the JS SDK sends `entryID`: the
/// usual spellings are read.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct BulkEntry<'a> {
    #[serde(
        default,
        alias = "entryID",
        alias = "EntryID",
        alias = "EntryId",
        alias = "entryid"
    )]
    entry_id: String,
    #[serde(borrow, alias = "Event")]
    event: &'a RawValue,
    #[serde(default, alias = "ContentType", alias = "contenttype")]
    content_type: String,
    #[serde(default, alias = "Metadata")]
    metadata: Option<HashMap<String, String>>,
}

/// An entry's event as bytes, as Dapr reads it by its content type: a
/// base64 string for `application/octet-stream`, a string for text and
/// XML, the JSON itself (compacted) for JSON and CloudEvents.
fn entry_data(body: &Bytes, entry: &BulkEntry<'_>) -> Result<Bytes, String> {
    let mismatch = || "error: mismatch between contentType and event".to_owned();
    let essence = entry
        .content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    let json = entry.event.get();
    let string = || serde_json::from_str::<String>(json).map_err(|_| mismatch());
    match essence.as_str() {
        "application/octet-stream" => {
            use base64::Engine as _;
            base64::engine::general_purpose::STANDARD
                .decode(string()?)
                .map(Bytes::from)
                .map_err(|error| {
                    format!(
                        "error: unable to decode base64 application/octect-stream data: {error}"
                    )
                })
        }
        text if text.starts_with("text/") || text == "application/xml" => {
            Ok(Bytes::from(string()?))
        }
        "application/json" | "application/cloudevents+json" => {
            Ok(compact_json(body, json.as_bytes()))
        }
        _ => Err(mismatch()),
    }
}

/// `POST|PUT /v1.0-alpha1/publish/bulk/{pubsub}/{topic}` (and `/v1.0/`):
/// each entry as one event, a few at once; 204 when the broker took them
/// all, else 500 with the failed entries, as Dapr answers.
async fn publish_bulk(
    State(state): State<AppState>,
    Path((pubsub, topic)): Path<(String, String)>,
    RawQuery(query): RawQuery,
    access: Access,
    headers: HeaderMap,
    body: Body,
) -> Answer {
    let metadata = query_metadata(query.as_deref());
    check::publish_target(&state, &pubsub, &topic, &metadata)?;
    Check::new(&state, &access).publish(&pubsub, &topic)?;
    let body = bounded_body(&state, &headers, body).await?;
    let entries: Vec<BulkEntry<'_>> = json_list(&body, state.limits.max_batch_ops, Counted::Items)
        .map_err(|refusal| match refusal {
            Refusal::Malformed(error) => {
                check::bulk_events(&state, &pubsub, &topic, BulkFault::Unmarshal(error))
            }
            other => other,
        })?;
    check::entry_ids(
        &state,
        &pubsub,
        &topic,
        entries.iter().map(|entry| entry.entry_id.as_str()),
    )?;
    let mut events = Vec::with_capacity(entries.len());
    for entry in entries {
        let data = entry_data(&body, &entry).map_err(|error| {
            check::bulk_events(&state, &pubsub, &topic, BulkFault::Envelope(error))
        })?;
        let event = Event {
            topic: topic.clone(),
            data,
            content_type: entry.content_type,
            metadata: check::entry_metadata(&metadata, entry.metadata.unwrap_or_default()),
        };
        events.push((entry.entry_id, event));
    }
    let publishing = Publishing {
        pubsub: &pubsub,
        topic: &topic,
        app_id: &state.dapr.settings().app_id,
        metadata: &metadata,
    };
    let failed = state
        .dapr
        .publish_bulk(&pubsub, events)
        .await
        .map_err(|error| Failure::of_publish(publishing, &error))?;
    let Some((_, first)) = failed.first() else {
        return Ok(StatusCode::NO_CONTENT.into_response());
    };
    let failure = Failure::of_publish(publishing, first);
    let failed_entries: Vec<_> = failed
        .iter()
        .map(|(id, error)| serde_json::json!({"entryId": id, "error": error.to_string()}))
        .collect();
    let body = serde_json::json!({"failedEntries": failed_entries, "errorCode": failure.code});
    let mut response = (failure.status, axum::Json(body)).into_response();
    response
        .extensions_mut()
        .insert(crate::http::problem::FailureLog {
            severity: crate::http::problem::Severity::Error,
            cause: format!("{}: {}", failure.code, failure.message),
        });
    Ok(response)
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
    let mut body = serde_json::json!({
        "id": state.dapr.settings().app_id,
        "runtimeVersion": crate::dapr::RUNTIME_VERSION,
        "components": components,
        "extended": state.dapr.extended_metadata().entries(),
    });
    // As daprd: the subscriptions in force (the default route is a rule
    // without a match), and how the app is reached.
    let subscriptions: Vec<_> = state
        .subscriptions
        .list()
        .iter()
        .map(|subscription| {
            let mut json = serde_json::json!({
                "pubsubname": subscription.pubsub_name,
                "topic": subscription.topic,
                "rules": subscription.rules.iter().map(|rule| {
                    let mut json = serde_json::json!({"path": rule.path});
                    if let Some(matcher) = &rule.matcher {
                        json["match"] = matcher.source().into();
                    }
                    json
                }).collect::<Vec<_>>(),
                "deadLetterTopic": subscription.dead_letter_topic.as_deref().unwrap_or(""),
                "type": subscription.kind.as_str(),
            });
            if !subscription.metadata.is_empty() {
                json["metadata"] = serde_json::json!(subscription.metadata);
            }
            json
        })
        .collect();
    if !subscriptions.is_empty() {
        body["subscriptions"] = subscriptions.into();
    }
    if let Some(app) = &state.app {
        body["appConnectionProperties"] = serde_json::json!({
            "port": app.port(),
            "protocol": app.protocol().as_str(),
            "channelAddress": "127.0.0.1",
        });
    }
    Ok(axum::Json(body).into_response())
}

/// `PUT /v1.0/metadata/{name}`: the body is the attribute's value (read
/// as text, as daprd reads it); 204.
async fn set_metadata(
    State(state): State<AppState>,
    Path(name): Path<String>,
    request: Request,
) -> Answer {
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok()?.parse().ok());
    let max = crate::dapr::metadata::MAX_VALUE_BYTES;
    let value = extract::read_body(
        &mut request.into_body(),
        declared,
        max,
        state.request_timeout(),
    )
    .await
    .map_err(|error| match error {
        ApiError::ValueTooLarge { .. } => Failure::of(
            Operation::SetMetadata,
            DaprError::MetadataValueTooLarge(max),
        ),
        other => Refusal::Malformed(other.to_string()).into(),
    })?;
    state
        .dapr
        .extended_metadata()
        .set(&name, String::from_utf8_lossy(&value).into_owned())
        .map_err(Failure::on(Operation::SetMetadata))?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// One item of a save, as Dapr's HTTP API takes it: its value the JSON
/// text it came as, borrowed from the body.
#[derive(Debug, Deserialize)]
struct StateItem<'a> {
    key: String,
    #[serde(default, borrow)]
    value: Option<&'a RawValue>,
    #[serde(default)]
    etag: Option<String>,
    /// Its `metadata` as the JSON it came as, borrowed from the body: read
    /// for `ttlInSeconds` ([`item_ttl`]), and for its other entries only by
    /// a transaction whose upserts an outbox publishes.
    #[serde(default, borrow)]
    metadata: Option<&'a RawValue>,
    #[serde(default)]
    options: Option<StateOptions>,
}

/// An item's `metadata` read for its `ttlInSeconds` alone: the other
/// entries are skipped unread (so a map of many entries holds nothing).
#[derive(Debug, Default)]
struct ItemTtl(Option<String>);

impl<'de> Deserialize<'de> for ItemTtl {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(ItemTtlVisitor)
    }
}

struct ItemTtlVisitor;

impl<'de> Visitor<'de> for ItemTtlVisitor {
    type Value = ItemTtl;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("a map of metadata")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut ttl = None;
        while let Some(name) = map.next_key::<String>()? {
            if name == "ttlInSeconds" {
                ttl = metadata_text(map.next_value::<&RawValue>()?);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(ItemTtl(ttl))
    }
}

/// An item's `ttlInSeconds`, from its metadata's JSON.
fn item_ttl(metadata: Option<&RawValue>) -> Result<Option<String>, Refusal> {
    metadata.map_or(Ok(None), |raw| {
        serde_json::from_str::<Option<ItemTtl>>(raw.get())
            .map(|ttl| ttl.and_then(|ttl| ttl.0))
            .map_err(malformed)
    })
}

/// Every entry of an item's metadata as text (entries of other kinds are
/// left out), for the outbox's events, which carry them.
fn item_metadata(metadata: Option<&RawValue>) -> Result<HashMap<String, String>, Refusal> {
    let Some(raw) = metadata else {
        return Ok(HashMap::new());
    };
    let entries: Option<HashMap<String, &RawValue>> =
        serde_json::from_str(raw.get()).map_err(malformed)?;
    Ok(entries
        .unwrap_or_default()
        .into_iter()
        .filter_map(|(name, value)| Some((name, metadata_text(value)?)))
        .collect())
}

/// A metadata value's text: metadata values are strings in Dapr, and a
/// number is taken as its text; anything else is none. Read from its raw
/// JSON, so that a large value of another kind is never parsed into a tree.
fn metadata_text(value: &RawValue) -> Option<String> {
    let json = value.get();
    match json.as_bytes().first() {
        Some(b'"') => serde_json::from_str(json).ok(),
        Some(b'-' | b'0'..=b'9') => Some(json.to_owned()),
        _ => None,
    }
}

#[derive(Debug, Default, Deserialize)]
struct StateOptions {
    #[serde(default)]
    concurrency: Option<String>,
}

impl StateItem<'_> {
    /// The item as the rules read it: the value is its JSON text,
    /// compacted ([`compact_json`]), read from `body` (which the item was
    /// parsed from); no value is `null`.
    fn into_save(self, body: &Bytes) -> Result<SaveItem, Refusal> {
        let value = self.value.map_or(Bytes::from_static(b"null"), |value| {
            compact_json(body, value.get().as_bytes())
        });
        Ok(SaveItem {
            concurrency: check::concurrency(
                self.options.unwrap_or_default().concurrency.as_deref(),
            )?,
            key: self.key,
            value,
            etag: self.etag,
            ttl: item_ttl(self.metadata)?,
        })
    }
}

/// `json`, valid JSON, without the whitespace between its tokens: compact,
/// as Dapr stores a value, and otherwise as sent (key order, numbers and
/// escapes as written). A slice of `body` when `json` is one and has no
/// whitespace to take out, as an SDK's value has none.
fn compact_json(body: &Bytes, json: &[u8]) -> Bytes {
    let mut compacted: Option<Vec<u8>> = None;
    let mut kept_from = 0;
    let (mut in_string, mut escaped) = (false, false);
    for (at, &byte) in json.iter().enumerate() {
        if in_string {
            match byte {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
        } else if byte == b'"' {
            in_string = true;
        } else if matches!(byte, b' ' | b'\t' | b'\n' | b'\r') {
            let out = compacted.get_or_insert_with(|| Vec::with_capacity(json.len()));
            out.extend_from_slice(&json[kept_from..at]);
            kept_from = at + 1;
        }
    }
    match compacted {
        Some(mut out) => {
            out.extend_from_slice(&json[kept_from..]);
            Bytes::from(out)
        }
        None if body.as_ptr_range().start <= json.as_ptr()
            && json.as_ptr_range().end <= body.as_ptr_range().end =>
        {
            body.slice_ref(json)
        }
        None => Bytes::copy_from_slice(json),
    }
}

/// `POST /v1.0/state/{store}`: saves every item (each as its own write),
/// the query's metadata over each item's.
async fn save(
    State(state): State<AppState>,
    RawQuery(query): RawQuery,
    access: Access,
    StateBody(body): StateBody,
) -> Answer {
    let check = Check::new(&state, &access);
    let items: Vec<StateItem<'_>> = json_list(&body, state.limits.max_batch_ops, Counted::Items)?;
    let query_ttl = query_metadata(query.as_deref()).remove("ttlInSeconds");
    let saves = items
        .into_iter()
        .map(|item| check.save(item.into_save(&body)?, query_ttl.as_deref()))
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
struct BulkRequest<'a> {
    /// Counted as it is read ([`json_list`]).
    #[serde(borrow)]
    keys: &'a RawValue,
    #[serde(default)]
    parallelism: Option<i64>,
}

/// `POST|PUT /v1.0/state/{store}/bulk`: one item per key, in order:
/// `{key, data, etag}`, or `{key}` for an absent key; written as the reads
/// are done.
async fn get_bulk(
    State(state): State<AppState>,
    access: Access,
    StateBody(body): StateBody,
) -> Answer {
    let request: BulkRequest<'_> = serde_json::from_slice(&body).map_err(malformed)?;
    let keys: Vec<String> = json_list(
        request.keys.get().as_bytes(),
        state.limits.max_batch_ops,
        Counted::Keys,
    )?;
    let check = Check::new(&state, &access);
    for key in &keys {
        check.key(key, Need::Read)?;
    }
    let parallelism = usize::try_from(request.parallelism.unwrap_or(0)).unwrap_or(0);
    let reads = state
        .dapr
        .get_bulk(keys, parallelism, state.limits.dapr_max_body_size);
    let items = reads
        .enumerate()
        .flat_map(|(at, read)| stream::iter(bulk_item(at, read)));
    let pieces = stream::iter([Bytes::from_static(b"[")])
        .chain(items)
        .chain(stream::iter([Bytes::from_static(b"]")]));
    let mut response = Response::new(Body::from_stream(
        Joined::new(pieces).map(Ok::<_, Infallible>),
    ));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(response)
}

/// The `at`th item of a bulk answer (`,` before it but for the first), in
/// pieces: a value that is JSON goes in as it is, not parsed or copied; a
/// value that is text but not JSON (written over gRPC or `/keys`) as a
/// JSON string, escaped piece by piece as it is written; bytes that are
/// not UTF-8 as an `error`, so that the answer is always JSON.
fn bulk_item(at: usize, (key, read): BulkRead) -> impl Iterator<Item = Bytes> + Send {
    let mut head = if at == 0 {
        b"{\"key\":".to_vec()
    } else {
        b",{\"key\":".to_vec()
    };
    json_into(&mut head, &key);
    let mut tail = Vec::new();
    let (mut json, mut text) = (None, None);
    match read {
        Ok(None) => {}
        Err(error) => {
            head.extend_from_slice(b",\"error\":");
            json_into(&mut head, &error.to_string());
        }
        Ok(Some(Versioned { value, version })) => {
            match std::str::from_utf8(&value) {
                Ok(valid) if serde_json::from_str::<IgnoredAny>(valid).is_ok() => {
                    head.extend_from_slice(b",\"data\":");
                    json = Some(value);
                }
                Ok(_) => {
                    head.extend_from_slice(b",\"data\":\"");
                    tail.push(b'"');
                    text = Some(value);
                }
                Err(_) => {
                    head.extend_from_slice(b",\"error\":\"the value is not JSON or text\"");
                }
            }
            if let Some(version) = version {
                tail.extend_from_slice(b",\"etag\":");
                json_into(&mut tail, &version.encode());
            }
        }
    }
    tail.push(b'}');
    std::iter::once(Bytes::from(head))
        .chain(json)
        .chain(text.into_iter().flat_map(json_string_pieces))
        .chain(std::iter::once(Bytes::from(tail)))
}

#[derive(Debug, Deserialize)]
struct TransactionRequest<'a> {
    /// Counted as it is read ([`json_list`]).
    #[serde(borrow)]
    operations: &'a RawValue,
}

#[derive(Debug, Deserialize)]
struct TransactionOperation<'a> {
    operation: String,
    #[serde(borrow)]
    request: StateItem<'a>,
}

/// `POST|PUT /v1.0/state/{store}/transaction`: every op or none, in order
/// (see [`crate::dapr`]), the query's metadata over each op's; any
/// failure is 500 `ERR_STATE_TRANSACTION`, as Dapr answers.
async fn transaction(
    State(state): State<AppState>,
    RawQuery(query): RawQuery,
    access: Access,
    StateBody(body): StateBody,
) -> Answer {
    let request: TransactionRequest<'_> = serde_json::from_slice(&body).map_err(malformed)?;
    let operations: Vec<TransactionOperation<'_>> = json_list(
        request.operations.get().as_bytes(),
        state.limits.max_batch_ops,
        Counted::Operations,
    )?;
    let check = Check::new(&state, &access);
    let request_metadata = query_metadata(query.as_deref());
    let query_ttl = request_metadata.get("ttlInSeconds").cloned();
    let mut ops = Vec::with_capacity(operations.len());
    for operation in operations {
        let kind = check::operation(&operation.operation)?;
        // As daprd: the request's metadata over each operation's.
        // Read only for an outbox: a save's metadata may be large.
        let mut metadata = if state.dapr.has_outbox() {
            item_metadata(operation.request.metadata)?
        } else {
            HashMap::new()
        };
        metadata.extend(request_metadata.clone());
        let save = check.save(operation.request.into_save(&body)?, query_ttl.as_deref())?;
        let change = Change::of_json(save.key.clone(), &save.value, metadata);
        ops.push(TxOperation {
            save,
            delete: kind == OperationKind::Delete,
            change,
        });
    }
    state
        .dapr
        .transaction(ops)
        .await
        .map_err(Failure::on(Operation::Transaction))?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `POST|PUT /v1.0-alpha1/state/{store}/query`: one page of Dapr's state
/// query ([`crate::dapr::query`]): `{"results": [{key, data, etag}],
/// "token"}`, each `data` the key's JSON as stored; 204 without a body
/// when nothing matched, as Dapr answers.
async fn query_state(
    State(state): State<AppState>,
    access: Access,
    StateBody(body): StateBody,
) -> Answer {
    let query = Query::parse(&body).map_err(Failure::on(Operation::Query))?;
    let readable = |key: &[u8]| access.allows(key, Need::Read);
    let page = state
        .dapr
        .query(query, &readable, state.request_timeout() / 2)
        .await
        .map_err(Failure::on(Operation::Query))?;
    if page.results.is_empty() {
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    let size: usize = page
        .results
        .iter()
        .map(|item| item.key.len() + item.data.len() + 64)
        .sum();
    let mut out = Vec::with_capacity(size + 64);
    out.extend_from_slice(b"{\"results\":[");
    for (at, item) in page.results.iter().enumerate() {
        if at > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"key\":");
        json_into(&mut out, &item.key);
        // Only JSON values are results: each goes in as it is.
        out.extend_from_slice(b",\"data\":");
        out.extend_from_slice(&item.data);
        if let Some(etag) = &item.etag {
            out.extend_from_slice(b",\"etag\":");
            json_into(&mut out, etag);
        }
        out.push(b'}');
    }
    out.push(b']');
    if let Some(token) = &page.token {
        out.extend_from_slice(b",\"token\":");
        json_into(&mut out, token);
    }
    out.push(b'}');
    let mut response = Response::new(Body::from(out));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(response)
}

/// Every `key=` of the query, in order.
fn query_keys(query: Option<&str>) -> Vec<String> {
    extract::query_pairs(query)
        .filter(|(name, _)| *name == "key")
        .map(|(_, value)| {
            String::from_utf8_lossy(&extract::form_decode(value.as_bytes(), true)).into_owned()
        })
        .collect()
}

/// `GET /v1.0/configuration/{store}?key=a&key=b`: `{"a": {"value",
/// "version"}}` (empty fields left out, as Dapr writes them); no key:
/// every item; 204 when there is none.
async fn get_configuration(
    State(state): State<AppState>,
    Path(store): Path<String>,
    RawQuery(query): RawQuery,
    access: Access,
) -> Answer {
    check::configuration_store(&state, &store)?;
    let names = query_keys(query.as_deref());
    Check::new(&state, &access).configuration_keys(&names)?;
    let readable = |key: &[u8]| access.allows(key, Need::Read);
    let items = state
        .dapr
        .get_configuration(names, &readable)
        .await
        .map_err(Failure::on(Operation::ConfigurationGet))?;
    if items.is_empty() {
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    Ok(axum::Json(items_json(&items)).into_response())
}

/// `GET /v1.0/configuration/{store}/subscribe?key=...`: `{"id"}`; the
/// changes go to the app's `/configuration/{store}/{key}` on its channel
/// ([`crate::dapr::configuration`]; a gRPC app's `OnInvoke`). Without an
/// app channel, as Dapr answers without one.
async fn subscribe_configuration(
    State(state): State<AppState>,
    Path(store): Path<String>,
    RawQuery(query): RawQuery,
    access: Access,
) -> Answer {
    check::configuration_store(&state, &store)?;
    let Some(app) = state.app.clone() else {
        return Err(Refusal::NoAppChannel.into());
    };
    let names = query_keys(query.as_deref());
    Check::new(&state, &access).configuration_keys(&names)?;
    let subscription = state
        .dapr
        .subscribe_configuration(&state.hub, &names, access.live_read_filter())
        .await
        .map_err(Failure::on(Operation::ConfigurationSubscribe))?;
    let id = subscription.id.clone();
    match app.protocol() {
        AppProtocol::Http => {
            tokio::spawn(subscription.deliver_to(app, store));
        }
        AppProtocol::Grpc => {
            let max = state.limits.dapr_max_body_size;
            tokio::spawn(deliver_configuration(subscription, app, store, max));
        }
    }
    Ok(axum::Json(serde_json::json!({ "id": id })).into_response())
}

/// `GET /v1.0/configuration/{store}/{id}/unsubscribe`: `{"ok": true}`,
/// or as Dapr answers an unknown id, 500 with `{"ok": false, "message"}`.
async fn unsubscribe_configuration(
    State(state): State<AppState>,
    Path((store, id)): Path<(String, String)>,
) -> Answer {
    check::configuration_store(&state, &store)?;
    match state.dapr.unsubscribe_configuration(&id) {
        Ok(()) => Ok(axum::Json(serde_json::json!({ "ok": true })).into_response()),
        Err(error) => {
            let failure = Failure::of(Operation::ConfigurationUnsubscribe, error);
            let body = serde_json::json!({ "ok": false, "message": failure.message });
            Ok((failure.status, axum::Json(body)).into_response())
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_is_stored_compact_and_otherwise_as_sent() {
        let body =
            Bytes::from_static(br#"[{"key":"k","value": { "b" : [1, 2.50] , "a":" x\" y\\" } }]"#);
        let items: Vec<StateItem<'_>> = json_list(&body, 8, Counted::Items).unwrap();
        let raw = items[0].value.unwrap().get().as_bytes();
        assert_eq!(
            compact_json(&body, raw),
            Bytes::from_static(br#"{"b":[1,2.50],"a":" x\" y\\"}"#)
        );
        // Nothing to take out: a slice of the body itself.
        let compact = Bytes::from_static(br#"[{"key":"k","value":{"a":[true]}}]"#);
        let items: Vec<StateItem<'_>> = json_list(&compact, 8, Counted::Items).unwrap();
        let stored = compact_json(&compact, items[0].value.unwrap().get().as_bytes());
        assert_eq!(stored, Bytes::from_static(br#"{"a":[true]}"#));
        assert!(compact.as_ptr_range().contains(&stored.as_ptr()));
    }

    #[test]
    fn a_list_is_refused_at_its_first_element_past_the_limit() {
        assert_eq!(
            json_list::<String>(br#"["a","b"]"#, 2, Counted::Keys),
            Ok(vec!["a".to_owned(), "b".to_owned()])
        );
        // The element past the limit is refused before the malformed one.
        assert_eq!(
            json_list::<String>(br#"["a","b","c",nope]"#, 2, Counted::Keys),
            Err(Refusal::TooMany {
                max: 2,
                what: Counted::Keys
            })
        );
        assert!(matches!(
            json_list::<String>(br#"["a",1]"#, 2, Counted::Keys),
            Err(Refusal::Malformed(_))
        ));
        assert!(matches!(
            json_list::<String>(br#"["a"] x"#, 2, Counted::Keys),
            Err(Refusal::Malformed(_))
        ));
    }

    #[test]
    fn only_ttl_in_seconds_is_kept_of_an_items_metadata() {
        let items: Vec<StateItem<'_>> = json_list(
            br#"[{"key":"k","metadata":{"a":{"deep":[1]},"ttlInSeconds":5,"b":"x"}},{"key":"l","metadata":null},
                 {"key":"m","metadata":{"ttlInSeconds":"7"}},{"key":"n","metadata":{"ttlInSeconds":[0,0]}}]"#,
            8,
            Counted::Items,
        )
        .unwrap();
        let ttl = |at: usize| item_ttl(items[at].metadata).unwrap();
        assert_eq!(ttl(0).as_deref(), Some("5"));
        assert_eq!(ttl(1), None);
        assert_eq!(ttl(2).as_deref(), Some("7"));
        assert_eq!(ttl(3), None);
    }

    #[test]
    fn every_bulk_item_is_json() {
        let version = crate::protocol::Hlc::parse("1:2:S").unwrap();
        let read = |value: &'static [u8]| {
            Ok(Some(Versioned {
                value: Bytes::from_static(value),
                version: Some(version.clone()),
            }))
        };
        let items = [
            ("json", read(br#"{"a":1}"#)),
            ("text", read(b"not json")),
            ("quoted", read(b"\"\xff\xfe\"")),
            ("bytes", read(b"\xff")),
            ("absent", Ok(None)),
        ];
        let mut answer = b"[".to_vec();
        for (at, (key, read)) in items.into_iter().enumerate() {
            for piece in bulk_item(at, (key.to_owned(), read)) {
                answer.extend_from_slice(&piece);
            }
        }
        answer.push(b']');
        let answer: serde_json::Value = serde_json::from_slice(&answer).unwrap();
        let etag = version.encode();
        assert_eq!(
            answer,
            serde_json::json!([
                {"key": "json", "data": {"a": 1}, "etag": etag},
                {"key": "text", "data": "not json", "etag": etag},
                {"key": "quoted", "error": "the value is not JSON or text", "etag": etag},
                {"key": "bytes", "error": "the value is not JSON or text", "etag": etag},
                {"key": "absent"},
            ])
        );
    }
}
