//! Dapr's gRPC API (`dapr.proto.runtime.v1.Dapr`): the state and lock
//! methods the Python, Go, .NET and Java SDKs call, served on the key
//! API's port through its router (gRPC is HTTP/2: h2c with prior knowledge,
//! or h2 by ALPN over TLS), behind the same guard, metrics and spans.
//! Every other method of the service answers `UNIMPLEMENTED`. The messages
//! are generated from the vendored protos (`proto/dapr/`).

use std::collections::HashMap;
use std::time::Duration;

use axum::Router;
use axum::response::{IntoResponse as _, Response};
use futures_util::stream::{self, StreamExt as _};
use tonic::{Code, Request, Status};

use crate::access::rules::{Access, Need, Principal};
use crate::dapr::{Concurrency, DaprError, Delete, Save, UnlockStatus, ttl_from_metadata};
use crate::http::state::AppState;
use crate::store::Versioned;

/// The code generated from `proto/dapr/` (Dapr's package layout, which the
/// generated code's paths rely on).
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod proto {
    /// `dapr.proto.common.v1`.
    pub mod common {
        /// Version 1.
        pub mod v1 {
            tonic::include_proto!("dapr.proto.common.v1");
        }
    }
    /// `dapr.proto.runtime.v1`.
    pub mod runtime {
        /// Version 1.
        pub mod v1 {
            tonic::include_proto!("dapr.proto.runtime.v1");
        }
    }
}

use proto::common::v1::{StateItem, state_options::StateConcurrency};
use proto::runtime::v1::dapr_server::{Dapr, DaprServer};
use proto::runtime::v1::{
    BulkStateItem, DeleteStateRequest, ExecuteStateTransactionRequest, GetBulkStateRequest,
    GetBulkStateResponse, GetMetadataRequest, GetMetadataResponse, GetStateRequest,
    GetStateResponse, RegisteredComponents, SaveStateRequest, TryLockRequest, TryLockResponse,
    UnlockRequest, UnlockResponse, unlock_response,
};

/// The service's path prefix.
pub const SERVICE_PREFIX: &str = "/dapr.proto.runtime.v1.Dapr/";

/// The methods served, each its own route (so metrics and spans name it).
const METHODS: [&str; 8] = [
    "GetState",
    "GetBulkState",
    "SaveState",
    "DeleteState",
    "ExecuteStateTransaction",
    "GetMetadata",
    "TryLockAlpha1",
    "UnlockAlpha1",
];

/// The gRPC routes: one per method served, and the rest of the service
/// (answered `UNIMPLEMENTED` by the generated server).
pub fn routes(state: &AppState) -> Router<AppState> {
    let server = DaprServer::new(DaprGrpc {
        state: state.clone(),
    })
    .max_decoding_message_size(state.limits.max_batch_bytes);
    let mut router = Router::new();
    for method in METHODS {
        router = router.route_service(&format!("{SERVICE_PREFIX}{method}"), server.clone());
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

/// A state operation's failure as Dapr's gRPC API answers it.
fn state_status(error: DaprError) -> Status {
    let code = match error {
        DaprError::EtagMismatch => Code::Aborted,
        DaprError::MalformedEtag(_) => Code::InvalidArgument,
        DaprError::DuplicateKey => Code::InvalidArgument,
        DaprError::LeaseBusy(_) | DaprError::TransactionsOff | DaprError::Store(_) => {
            Code::Internal
        }
    };
    Status::new(code, error.to_string())
}

fn concurrency(options: Option<&proto::common::v1::StateOptions>) -> Concurrency {
    match options.map(|options| options.concurrency()) {
        Some(StateConcurrency::ConcurrencyFirstWrite) => Concurrency::FirstWrite,
        _ => Concurrency::LastWrite,
    }
}

impl DaprGrpc {
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

    /// INVALID_ARGUMENT when a request carries more than `--max-batch-ops` items.
    fn at_most_batch_ops(&self, count: usize, what: &str) -> Result<(), Status> {
        if count <= self.state.limits.max_batch_ops {
            return Ok(());
        }
        Err(Status::invalid_argument(format!(
            "at most {} {what}",
            self.state.limits.max_batch_ops
        )))
    }

    fn state_store(&self, name: &str) -> Result<(), Status> {
        if name == self.state.dapr.settings().state_store {
            return Ok(());
        }
        Err(Status::invalid_argument(format!(
            "state store {name} is not found"
        )))
    }

    fn lock_store(&self, name: &str) -> Result<(), Status> {
        if name == self.state.dapr.settings().lock_store {
            return Ok(());
        }
        Err(Status::invalid_argument(format!(
            "lock store {name} is not found"
        )))
    }

    /// The key's length is within the limit and the caller may do `need`.
    fn check_key(&self, access: &Access, key: &str, need: Need) -> Result<(), Status> {
        if key.is_empty() {
            return Err(Status::invalid_argument("a key must not be empty"));
        }
        let store_key = self.state.dapr.store_key(key);
        if store_key.len() > self.state.limits.max_key_bytes {
            return Err(Status::invalid_argument(format!(
                "a key may have at most {} bytes",
                self.state.limits.max_key_bytes
            )));
        }
        if access.require(&store_key, need).is_err() {
            return Err(Status::permission_denied(format!(
                "access to key {key:?} is not allowed"
            )));
        }
        Ok(())
    }

    fn save_of(&self, access: &Access, item: StateItem) -> Result<Save, Status> {
        self.check_key(access, &item.key, Need::Write)?;
        let ttl_ms = ttl_from_metadata(item.metadata.get("ttlInSeconds").map(String::as_str))
            .map_err(Status::invalid_argument)?;
        if item.value.len() > self.state.value_limit() {
            return Err(Status::invalid_argument(format!(
                "a value may have at most {} bytes",
                self.state.value_limit()
            )));
        }
        Ok(Save {
            concurrency: concurrency(item.options.as_ref()),
            etag: item
                .etag
                .map(|etag| etag.value)
                .filter(|etag| !etag.is_empty()),
            value: item.value.into(),
            key: item.key,
            ttl_ms,
        })
    }

    fn lock_names(&self, access: &Access, resource: &str, owner: &str) -> Result<(), Status> {
        if resource.is_empty() {
            return Err(Status::invalid_argument("resource_id is empty"));
        }
        if owner.is_empty() {
            return Err(Status::invalid_argument("lock_owner is empty"));
        }
        if owner.len() > self.state.locks.settings().max_holder_bytes
            || resource.len() > self.state.limits.max_key_bytes
        {
            return Err(Status::invalid_argument(
                "resource_id or lock_owner is too long",
            ));
        }
        if access.require(resource.as_bytes(), Need::Write).is_err() {
            return Err(Status::permission_denied(format!(
                "access to lock {resource:?} is not allowed"
            )));
        }
        Ok(())
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
            data: value.into(),
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
    async fn get_state(&self, request: Request<GetStateRequest>) -> Answer<GetStateResponse> {
        let access = self.access(&request);
        let request = request.into_inner();
        self.state_store(&request.store_name)?;
        self.check_key(&access, &request.key, Need::Read)?;
        let read = self
            .state
            .dapr
            .get(&request.key)
            .await
            .map_err(state_status)?;
        let response = match read {
            None => GetStateResponse::default(),
            Some(Versioned { value, version }) => GetStateResponse {
                data: value.into(),
                etag: version.map(|version| version.encode()).unwrap_or_default(),
                metadata: HashMap::new(),
            },
        };
        Ok(tonic::Response::new(response))
    }

    async fn get_bulk_state(
        &self,
        request: Request<GetBulkStateRequest>,
    ) -> Answer<GetBulkStateResponse> {
        let access = self.access(&request);
        let request = request.into_inner();
        self.state_store(&request.store_name)?;
        self.at_most_batch_ops(request.keys.len(), "keys per request")?;
        for key in &request.keys {
            self.check_key(&access, key, Need::Read)?;
        }
        let parallelism = usize::try_from(request.parallelism).unwrap_or(0);
        let items = self
            .state
            .dapr
            .get_bulk(request.keys, parallelism)
            .await
            .into_iter()
            .map(|(key, read)| item_of(key, read))
            .collect();
        Ok(tonic::Response::new(GetBulkStateResponse { items }))
    }

    async fn save_state(&self, request: Request<SaveStateRequest>) -> Answer<()> {
        let access = self.access(&request);
        let request = request.into_inner();
        self.state_store(&request.store_name)?;
        self.at_most_batch_ops(request.states.len(), "items per request")?;
        let saves = request
            .states
            .into_iter()
            .map(|item| self.save_of(&access, item))
            .collect::<Result<Vec<_>, _>>()?;
        let results: Vec<_> = stream::iter(saves)
            .map(|save| self.state.dapr.save(save))
            .buffered(16)
            .collect()
            .await;
        for result in results {
            result.map_err(state_status)?;
        }
        Ok(tonic::Response::new(()))
    }

    async fn delete_state(&self, request: Request<DeleteStateRequest>) -> Answer<()> {
        let access = self.access(&request);
        let request = request.into_inner();
        self.state_store(&request.store_name)?;
        self.check_key(&access, &request.key, Need::Write)?;
        let delete = Delete {
            concurrency: concurrency(request.options.as_ref()),
            etag: request
                .etag
                .map(|etag| etag.value)
                .filter(|etag| !etag.is_empty()),
            key: request.key,
        };
        self.state.dapr.delete(delete).await.map_err(state_status)?;
        Ok(tonic::Response::new(()))
    }

    async fn execute_state_transaction(
        &self,
        request: Request<ExecuteStateTransactionRequest>,
    ) -> Answer<()> {
        let access = self.access(&request);
        let request = request.into_inner();
        self.state_store(&request.store_name)?;
        self.at_most_batch_ops(request.operations.len(), "operations per transaction")?;
        let mut ops = Vec::with_capacity(request.operations.len());
        for operation in request.operations {
            let delete = match operation.operation_type.as_str() {
                "upsert" => false,
                "delete" => true,
                other => {
                    return Err(Status::invalid_argument(format!(
                        "unknown operation {other:?}: expected upsert or delete"
                    )));
                }
            };
            let item = operation
                .request
                .ok_or_else(|| Status::invalid_argument("an operation without its request"))?;
            let save = self.save_of(&access, item)?;
            ops.push(
                self.state
                    .dapr
                    .tx_op(save, delete)
                    .map_err(|error| Status::invalid_argument(error.to_string()))?,
            );
        }
        // Any failure is INTERNAL, as Dapr answers a failed transaction.
        self.state
            .dapr
            .transaction(ops)
            .await
            .map_err(|error| match error {
                DaprError::DuplicateKey => Status::invalid_argument(error.to_string()),
                error => Status::internal(error.to_string()),
            })?;
        Ok(tonic::Response::new(()))
    }

    async fn get_metadata(
        &self,
        _request: Request<GetMetadataRequest>,
    ) -> Answer<GetMetadataResponse> {
        let settings = self.state.dapr.settings();
        Ok(tonic::Response::new(GetMetadataResponse {
            id: settings.app_id.clone(),
            registered_components: vec![
                RegisteredComponents {
                    name: settings.state_store.clone(),
                    r#type: crate::dapr::STATE_COMPONENT_TYPE.to_owned(),
                    version: "v1".to_owned(),
                    capabilities: self
                        .state
                        .dapr
                        .capabilities()
                        .iter()
                        .map(|&capability| capability.to_owned())
                        .collect(),
                },
                RegisteredComponents {
                    name: settings.lock_store.clone(),
                    r#type: crate::dapr::LOCK_COMPONENT_TYPE.to_owned(),
                    version: "v1".to_owned(),
                    capabilities: Vec::new(),
                },
            ],
            runtime_version: concat!("statestore-gateway/", env!("CARGO_PKG_VERSION")).to_owned(),
            ..GetMetadataResponse::default()
        }))
    }

    async fn try_lock_alpha1(&self, request: Request<TryLockRequest>) -> Answer<TryLockResponse> {
        let access = self.access(&request);
        let request = request.into_inner();
        self.lock_store(&request.store_name)?;
        self.lock_names(&access, &request.resource_id, &request.lock_owner)?;
        let seconds = u64::try_from(request.expiry_in_seconds)
            .ok()
            .filter(|&s| s > 0)
            .ok_or_else(|| {
                Status::invalid_argument("expiry_in_seconds must be greater than zero")
            })?;
        let success = self
            .state
            .dapr
            .try_lock(
                &request.resource_id,
                &request.lock_owner,
                Duration::from_secs(seconds),
            )
            .await
            .map_err(|error| Status::internal(error.to_string()))?;
        Ok(tonic::Response::new(TryLockResponse { success }))
    }

    async fn unlock_alpha1(&self, request: Request<UnlockRequest>) -> Answer<UnlockResponse> {
        let access = self.access(&request);
        let request = request.into_inner();
        self.lock_store(&request.store_name)?;
        self.lock_names(&access, &request.resource_id, &request.lock_owner)?;
        let status = self
            .state
            .dapr
            .unlock(&request.resource_id, &request.lock_owner)
            .await
            .map_err(|error| Status::internal(error.to_string()))?;
        let status = match status {
            UnlockStatus::Success => unlock_response::Status::Success,
            UnlockStatus::LockDoesNotExist => unlock_response::Status::LockDoesNotExist,
            UnlockStatus::LockBelongsToOthers => unlock_response::Status::LockBelongsToOthers,
        };
        Ok(tonic::Response::new(UnlockResponse {
            status: status as i32,
        }))
    }
}
