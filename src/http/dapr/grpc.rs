//! Dapr's gRPC API (`dapr.proto.runtime.v1.Dapr`): the state and lock
//! methods the Python, Go, .NET and Java SDKs call, served on the key
//! API's port through its router (gRPC is HTTP/2: h2c with prior knowledge,
//! or h2 by ALPN over TLS), behind the same guard, metrics and spans.
//! Every other method of the service answers `UNIMPLEMENTED`, its message
//! unread. Only the wire shapes live here: the rules are
//! [`super::check`]'s, the codes [`super::answer`]'s; each request's
//! message is sized and counted before it is decoded ([`super::codec`]).
//!
//! A message may have at most `--dapr-max-body-size` bytes either way, as
//! Dapr's gRPC server allows: an answer that would be larger, a `GetState`
//! of a larger value or a `GetBulkState` whose values add up to more, is
//! `RESOURCE_EXHAUSTED`, found out as the values are read (a bulk read
//! stops at the first value past the limit).

use std::collections::HashMap;

use axum::Router;
use axum::response::{IntoResponse as _, Response};
use std::pin::Pin;

use futures_util::stream::{self, Stream, StreamExt as _};
use prost::Message as _;
use tonic::codegen::BoxStream;
use tonic::{Code, Request, Status};

use super::answer::{Failure, Operation, Publishing};
use super::check::{self, Check, OperationKind, Refusal, SaveItem};
use super::codec::{Checked, DecodeLimits};
use super::proto::common::v1::{
    ConfigurationItem, StateItem, StateOptions, state_options::StateConcurrency,
};
use super::proto::runtime::v1::dapr_server::{Dapr, DaprServer};
use super::proto::runtime::v1::{
    AppConnectionProperties, BulkPublishRequest, BulkPublishResponse, BulkStateItem,
    DeleteStateRequest, ExecuteStateTransactionRequest, GetBulkStateRequest, GetBulkStateResponse,
    GetConfigurationRequest, GetConfigurationResponse, GetMetadataRequest, GetMetadataResponse,
    GetStateRequest, GetStateResponse, PublishEventRequest, PubsubSubscription,
    PubsubSubscriptionRule, PubsubSubscriptionRules, PubsubSubscriptionType, QueryStateItem,
    QueryStateRequest, QueryStateResponse, RegisteredComponents, SaveStateRequest,
    SetMetadataRequest, SubscribeConfigurationRequest, SubscribeConfigurationResponse,
    SubscribeTopicEventsRequestAlpha1, SubscribeTopicEventsResponseAlpha1, TryLockRequest,
    TryLockResponse, UnlockRequest, UnlockResponse, UnsubscribeConfigurationRequest,
    UnsubscribeConfigurationResponse,
    subscribe_topic_events_request_alpha1::SubscribeTopicEventsRequestType,
};
use crate::access::rules::{Access, Need, Principal};
use crate::dapr::configuration::Items;
use crate::dapr::pubsub::SubscriptionKind;
use crate::dapr::query::Query;
use crate::dapr::{Change, Concurrency, DaprError, Delete, Event, TxOperation};
use crate::http::state::AppState;
use crate::store::Versioned;

/// The service's path prefix.
const SERVICE_PREFIX: &str = "/dapr.proto.runtime.v1.Dapr/";

/// The methods served, each its own route (so metrics and spans name it).
const METHODS: [&str; 19] = [
    "GetState",
    "GetBulkState",
    "SaveState",
    "DeleteState",
    "ExecuteStateTransaction",
    "GetMetadata",
    "SetMetadata",
    "QueryStateAlpha1",
    "GetConfiguration",
    "GetConfigurationAlpha1",
    "SubscribeConfiguration",
    "SubscribeConfigurationAlpha1",
    "UnsubscribeConfiguration",
    "UnsubscribeConfigurationAlpha1",
    "TryLockAlpha1",
    "UnlockAlpha1",
    "PublishEvent",
    "BulkPublishEventAlpha1",
    "BulkPublishEvent",
];

/// The gRPC routes: one per method served, held to the gateway's
/// [`DecodeLimits`], and the rest of the service (answered
/// `UNIMPLEMENTED` by the generated server, which reads nothing of them).
pub(super) fn routes(state: &AppState) -> Router<AppState> {
    let max = state.limits.dapr_max_body_size;
    let server = DaprServer::new(DaprGrpc {
        state: state.clone(),
    })
    .max_decoding_message_size(max)
    .max_encoding_message_size(max);
    let served = Checked::new(server.clone(), DecodeLimits::of(state));
    let mut router = Router::new();
    for method in METHODS {
        router = router.route_service(&format!("{SERVICE_PREFIX}{method}"), served.clone());
    }
    router.route_service(&format!("{SERVICE_PREFIX}{{*method}}"), server)
}

/// Whether a request is a gRPC call (its answers must be gRPC statuses).
pub fn is_grpc(headers: &axum::http::HeaderMap) -> bool {
    headers
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|value| value.as_bytes().starts_with(b"application/grpc"))
}

/// A gRPC status as a whole answer (trailers only), for refusals made
/// before the service runs (the guard's 401, its backstop).
pub fn status_response(code: Code, message: impl Into<String>) -> Response {
    Status::new(code, message)
        .into_http::<axum::body::Body>()
        .into_response()
}

/// The service: Dapr's shapes onto [`crate::dapr`].
#[derive(Debug, Clone)]
struct DaprGrpc {
    state: AppState,
}

type Answer<T> = Result<tonic::Response<T>, Status>;

fn failed(operation: Operation) -> impl Fn(DaprError) -> Status {
    move |error| Failure::of(operation, error).into()
}

fn concurrency(options: Option<&StateOptions>) -> Concurrency {
    match options.map(StateOptions::concurrency) {
        Some(StateConcurrency::ConcurrencyFirstWrite) => Concurrency::FirstWrite,
        _ => Concurrency::LastWrite,
    }
}

/// A state item as the rules read it.
fn save_item(item: StateItem) -> SaveItem {
    SaveItem {
        concurrency: concurrency(item.options.as_ref()),
        etag: item.etag.map(|etag| etag.value),
        ttl: item.metadata.get("ttlInSeconds").cloned(),
        value: item.value,
        key: item.key,
    }
}

impl DaprGrpc {
    /// `BulkPublishEventAlpha1` and `BulkPublishEvent`: every entry is
    /// published (a few at once); any failure fails the call, as daprd's
    /// (whose failed entries only travel over HTTP).
    async fn bulk_publish(
        &self,
        request: Request<BulkPublishRequest>,
    ) -> Answer<BulkPublishResponse> {
        let access = self.access(&request);
        let request = request.into_inner();
        let (pubsub, topic) = (request.pubsub_name, request.topic);
        check::publish_target(&self.state, &pubsub, &topic, &request.metadata)
            .map_err(grpc_publish_refusal)?;
        Check::new(&self.state, &access).publish(&pubsub, &topic)?;
        check::entry_ids(
            &self.state,
            &pubsub,
            &topic,
            request.entries.iter().map(|entry| entry.entry_id.as_str()),
        )?;
        let events = request
            .entries
            .into_iter()
            .map(|entry| {
                let event = Event {
                    topic: topic.clone(),
                    data: entry.event,
                    content_type: entry.content_type,
                    metadata: check::entry_metadata(&request.metadata, entry.metadata),
                };
                (entry.entry_id, event)
            })
            .collect();
        let publishing = Publishing {
            pubsub: &pubsub,
            topic: &topic,
            app_id: &self.state.dapr.settings().app_id,
            metadata: &request.metadata,
        };
        let failed = self
            .state
            .dapr
            .publish_bulk(&pubsub, events)
            .await
            .map_err(|error| Status::from(Failure::of_publish(publishing, &error)))?;
        if let Some((_, error)) = failed.first() {
            return Err(Failure::of_publish(publishing, error).into());
        }
        Ok(tonic::Response::new(BulkPublishResponse::default()))
    }

    /// The caller's access, as the guard put it on the request.
    fn access<T>(&self, request: &Request<T>) -> Access {
        match &self.state.callers.authz {
            None => Access::default(),
            Some(authz) => request
                .extensions()
                .get::<Access>()
                .cloned()
                .unwrap_or_else(|| authz.access(Principal::Nobody)),
        }
    }
}

/// A server stream of the service.
type Streamed<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// Configuration items as the protos carry them.
fn configuration_items(items: Items) -> HashMap<String, ConfigurationItem> {
    items
        .into_iter()
        .map(|(name, item)| {
            let item = ConfigurationItem {
                value: item.value,
                version: item.version,
                metadata: HashMap::new(),
            };
            (name, item)
        })
        .collect()
}

impl DaprGrpc {
    async fn get_configuration_items(
        &self,
        request: Request<GetConfigurationRequest>,
    ) -> Answer<GetConfigurationResponse> {
        let access = self.access(&request);
        let request = request.into_inner();
        check::configuration_store(&self.state, &request.store_name)?;
        Check::new(&self.state, &access).configuration_keys(&request.keys)?;
        let readable = |key: &[u8]| access.allows(key, Need::Read);
        let items = self
            .state
            .dapr
            .get_configuration(request.keys, &readable)
            .await
            .map_err(failed(Operation::ConfigurationGet))?;
        let response = GetConfigurationResponse {
            items: configuration_items(items),
        };
        let max = self.state.limits.dapr_max_body_size;
        if response.encoded_len() > max {
            return Err(Status::from(Refusal::AnswerTooLarge(max)));
        }
        Ok(tonic::Response::new(response))
    }

    /// A subscription's stream: first its id alone, then one message per
    /// change, until it is unsubscribed, the client goes or the gateway
    /// shuts down.
    async fn subscribe_configuration_items(
        &self,
        request: Request<SubscribeConfigurationRequest>,
    ) -> Answer<Streamed<SubscribeConfigurationResponse>> {
        let access = self.access(&request);
        let request = request.into_inner();
        check::configuration_store(&self.state, &request.store_name)?;
        Check::new(&self.state, &access).configuration_keys(&request.keys)?;
        let subscription = self
            .state
            .dapr
            .subscribe_configuration(&self.state.hub, &request.keys, access.live_read_filter())
            .await
            .map_err(failed(Operation::ConfigurationSubscribe))?;
        let first = SubscribeConfigurationResponse {
            id: subscription.id.clone(),
            items: HashMap::new(),
        };
        let changes = stream::unfold(subscription, |mut subscription| async move {
            let items = subscription.next().await?;
            let message = SubscribeConfigurationResponse {
                id: subscription.id.clone(),
                items: configuration_items(items),
            };
            Some((Ok(message), subscription))
        });
        let stream = stream::once(async { Ok(first) }).chain(changes);
        Ok(tonic::Response::new(Box::pin(stream)))
    }

    fn unsubscribe(
        &self,
        request: Request<UnsubscribeConfigurationRequest>,
    ) -> Answer<UnsubscribeConfigurationResponse> {
        let request = request.into_inner();
        check::configuration_store(&self.state, &request.store_name)?;
        // As Dapr answers: an unknown id is `ok: false`, not an error.
        let response = match self.state.dapr.unsubscribe_configuration(&request.id) {
            Ok(()) => UnsubscribeConfigurationResponse {
                ok: true,
                message: String::new(),
            },
            Err(error) => UnsubscribeConfigurationResponse {
                ok: false,
                message: error.to_string(),
            },
        };
        Ok(tonic::Response::new(response))
    }
}

fn item_of(key: String, read: Result<Option<Versioned<bytes::Bytes>>, DaprError>) -> BulkStateItem {
    match read {
        Ok(None) => BulkStateItem {
            key,
            ..BulkStateItem::default()
        },
        Ok(Some(Versioned { value, version })) => BulkStateItem {
            key,
            data: value,
            etag: version.map(|version| version.encode()).unwrap_or_default(),
            ..BulkStateItem::default()
        },
        Err(error) => BulkStateItem {
            key,
            error: error.to_string(),
            ..BulkStateItem::default()
        },
    }
}

#[tonic::async_trait]
impl Dapr for DaprGrpc {
    async fn subscribe_topic_events_alpha1(
        &self,
        request: Request<tonic::Streaming<SubscribeTopicEventsRequestAlpha1>>,
    ) -> Answer<BoxStream<SubscribeTopicEventsResponseAlpha1>> {
        let mut requests = request.into_inner();
        let first = tokio::time::timeout(self.state.request_timeout(), requests.message())
            .await
            .map_err(|_| Status::deadline_exceeded("no initial request"))??;
        let Some(SubscribeTopicEventsRequestType::InitialRequest(initial)) =
            first.and_then(|first| first.subscribe_topic_events_request_type)
        else {
            return Err(Status::invalid_argument(
                "initial request is required to start a subscription stream",
            ));
        };
        if !self
            .state
            .dapr
            .settings()
            .pubsubs
            .contains(&initial.pubsub_name)
        {
            return Err(Status::invalid_argument(format!(
                "pubsub '{}' not found",
                initial.pubsub_name
            )));
        }
        if initial.topic.is_empty() {
            return Err(Status::invalid_argument("topic is required"));
        }
        let events = super::delivery::stream(&self.state, initial, requests)
            .map_err(|error| Status::invalid_argument(error.to_string()))?;
        Ok(tonic::Response::new(Box::pin(events)))
    }

    async fn get_state(&self, request: Request<GetStateRequest>) -> Answer<GetStateResponse> {
        let access = self.access(&request);
        let request = request.into_inner();
        check::state_store(&self.state, &request.store_name)?;
        Check::new(&self.state, &access).key(&request.key, Need::Read)?;
        let read = self
            .state
            .dapr
            .get(&request.key)
            .await
            .map_err(failed(Operation::Get))?;
        let response = match read {
            None => GetStateResponse::default(),
            Some(Versioned { value, version }) => GetStateResponse {
                data: value,
                etag: version.map(|version| version.encode()).unwrap_or_default(),
                metadata: HashMap::new(),
            },
        };
        let max = self.state.limits.dapr_max_body_size;
        if response.encoded_len() > max {
            return Err(Status::from(Refusal::AnswerTooLarge(max)));
        }
        Ok(tonic::Response::new(response))
    }

    async fn get_bulk_state(
        &self,
        request: Request<GetBulkStateRequest>,
    ) -> Answer<GetBulkStateResponse> {
        let access = self.access(&request);
        let request = request.into_inner();
        check::state_store(&self.state, &request.store_name)?;
        // The keys are counted as the message is decoded.
        let check = Check::new(&self.state, &access);
        for key in &request.keys {
            check.key(key, Need::Read)?;
        }
        let parallelism = usize::try_from(request.parallelism).unwrap_or(0);
        let max = self.state.limits.dapr_max_body_size;
        let mut reads = std::pin::pin!(self.state.dapr.get_bulk(request.keys, parallelism, max));
        let mut answer = GetBulkStateResponse::default();
        let mut size = 0;
        while let Some((key, read)) = reads.next().await {
            let item = item_of(key, read);
            size += prost::encoding::message::encoded_len(1, &item);
            if size > max {
                return Err(Status::from(Refusal::AnswerTooLarge(max)));
            }
            answer.items.push(item);
        }
        Ok(tonic::Response::new(answer))
    }

    async fn save_state(&self, request: Request<SaveStateRequest>) -> Answer<()> {
        let access = self.access(&request);
        let request = request.into_inner();
        check::state_store(&self.state, &request.store_name)?;
        // The items are counted as the message is decoded.
        let check = Check::new(&self.state, &access);
        let saves = request
            .states
            .into_iter()
            .map(|item| check.save(save_item(item), None))
            .collect::<Result<Vec<_>, _>>()?;
        self.state
            .dapr
            .save_all(saves)
            .await
            .map_err(failed(Operation::Save))?;
        Ok(tonic::Response::new(()))
    }

    async fn delete_state(&self, request: Request<DeleteStateRequest>) -> Answer<()> {
        let access = self.access(&request);
        let request = request.into_inner();
        check::state_store(&self.state, &request.store_name)?;
        Check::new(&self.state, &access).key(&request.key, Need::Write)?;
        let delete = Delete {
            concurrency: concurrency(request.options.as_ref()),
            etag: request
                .etag
                .map(|etag| etag.value)
                .filter(|etag| !etag.is_empty()),
            key: request.key,
        };
        self.state
            .dapr
            .delete(delete)
            .await
            .map_err(failed(Operation::Delete))?;
        Ok(tonic::Response::new(()))
    }

    async fn execute_state_transaction(
        &self,
        request: Request<ExecuteStateTransactionRequest>,
    ) -> Answer<()> {
        let access = self.access(&request);
        let request = request.into_inner();
        check::state_store(&self.state, &request.store_name)?;
        // The operations are counted as the message is decoded.
        let check = Check::new(&self.state, &access);
        let mut ops = Vec::with_capacity(request.operations.len());
        for operation in request.operations {
            let kind = check::operation(&operation.operation_type)?;
            let item = operation
                .request
                .ok_or_else(|| Status::from(Refusal::OperationWithoutRequest))?;
            let change = Change {
                key: item.key.clone(),
                data: item.value.clone(),
                metadata: item.metadata.clone(),
            };
            let save = check.save(save_item(item), None)?;
            ops.push(TxOperation {
                save,
                delete: kind == OperationKind::Delete,
                change,
            });
        }
        self.state
            .dapr
            .transaction(ops)
            .await
            .map_err(failed(Operation::Transaction))?;
        Ok(tonic::Response::new(()))
    }

    async fn get_metadata(
        &self,
        _request: Request<GetMetadataRequest>,
    ) -> Answer<GetMetadataResponse> {
        let registered_components = self
            .state
            .dapr
            .components()
            .into_iter()
            .map(|component| RegisteredComponents {
                name: component.name.to_owned(),
                r#type: component.kind.to_owned(),
                version: component.version.to_owned(),
                capabilities: component
                    .capabilities
                    .iter()
                    .map(|&capability| capability.to_owned())
                    .collect(),
            })
            .collect();
        let subscriptions = self
            .state
            .subscriptions
            .list()
            .into_iter()
            .map(|subscription| PubsubSubscription {
                r#type: match subscription.kind {
                    SubscriptionKind::Declarative => PubsubSubscriptionType::Declarative,
                    SubscriptionKind::Programmatic => PubsubSubscriptionType::Programmatic,
                    SubscriptionKind::Streaming => PubsubSubscriptionType::Streaming,
                }
                .into(),
                rules: Some(PubsubSubscriptionRules {
                    rules: subscription
                        .rules
                        .iter()
                        .map(|rule| PubsubSubscriptionRule {
                            r#match: rule
                                .matcher
                                .as_ref()
                                .map(|matcher| matcher.source().to_owned())
                                .unwrap_or_default(),
                            path: rule.path.clone(),
                        })
                        .collect(),
                }),
                dead_letter_topic: subscription.dead_letter_topic.unwrap_or_default(),
                metadata: subscription.metadata.into_iter().collect(),
                pubsub_name: subscription.pubsub_name,
                topic: subscription.topic,
            })
            .collect();
        let app_connection_properties =
            self.state.app.as_ref().map(|app| AppConnectionProperties {
                port: i32::from(app.port()),
                protocol: app.protocol().as_str().to_owned(),
                channel_address: "127.0.0.1".to_owned(),
                ..AppConnectionProperties::default()
            });
        Ok(tonic::Response::new(GetMetadataResponse {
            id: self.state.dapr.settings().app_id.clone(),
            registered_components,
            runtime_version: crate::dapr::RUNTIME_VERSION.to_owned(),
            extended_metadata: self
                .state
                .dapr
                .extended_metadata()
                .entries()
                .into_iter()
                .collect(),
            subscriptions,
            app_connection_properties,
            ..GetMetadataResponse::default()
        }))
    }

    async fn publish_event(&self, request: Request<PublishEventRequest>) -> Answer<()> {
        let access = self.access(&request);
        let request = request.into_inner();
        let (pubsub, topic) = (request.pubsub_name, request.topic);
        check::publish_target(&self.state, &pubsub, &topic, &request.metadata)
            .map_err(grpc_publish_refusal)?;
        Check::new(&self.state, &access).publish(&pubsub, &topic)?;
        let event = Event {
            topic: topic.clone(),
            data: request.data,
            content_type: request.data_content_type,
            metadata: request.metadata.clone(),
        };
        let publishing = Publishing {
            pubsub: &pubsub,
            topic: &topic,
            app_id: &self.state.dapr.settings().app_id,
            metadata: &request.metadata,
        };
        self.state
            .dapr
            .publish(&pubsub, event)
            .await
            .map_err(|error| Status::from(Failure::of_publish(publishing, &error)))?;
        Ok(tonic::Response::new(()))
    }

    async fn bulk_publish_event_alpha1(
        &self,
        request: Request<BulkPublishRequest>,
    ) -> Answer<BulkPublishResponse> {
        self.bulk_publish(request).await
    }

    async fn bulk_publish_event(
        &self,
        request: Request<BulkPublishRequest>,
    ) -> Answer<BulkPublishResponse> {
        self.bulk_publish(request).await
    }

    async fn set_metadata(&self, request: Request<SetMetadataRequest>) -> Answer<()> {
        let request = request.into_inner();
        self.state
            .dapr
            .extended_metadata()
            .set(&request.key, request.value)
            .map_err(failed(Operation::SetMetadata))?;
        Ok(tonic::Response::new(()))
    }

    async fn query_state_alpha1(
        &self,
        request: Request<QueryStateRequest>,
    ) -> Answer<QueryStateResponse> {
        let access = self.access(&request);
        let request = request.into_inner();
        check::state_store(&self.state, &request.store_name)?;
        let query = Query::parse(request.query.as_bytes()).map_err(failed(Operation::Query))?;
        let readable = |key: &[u8]| access.allows(key, Need::Read);
        let page = self
            .state
            .dapr
            .query(query, &readable, self.state.request_timeout() / 2)
            .await
            .map_err(failed(Operation::Query))?;
        let response = QueryStateResponse {
            results: page
                .results
                .into_iter()
                .map(|item| QueryStateItem {
                    key: item.key,
                    data: item.data,
                    etag: item.etag.unwrap_or_default(),
                    error: String::new(),
                })
                .collect(),
            token: page.token.unwrap_or_default(),
            metadata: HashMap::new(),
        };
        let max = self.state.limits.dapr_max_body_size;
        if response.encoded_len() > max {
            return Err(Status::from(Refusal::AnswerTooLarge(max)));
        }
        Ok(tonic::Response::new(response))
    }

    async fn get_configuration(
        &self,
        request: Request<GetConfigurationRequest>,
    ) -> Answer<GetConfigurationResponse> {
        self.get_configuration_items(request).await
    }

    async fn get_configuration_alpha1(
        &self,
        request: Request<GetConfigurationRequest>,
    ) -> Answer<GetConfigurationResponse> {
        self.get_configuration_items(request).await
    }

    async fn subscribe_configuration(
        &self,
        request: Request<SubscribeConfigurationRequest>,
    ) -> Answer<Streamed<SubscribeConfigurationResponse>> {
        self.subscribe_configuration_items(request).await
    }

    async fn subscribe_configuration_alpha1(
        &self,
        request: Request<SubscribeConfigurationRequest>,
    ) -> Answer<Streamed<SubscribeConfigurationResponse>> {
        self.subscribe_configuration_items(request).await
    }

    async fn unsubscribe_configuration(
        &self,
        request: Request<UnsubscribeConfigurationRequest>,
    ) -> Answer<UnsubscribeConfigurationResponse> {
        self.unsubscribe(request)
    }

    async fn unsubscribe_configuration_alpha1(
        &self,
        request: Request<UnsubscribeConfigurationRequest>,
    ) -> Answer<UnsubscribeConfigurationResponse> {
        self.unsubscribe(request)
    }

    async fn try_lock_alpha1(&self, request: Request<TryLockRequest>) -> Answer<TryLockResponse> {
        let access = self.access(&request);
        let request = request.into_inner();
        check::lock_store(&self.state, &request.store_name)?;
        Check::new(&self.state, &access).try_lock(&request.resource_id, &request.lock_owner)?;
        let expiry = check::expiry(i64::from(request.expiry_in_seconds))?;
        let success = self
            .state
            .dapr
            .try_lock(&request.resource_id, &request.lock_owner, expiry)
            .await
            .map_err(failed(Operation::TryLock))?;
        Ok(tonic::Response::new(TryLockResponse { success }))
    }

    async fn unlock_alpha1(&self, request: Request<UnlockRequest>) -> Answer<UnlockResponse> {
        let access = self.access(&request);
        let request = request.into_inner();
        check::lock_store(&self.state, &request.store_name)?;
        Check::new(&self.state, &access).unlock(&request.resource_id, &request.lock_owner)?;
        let status = self
            .state
            .dapr
            .unlock(&request.resource_id, &request.lock_owner)
            .await
            .map_err(failed(Operation::Unlock))?;
        // Numbered as Dapr's `UnlockResponse.Status`.
        Ok(tonic::Response::new(UnlockResponse {
            status: status as i32,
        }))
    }
}

/// A publish's target refused over gRPC: daprd's gRPC API names no
/// metadata in a pub/sub that is not found (its HTTP API names the
/// request's).
fn grpc_publish_refusal(refusal: Refusal) -> Refusal {
    match refusal {
        Refusal::PubsubNotFound { pubsub, .. } => Refusal::PubsubNotFound {
            pubsub,
            metadata: None,
        },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::super::proto::runtime::v1::unlock_response::Status as Proto;
    use crate::dapr::UnlockStatus;

    #[test]
    fn unlock_statuses_are_numbered_as_daprs() {
        assert_eq!(UnlockStatus::Success as i32, Proto::Success as i32);
        assert_eq!(
            UnlockStatus::LockDoesNotExist as i32,
            Proto::LockDoesNotExist as i32
        );
        assert_eq!(
            UnlockStatus::LockBelongsToOthers as i32,
            Proto::LockBelongsToOthers as i32
        );
    }
}
