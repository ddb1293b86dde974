//! How Dapr answers a failure, over HTTP (a status and Dapr's `errorCode`
//! in `{"errorCode", "message"}`) and over gRPC (a status code), side by
//! side in one table: a [`Refusal`] of the request, or a [`DaprError`] of
//! the operation it ran. Both front ends answer through [`Failure`], so a
//! case means the same over either. A refusal Dapr builds with its errors
//! kit also carries its [`Details`] (google.rpc messages): in the gRPC
//! status, and in the HTTP body's `details`.

use std::collections::{BTreeMap, HashMap};

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use tonic::Code;
use tonic_types::{BadRequest, ErrorDetail, ErrorInfo, ResourceInfo, StatusExt as _};

use super::check::{BulkFault, ILLEGAL_TOPIC, LockCall, Refusal};
use crate::dapr::{DaprError, PubsubError};
use crate::http::problem::{FailureLog, Severity};

/// The Dapr operation that failed: it names the HTTP `errorCode` of a
/// failure in the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// Get one key.
    Get,
    /// Save items.
    Save,
    /// Delete one key.
    Delete,
    /// A transaction.
    Transaction,
    /// `tryLock`.
    TryLock,
    /// `unlock`.
    Unlock,
    /// Set an extended metadata attribute.
    SetMetadata,
    /// A state query (alpha).
    Query,
    /// Get configuration items.
    ConfigurationGet,
    /// Subscribe to configuration items.
    ConfigurationSubscribe,
    /// End a configuration subscription.
    ConfigurationUnsubscribe,
}

/// A failure as Dapr answers it, over either protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The HTTP status.
    pub status: StatusCode,
    /// Dapr's HTTP `errorCode`.
    pub code: &'static str,
    /// The gRPC status code.
    pub grpc: Code,
    /// What went wrong, the same over both (over HTTP, a failure with
    /// details wraps it as Dapr's HTTP handlers do).
    pub message: String,
    /// Dapr's error details, when it sends them.
    pub details: Option<Details>,
}

/// The error details Dapr's errors kit attaches, in its order: a
/// `BadRequest` with one field violation (state's illegal key), a
/// `ResourceInfo` (all but a pub/sub that is not found) and an
/// `ErrorInfo` (domain `dapr.io`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Details {
    /// The field violation's field: the key as the app named it.
    pub field: Option<String>,
    /// The resource's type (`state`, `pubsub`), name (the component's)
    /// and description.
    pub resource: Option<(&'static str, String, String)>,
    /// `ErrorInfo`'s reason.
    pub reason: &'static str,
    /// `ErrorInfo`'s metadata; none is Go's nil map (`null` over HTTP).
    pub metadata: Option<BTreeMap<String, String>>,
    /// Whether Dapr's HTTP handler wraps the message once more (`api
    /// error: code = ... desc = ...`), as its state routes do; its pub/sub
    /// routes answer the errors kit's JSON as it is.
    pub wrapped: bool,
}

/// `ErrorInfo`'s domain in every Dapr error.
const DAPR_DOMAIN: &str = "dapr.io";

use StatusCode as S;

const MALFORMED: &str = "ERR_MALFORMED_REQUEST";

/// A refusal's answer: its status, error code and gRPC code.
type Row = (StatusCode, &'static str, Code);

/// The table of refusals: one row per case.
fn refusal_row(refusal: &Refusal) -> Row {
    match refusal {
        Refusal::IllegalKey { .. } => (S::BAD_REQUEST, MALFORMED, Code::InvalidArgument),
        Refusal::IllegalResource {
            call: LockCall::TryLock,
            ..
        } => (S::INTERNAL_SERVER_ERROR, "ERR_TRY_LOCK", Code::Internal),
        Refusal::IllegalResource {
            call: LockCall::Unlock,
            ..
        } => (S::INTERNAL_SERVER_ERROR, "ERR_UNLOCK", Code::Internal),
        Refusal::StateStoreNotFound(_) => (
            S::BAD_REQUEST,
            "ERR_STATE_STORE_NOT_FOUND",
            Code::InvalidArgument,
        ),
        Refusal::LockStoreNotFound(_) => (
            S::BAD_REQUEST,
            "ERR_LOCK_STORE_NOT_FOUND",
            Code::InvalidArgument,
        ),
        Refusal::ConfigurationStoreNotFound(_) => (
            S::BAD_REQUEST,
            "ERR_CONFIGURATION_STORE_NOT_FOUND",
            Code::InvalidArgument,
        ),
        Refusal::Forbidden(_) => (
            S::FORBIDDEN,
            "ERR_PERMISSION_DENIED",
            Code::PermissionDenied,
        ),
        Refusal::TooMany { .. } | Refusal::TooManyElements(_) | Refusal::ValueTooLarge(_) => {
            (S::PAYLOAD_TOO_LARGE, MALFORMED, Code::InvalidArgument)
        }
        // As Dapr answers a body over its size (400) and grpc-go a message
        // over it, either way (RESOURCE_EXHAUSTED); HTTP answers stream,
        // so only gRPC's can be too large.
        Refusal::TooLarge(_) => (S::BAD_REQUEST, MALFORMED, Code::ResourceExhausted),
        Refusal::AnswerTooLarge(_) => (S::PAYLOAD_TOO_LARGE, MALFORMED, Code::ResourceExhausted),
        Refusal::EmptyKey
        | Refusal::KeyTooLong(_)
        | Refusal::Ttl(_)
        | Refusal::Concurrency(_)
        | Refusal::Operation(_)
        | Refusal::OperationWithoutRequest
        | Refusal::EmptyResource
        | Refusal::EmptyOwner
        | Refusal::ResourceTooLong(_)
        | Refusal::OwnerTooLong(_)
        | Refusal::Expiry
        | Refusal::Malformed(_) => (S::BAD_REQUEST, MALFORMED, Code::InvalidArgument),
        Refusal::NotReady => (
            S::INTERNAL_SERVER_ERROR,
            "ERR_HEALTH_NOT_READY",
            Code::Unavailable,
        ),
        // Dapr answers a pub/sub it does not have, or no topic, with 404
        // over HTTP but INVALID_ARGUMENT over gRPC.
        Refusal::PubsubNotFound { .. } => {
            (S::NOT_FOUND, "ERR_PUBSUB_NOT_FOUND", Code::InvalidArgument)
        }
        Refusal::TopicEmpty { .. } => (S::NOT_FOUND, "ERR_TOPIC_NAME_EMPTY", Code::InvalidArgument),
        // Dapr has no such check (its MQTT component fails the publish):
        // the publish's error code, as the caller's mistake.
        Refusal::IllegalTopic { .. } => (
            S::BAD_REQUEST,
            "ERR_PUBSUB_PUBLISH_MESSAGE",
            Code::InvalidArgument,
        ),
        Refusal::PubsubForbidden { .. } => {
            (S::FORBIDDEN, "ERR_PUBSUB_FORBIDDEN", Code::PermissionDenied)
        }
        Refusal::BulkEvents { .. } => (
            S::BAD_REQUEST,
            "ERR_PUBSUB_EVENTS_SER",
            Code::InvalidArgument,
        ),
        Refusal::NoAppChannel => (
            S::INTERNAL_SERVER_ERROR,
            "ERR_APP_CHANNEL_NIL",
            Code::Internal,
        ),
    }
}

/// The details Dapr's errors kit gives a refusal (`message` is its
/// message), with their `ErrorInfo` reasons (daprd's
/// `pkg/messages/errorcodes`); none for the others.
fn refusal_details(refusal: &Refusal, message: &str) -> Option<Details> {
    let pubsub = |name: &str| Some((PUBSUB, name.to_owned(), message.to_owned()));
    let details = match refusal {
        Refusal::IllegalKey { key, store } => Details {
            field: Some(key.clone()),
            resource: Some(("state", store.clone(), String::new())),
            reason: "DAPR_STATE_ILLEGAL_KEY",
            metadata: None,
            wrapped: true,
        },
        Refusal::PubsubNotFound { metadata, .. } => Details {
            field: None,
            resource: None,
            reason: "DAPR_PUBSUB_NOT_FOUND",
            metadata: metadata.clone(),
            wrapped: false,
        },
        Refusal::TopicEmpty {
            pubsub: name,
            metadata,
        } => Details {
            field: None,
            resource: pubsub(name),
            reason: "DAPR_PUBSUB_TOPIC_NAME_EMPTY",
            metadata: Some(metadata.clone()),
            wrapped: false,
        },
        Refusal::IllegalTopic {
            pubsub: name,
            topic,
        } => Details {
            field: None,
            resource: pubsub(name),
            reason: PUBLISH_MESSAGE,
            metadata: Some(topic_error(topic, ILLEGAL_TOPIC)),
            wrapped: false,
        },
        Refusal::PubsubForbidden {
            pubsub: name,
            topic,
            ..
        } => Details {
            field: None,
            resource: pubsub(name),
            reason: "DAPR_PUBSUB_FORBIDDEN",
            // daprd's error is the refusal itself (NotAllowedError).
            metadata: Some(topic_error(topic, message)),
            wrapped: false,
        },
        Refusal::BulkEvents {
            pubsub: name,
            app_id,
            fault,
            ..
        } => {
            let (reason, error) = match fault {
                BulkFault::Unmarshal(_) => ("DAPR_PUBSUB_UNMARSHAL_EVENTS", None),
                BulkFault::Envelope(error) => {
                    ("DAPR_PUBSUB_MARSHAL_ENVELOPE", Some(error.as_str()))
                }
                BulkFault::EntryId => ("DAPR_PUBSUB_MARSHAL_EVENTS", Some(BulkFault::ENTRY_ID)),
            };
            Details {
                field: None,
                resource: pubsub(name),
                reason,
                metadata: Some(app_error(app_id, error)),
                wrapped: false,
            }
        }
        _ => return None,
    };
    Some(details)
}

/// `ResourceInfo`'s type for a pub/sub component.
const PUBSUB: &str = "pubsub";
/// `ErrorInfo`'s reason for a failed publish.
const PUBLISH_MESSAGE: &str = "DAPR_PUBSUB_PUBLISH_MESSAGE";

/// daprd's `ErrorInfo` metadata of a topic's error.
fn topic_error(topic: &str, error: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("topic".to_owned(), topic.to_owned()),
        ("error".to_owned(), error.to_owned()),
    ])
}

/// daprd's `ErrorInfo` metadata of an app's error (`WithAppError`).
fn app_error(app_id: &str, error: Option<&str>) -> BTreeMap<String, String> {
    let mut metadata = BTreeMap::from([("appID".to_owned(), app_id.to_owned())]);
    if let Some(error) = error {
        metadata.insert("error".to_owned(), error.to_owned());
    }
    metadata
}

/// The table of operation failures: the error code is the operation's,
/// the status the error's. A transaction fails as a whole (500,
/// `INTERNAL`) but for requests it could never run; lock operations fail
/// only in the store.
fn failure_row(operation: Operation, error: &DaprError) -> (StatusCode, &'static str, Code) {
    let code = match operation {
        Operation::Get => "ERR_STATE_GET",
        Operation::Save => "ERR_STATE_SAVE",
        Operation::Delete => "ERR_STATE_DELETE",
        Operation::Transaction => "ERR_STATE_TRANSACTION",
        Operation::TryLock => "ERR_TRY_LOCK",
        Operation::Unlock => "ERR_UNLOCK",
        Operation::SetMetadata => MALFORMED,
        Operation::Query => "ERR_STATE_QUERY",
        Operation::ConfigurationGet => "ERR_CONFIGURATION_GET",
        Operation::ConfigurationSubscribe => "ERR_CONFIGURATION_SUBSCRIBE",
        Operation::ConfigurationUnsubscribe => "ERR_CONFIGURATION_UNSUBSCRIBE",
    };
    // The outbox's publish, whatever operation needed it.
    let code = match error {
        DaprError::Outbox { .. } => "ERR_PUBLISH_OUTBOX",
        _ => code,
    };
    let (status, grpc) = match (operation, error) {
        (_, DaprError::MalformedEtag(_)) => (S::BAD_REQUEST, Code::InvalidArgument),
        (_, DaprError::RecordTooLarge { .. }) => (S::PAYLOAD_TOO_LARGE, Code::InvalidArgument),
        (
            _,
            DaprError::MetadataFull(_)
            | DaprError::MetadataNameTooLong(_)
            | DaprError::MetadataValueTooLarge(_),
        ) => (S::BAD_REQUEST, Code::InvalidArgument),
        (Operation::Get | Operation::Save | Operation::Delete, DaprError::EtagMismatch) => {
            (S::CONFLICT, Code::Aborted)
        }
        (_, _) => (S::INTERNAL_SERVER_ERROR, Code::Internal),
    };
    (status, code, grpc)
}

/// The table of publish failures.
fn publish_row(error: &PubsubError) -> (StatusCode, &'static str, Code) {
    match error {
        PubsubError::Metadata(_) => (
            S::BAD_REQUEST,
            "ERR_PUBSUB_REQUEST_METADATA",
            Code::InvalidArgument,
        ),
        // As Dapr: 500 over HTTP, INVALID_ARGUMENT over gRPC.
        PubsubError::CloudEvent(_) => (
            S::INTERNAL_SERVER_ERROR,
            "ERR_PUBSUB_CLOUD_EVENTS_SER",
            Code::InvalidArgument,
        ),
        PubsubError::Publish(_) => (
            S::INTERNAL_SERVER_ERROR,
            "ERR_PUBSUB_PUBLISH_MESSAGE",
            Code::Internal,
        ),
    }
}

impl From<Refusal> for Failure {
    fn from(refusal: Refusal) -> Self {
        let (status, code, grpc) = refusal_row(&refusal);
        let message = refusal.to_string();
        Self {
            status,
            code,
            grpc,
            details: refusal_details(&refusal, &message),
            message,
        }
    }
}

/// The publish that failed, as daprd's errors name it.
#[derive(Debug, Clone, Copy)]
pub struct Publishing<'a> {
    /// The pub/sub component's name.
    pub pubsub: &'a str,
    /// The topic.
    pub topic: &'a str,
    /// The app id the gateway serves.
    pub app_id: &'a str,
    /// The request's metadata.
    pub metadata: &'a HashMap<String, String>,
}

impl Failure {
    /// `operation` failed with `error`.
    pub fn of(operation: Operation, error: DaprError) -> Self {
        let (status, code, grpc) = failure_row(operation, &error);
        // The outbox's failure is daprd's errors kit's (PubSubOutbox).
        let details = match &error {
            DaprError::Outbox { app_id, error } => Some(Details {
                field: None,
                resource: None,
                reason: "DAPR_PUBSUB_OUTBOX",
                metadata: Some(app_error(app_id, Some(error))),
                wrapped: false,
            }),
            _ => None,
        };
        Self {
            status,
            code,
            grpc,
            message: error.to_string(),
            details,
        }
    }

    /// `publishing` failed with `error`: daprd's message and details.
    pub fn of_publish(publishing: Publishing<'_>, error: &PubsubError) -> Self {
        let (status, code, grpc) = publish_row(error);
        let Publishing {
            pubsub,
            topic,
            app_id,
            metadata,
        } = publishing;
        let (message, reason, metadata) = match error {
            PubsubError::Metadata(_) => (
                error.to_string(),
                "DAPR_PUBSUB_METADATA_DESERIALIZATION",
                metadata.clone().into_iter().collect(),
            ),
            PubsubError::CloudEvent(why) => (
                error.to_string(),
                "DAPR_PUBSUB_CLOUD_EVENT_CREATION",
                app_error(app_id, Some(why)),
            ),
            PubsubError::Publish(why) => (
                format!("error when publishing to topic {topic} in pubsub {pubsub}: {why}"),
                PUBLISH_MESSAGE,
                topic_error(topic, &why.to_string()),
            ),
        };
        Self {
            status,
            code,
            grpc,
            details: Some(Details {
                field: None,
                resource: Some((PUBSUB, pubsub.to_owned(), message.clone())),
                reason,
                metadata: Some(metadata),
                wrapped: false,
            }),
            message,
        }
    }

    /// A closure mapping `operation`'s errors (for `map_err`).
    pub fn on(operation: Operation) -> impl Fn(DaprError) -> Self {
        move |error| Self::of(operation, error)
    }
}

impl Failure {
    /// The HTTP message: Dapr's state handlers wrap the message of its
    /// errors kit once more.
    fn http_message(&self) -> String {
        match &self.details {
            Some(details) if details.wrapped => {
                format!("api error: code = {:?} desc = {}", self.grpc, self.message)
            }
            _ => self.message.clone(),
        }
    }

    /// The HTTP body: `errorCode`, `message` and Dapr's `details`, each
    /// as its errors kit writes the JSON of its google.rpc message.
    fn http_body(&self) -> serde_json::Value {
        let message = self.http_message();
        let Some(details) = &self.details else {
            return serde_json::json!({"errorCode": self.code, "message": message});
        };
        let mut sent = Vec::new();
        if let Some(field) = &details.field {
            sent.push(serde_json::json!({
                "@type": "type.googleapis.com/google.rpc.BadRequest",
                "field_violations": [{"field": field, "description": message}],
            }));
        }
        if let Some((resource_type, resource_name, description)) = &details.resource {
            sent.push(serde_json::json!({
                "@type": "type.googleapis.com/google.rpc.ResourceInfo",
                "resource_type": resource_type,
                "resource_name": resource_name,
                "owner": "",
                "description": description,
            }));
        }
        sent.push(serde_json::json!({
            "@type": "type.googleapis.com/google.rpc.ErrorInfo",
            "reason": details.reason,
            "domain": DAPR_DOMAIN,
            "metadata": details.metadata,
        }));
        serde_json::json!({
            "errorCode": self.code,
            "message": message,
            "details": sent,
        })
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        let body = self.http_body();
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

impl From<Refusal> for tonic::Status {
    fn from(refusal: Refusal) -> Self {
        Failure::from(refusal).into()
    }
}

impl From<Failure> for tonic::Status {
    fn from(failure: Failure) -> Self {
        let Some(details) = failure.details else {
            return tonic::Status::new(failure.grpc, failure.message);
        };
        let mut sent: Vec<ErrorDetail> = Vec::with_capacity(3);
        if let Some(field) = details.field {
            sent.push(BadRequest::with_violation(field, failure.message.clone()).into());
        }
        if let Some((resource_type, resource_name, description)) = details.resource {
            sent.push(ResourceInfo::new(resource_type, resource_name, "", description).into());
        }
        let metadata: HashMap<String, String> =
            details.metadata.unwrap_or_default().into_iter().collect();
        sent.push(ErrorInfo::new(details.reason, DAPR_DOMAIN, metadata).into());
        tonic::Status::with_error_details_vec(failure.grpc, failure.message, sent)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::http::dapr::check::Counted;

    /// How many kinds of refusal there are.
    const KINDS: usize = 30;

    /// The place of a refusal's kind: the match has no wildcard, so a new
    /// kind does not compile until it has a place, and then fails
    /// [`every_refusal`] until it has an example.
    fn kind_of(refusal: &Refusal) -> usize {
        match refusal {
            Refusal::StateStoreNotFound(_) => 0,
            Refusal::LockStoreNotFound(_) => 1,
            Refusal::EmptyKey => 2,
            Refusal::IllegalKey { .. } => 3,
            Refusal::IllegalResource { .. } => 4,
            Refusal::KeyTooLong(_) => 5,
            Refusal::Forbidden(_) => 6,
            Refusal::TooMany { .. } => 7,
            Refusal::TooManyElements(_) => 8,
            Refusal::TooLarge(_) => 9,
            Refusal::AnswerTooLarge(_) => 10,
            Refusal::ValueTooLarge(_) => 11,
            Refusal::Ttl(_) => 12,
            Refusal::Concurrency(_) => 13,
            Refusal::Operation(_) => 14,
            Refusal::OperationWithoutRequest => 15,
            Refusal::EmptyResource => 16,
            Refusal::EmptyOwner => 17,
            Refusal::ResourceTooLong(_) => 18,
            Refusal::OwnerTooLong(_) => 19,
            Refusal::Expiry => 20,
            Refusal::Malformed(_) => 21,
            Refusal::NotReady => 22,
            Refusal::PubsubNotFound { .. } => 23,
            Refusal::TopicEmpty { .. } => 24,
            Refusal::IllegalTopic { .. } => 25,
            Refusal::PubsubForbidden { .. } => 26,
            Refusal::BulkEvents { .. } => 27,
            Refusal::ConfigurationStoreNotFound(_) => 28,
            Refusal::NoAppChannel => 29,
        }
    }

    /// One refusal of each kind.
    fn every_refusal() -> Vec<Refusal> {
        let all = vec![
            Refusal::StateStoreNotFound("other".into()),
            Refusal::LockStoreNotFound("other".into()),
            Refusal::EmptyKey,
            Refusal::IllegalKey {
                key: "a||b".into(),
                store: "statestore".into(),
            },
            Refusal::IllegalResource {
                resource: "a||b".into(),
                call: LockCall::TryLock,
            },
            Refusal::IllegalResource {
                resource: "a||b".into(),
                call: LockCall::Unlock,
            },
            Refusal::KeyTooLong(8),
            Refusal::Forbidden("admin/x".into()),
            Refusal::TooMany {
                max: 2,
                what: Counted::Keys,
            },
            Refusal::TooManyElements(16),
            Refusal::TooLarge(16),
            Refusal::AnswerTooLarge(16),
            Refusal::ValueTooLarge(16),
            Refusal::Ttl("metadata.ttlInSeconds must be a whole number".into()),
            Refusal::Concurrency("eventual".into()),
            Refusal::Operation("merge".into()),
            Refusal::OperationWithoutRequest,
            Refusal::EmptyResource,
            Refusal::EmptyOwner,
            Refusal::ResourceTooLong(8),
            Refusal::OwnerTooLong(8),
            Refusal::Expiry,
            Refusal::Malformed("expected value".into()),
            Refusal::NotReady,
            Refusal::PubsubNotFound {
                pubsub: "other".into(),
                metadata: None,
            },
            Refusal::TopicEmpty {
                pubsub: "pubsub".into(),
                metadata: BTreeMap::new(),
            },
            Refusal::IllegalTopic {
                pubsub: "pubsub".into(),
                topic: "a/+".into(),
            },
            Refusal::PubsubForbidden {
                pubsub: "pubsub".into(),
                topic: "orders".into(),
                app_id: "app".into(),
            },
            Refusal::BulkEvents {
                pubsub: "pubsub".into(),
                topic: "orders".into(),
                app_id: "app".into(),
                fault: BulkFault::EntryId,
            },
            Refusal::ConfigurationStoreNotFound("other".into()),
            Refusal::NoAppChannel,
        ];
        let covered: std::collections::BTreeSet<usize> = all.iter().map(kind_of).collect();
        assert_eq!(covered.len(), KINDS, "a kind of refusal has no example");
        all
    }

    fn every_error() -> Vec<DaprError> {
        vec![
            DaprError::EtagMismatch,
            DaprError::MalformedEtag("nope".into()),
            DaprError::TransactionsOff,
            DaprError::FencedOut,
            DaprError::Unapplied(Box::new(DaprError::FencedOut)),
            DaprError::RecordTooLarge { size: 2, max: 1 },
            DaprError::LeaseBusy(Duration::from_secs(1)),
            DaprError::MetadataFull(64),
            DaprError::MetadataNameTooLong(256),
            DaprError::MetadataValueTooLarge(65536),
            DaprError::Query("unsupported filter \"LIKE\"".into()),
            DaprError::TooManyItems(1000),
            DaprError::Subscribe("too many watchers".into()),
            DaprError::NoSubscription("id".into()),
            DaprError::Store(crate::store::RequestError::UnexpectedReply {
                verb: "SET",
                reply: "-ERR".into(),
            }),
        ]
    }

    const OPERATIONS: [Operation; 11] = [
        Operation::Get,
        Operation::Save,
        Operation::Delete,
        Operation::Transaction,
        Operation::TryLock,
        Operation::Unlock,
        Operation::SetMetadata,
        Operation::Query,
        Operation::ConfigurationGet,
        Operation::ConfigurationSubscribe,
        Operation::ConfigurationUnsubscribe,
    ];

    /// The gRPC code that means what an HTTP status means (or that Dapr
    /// answers with it).
    fn same_meaning(status: StatusCode, grpc: Code, code: &str) -> bool {
        match status.as_u16() {
            // A pub/sub or topic that is not there.
            404 => grpc == Code::InvalidArgument,
            // Dapr's odd pair for an event it cannot make.
            500 if code == "ERR_PUBSUB_CLOUD_EVENTS_SER" => grpc == Code::InvalidArgument,
            // A request or answer over the size limit is RESOURCE_EXHAUSTED.
            400 | 413 => matches!(grpc, Code::InvalidArgument | Code::ResourceExhausted),
            403 => grpc == Code::PermissionDenied,
            409 => grpc == Code::Aborted,
            500 => matches!(grpc, Code::Internal | Code::Unavailable),
            _ => false,
        }
    }

    async fn http_answer(failure: &Failure) -> (StatusCode, serde_json::Value) {
        let response = failure.clone().into_response();
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), 1 << 16)
            .await
            .unwrap();
        (status, serde_json::from_slice(&body).unwrap())
    }

    async fn assert_same_over_both(failure: Failure) {
        let (status, body) = http_answer(&failure).await;
        let grpc = tonic::Status::from(failure.clone());
        assert!(
            same_meaning(status, grpc.code(), failure.code),
            "{failure:?}: HTTP {status} but gRPC {:?}",
            grpc.code()
        );
        assert_eq!(body["errorCode"], failure.code);
        assert!(failure.code.starts_with("ERR_"), "{failure:?}");
        assert!(!grpc.message().is_empty(), "{failure:?}");
        let Some(details) = &failure.details else {
            assert_eq!(body["message"], grpc.message(), "{failure:?}");
            assert_eq!(body.get("details"), None, "{failure:?}");
            assert!(grpc.details().is_empty(), "{failure:?}");
            return;
        };
        // Dapr's state handlers wrap its errors kit's message once more.
        let message = if details.wrapped {
            format!(
                "api error: code = {:?} desc = {}",
                grpc.code(),
                grpc.message()
            )
        } else {
            grpc.message().to_owned()
        };
        assert_eq!(body["message"], message, "{failure:?}");
        // The same details, in Dapr's order, over both.
        let sent = grpc.get_error_details_vec();
        let http = body["details"].as_array().unwrap();
        assert_eq!(sent.len(), http.len(), "{failure:?}: {sent:?}");
        let mut kinds = Vec::new();
        for (detail, json) in sent.iter().zip(http) {
            let kind = match detail {
                ErrorDetail::BadRequest(bad) => {
                    assert_eq!(bad.field_violations.len(), 1);
                    assert_eq!(Some(&bad.field_violations[0].field), details.field.as_ref());
                    assert_eq!(bad.field_violations[0].description, grpc.message());
                    assert_eq!(
                        json["field_violations"][0]["field"],
                        bad.field_violations[0].field
                    );
                    assert_eq!(json["field_violations"][0]["description"], message);
                    "BadRequest"
                }
                ErrorDetail::ResourceInfo(resource) => {
                    let (kind, name, description) = details.resource.clone().unwrap();
                    assert_eq!(
                        (
                            resource.resource_type.as_str(),
                            &resource.resource_name,
                            &resource.description
                        ),
                        (kind, &name, &description)
                    );
                    assert_eq!(json["resource_type"], kind);
                    assert_eq!(json["resource_name"], name);
                    assert_eq!(json["owner"], "");
                    assert_eq!(json["description"], description);
                    "ResourceInfo"
                }
                ErrorDetail::ErrorInfo(info) => {
                    assert_eq!(
                        (info.reason.as_str(), info.domain.as_str()),
                        (details.reason, "dapr.io")
                    );
                    let metadata: BTreeMap<String, String> =
                        info.metadata.clone().into_iter().collect();
                    assert_eq!(metadata, details.metadata.clone().unwrap_or_default());
                    assert_eq!(json["reason"], details.reason);
                    assert_eq!(json["domain"], "dapr.io");
                    assert_eq!(json["metadata"], serde_json::json!(details.metadata));
                    "ErrorInfo"
                }
                other => panic!("{failure:?}: {other:?}"),
            };
            assert_eq!(
                json["@type"],
                format!("type.googleapis.com/google.rpc.{kind}")
            );
            kinds.push(kind);
        }
        let mut expected = Vec::new();
        if details.field.is_some() {
            expected.push("BadRequest");
        }
        if details.resource.is_some() {
            expected.push("ResourceInfo");
        }
        expected.push("ErrorInfo");
        assert_eq!(kinds, expected, "{failure:?}");
    }

    #[tokio::test]
    async fn every_refusal_means_the_same_over_http_and_grpc() {
        for refusal in every_refusal() {
            assert_same_over_both(Failure::from(refusal)).await;
        }
    }

    #[tokio::test]
    async fn every_operation_failure_means_the_same_over_http_and_grpc() {
        for operation in OPERATIONS {
            for error in every_error() {
                assert_same_over_both(Failure::of(operation, error)).await;
            }
        }
    }

    fn publishing(metadata: &HashMap<String, String>) -> Publishing<'_> {
        Publishing {
            pubsub: "pubsub",
            topic: "orders",
            app_id: "app",
            metadata,
        }
    }

    #[tokio::test]
    async fn every_publish_failure_means_the_same_over_http_and_grpc() {
        let metadata = HashMap::from([("rawPayload".to_owned(), "yes".to_owned())]);
        for error in [
            PubsubError::Metadata("rawPayload value must be a valid boolean".into()),
            PubsubError::CloudEvent("expected value at line 1 column 1".into()),
            PubsubError::Publish(crate::mqtt::PublishError::NotAuthorized),
        ] {
            assert_same_over_both(Failure::of_publish(publishing(&metadata), &error)).await;
        }
        let failed = Failure::of_publish(
            publishing(&metadata),
            &PubsubError::Publish(crate::mqtt::PublishError::Unavailable),
        );
        assert_eq!(
            failed.message,
            "error when publishing to topic orders in pubsub pubsub: no usable broker connection"
        );
    }

    #[test]
    fn pubsub_failures_carry_daprds_details() {
        let metadata = HashMap::from([("rawPayload".to_owned(), "yes".to_owned())]);
        let resource = |message: &str| Some((PUBSUB, "pubsub".to_owned(), message.to_owned()));
        let map = |pairs: &[(&str, &str)]| {
            Some(
                pairs
                    .iter()
                    .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
                    .collect::<BTreeMap<_, _>>(),
            )
        };
        let metadata_error = Failure::of_publish(
            publishing(&metadata),
            &PubsubError::Metadata(
                "rawPayload value must be a valid boolean: actual is 'yes'".into(),
            ),
        );
        let message = "failed deserializing metadata. Error: rawPayload value must be a valid boolean: actual is 'yes'";
        assert_eq!(metadata_error.message, message);
        assert_eq!(
            metadata_error.details,
            Some(Details {
                field: None,
                resource: resource(message),
                reason: "DAPR_PUBSUB_METADATA_DESERIALIZATION",
                metadata: map(&[("rawPayload", "yes")]),
                wrapped: false,
            })
        );
        let cloud_event = Failure::of_publish(
            publishing(&metadata),
            &PubsubError::CloudEvent("expected value".into()),
        );
        assert_eq!(
            cloud_event.details.unwrap().metadata,
            map(&[("appID", "app"), ("error", "expected value")])
        );
        let published = Failure::of_publish(
            publishing(&metadata),
            &PubsubError::Publish(crate::mqtt::PublishError::NotAuthorized),
        );
        let details = published.details.unwrap();
        assert_eq!(details.reason, "DAPR_PUBSUB_PUBLISH_MESSAGE");
        assert_eq!(details.resource, resource(&published.message));
        assert_eq!(details.metadata.unwrap()["topic"], "orders");
        // A pub/sub that is not found: no ResourceInfo, as daprd.
        let not_found = Failure::from(Refusal::PubsubNotFound {
            pubsub: "kafka".into(),
            metadata: map(&[]),
        });
        assert_eq!(not_found.message, "pubsub kafka is not found");
        let details = not_found.details.unwrap();
        assert_eq!(
            (details.reason, details.resource),
            ("DAPR_PUBSUB_NOT_FOUND", None)
        );
        let forbidden = Failure::from(Refusal::PubsubForbidden {
            pubsub: "pubsub".into(),
            topic: "orders".into(),
            app_id: "app".into(),
        });
        let message = "topic orders is not allowed for app id app";
        assert_eq!(forbidden.message, message);
        assert_eq!(
            forbidden.details.unwrap().metadata,
            map(&[("topic", "orders"), ("error", message)])
        );
        let unmarshal = Failure::from(Refusal::BulkEvents {
            pubsub: "pubsub".into(),
            topic: "orders".into(),
            app_id: "app".into(),
            fault: BulkFault::Unmarshal("expected `[`".into()),
        });
        assert_eq!(
            unmarshal.message,
            "error when unmarshaling the request for topic orders pubsub pubsub: expected `[`"
        );
        let details = unmarshal.details.unwrap();
        assert_eq!(details.reason, "DAPR_PUBSUB_UNMARSHAL_EVENTS");
        assert_eq!(details.metadata, map(&[("appID", "app")]));
    }

    #[test]
    fn a_key_with_the_separator_is_daprs_illegal_key_and_a_lock_resource_its_lock_failure() {
        let key = Failure::from(Refusal::IllegalKey {
            key: "a||b".into(),
            store: "statestore".into(),
        });
        assert_eq!(
            (key.status, key.code, key.grpc),
            (
                S::BAD_REQUEST,
                "ERR_MALFORMED_REQUEST",
                Code::InvalidArgument
            )
        );
        assert_eq!(key.message, "input key/keyPrefix 'a||b' can't contain '||'");
        assert_eq!(
            key.details,
            Some(Details {
                field: Some("a||b".into()),
                resource: Some(("state", "statestore".into(), String::new())),
                reason: "DAPR_STATE_ILLEGAL_KEY",
                metadata: None,
                wrapped: true,
            })
        );
        for (call, code, message) in [
            (
                LockCall::TryLock,
                "ERR_TRY_LOCK",
                "failed to try acquiring lock",
            ),
            (LockCall::Unlock, "ERR_UNLOCK", "failed to release lock"),
        ] {
            let lock = Failure::from(Refusal::IllegalResource {
                resource: "a||b".into(),
                call,
            });
            assert_eq!(
                (lock.status, lock.code, lock.grpc),
                (S::INTERNAL_SERVER_ERROR, code, Code::Internal)
            );
            assert_eq!(
                lock.message,
                format!("{message}: input key/keyPrefix 'a||b' can't contain '||'")
            );
            assert_eq!(lock.details, None);
        }
    }

    #[test]
    fn an_outbox_that_could_not_publish_is_daprs_publish_outbox_error() {
        let failure = Failure::of(
            Operation::Transaction,
            DaprError::Outbox {
                app_id: "checkout".into(),
                error: "the broker is down".into(),
            },
        );
        assert_eq!(
            (failure.status, failure.code, failure.grpc),
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "ERR_PUBLISH_OUTBOX",
                Code::Internal
            )
        );
        assert_eq!(
            failure.message,
            "error while publishing outbox message: the broker is down"
        );
        let details = failure.details.unwrap();
        assert_eq!(details.reason, "DAPR_PUBSUB_OUTBOX");
        assert_eq!(
            details.metadata,
            Some(BTreeMap::from([
                ("appID".to_owned(), "checkout".to_owned()),
                ("error".to_owned(), "the broker is down".to_owned()),
            ]))
        );
    }

    #[test]
    fn an_etag_mismatch_is_a_conflict_except_in_a_transaction_and_a_fenced_key_is_no_mismatch() {
        let save = Failure::of(Operation::Save, DaprError::EtagMismatch);
        assert_eq!((save.status, save.code), (S::CONFLICT, "ERR_STATE_SAVE"));
        let transaction = Failure::of(Operation::Transaction, DaprError::EtagMismatch);
        assert_eq!(
            (transaction.status, transaction.grpc),
            (S::INTERNAL_SERVER_ERROR, Code::Internal)
        );
        let too_large = Failure::of(
            Operation::Transaction,
            DaprError::RecordTooLarge { size: 2, max: 1 },
        );
        assert_eq!(
            (too_large.status, too_large.grpc),
            (S::PAYLOAD_TOO_LARGE, Code::InvalidArgument)
        );
        let fenced_out = Failure::of(Operation::Save, DaprError::FencedOut);
        assert_eq!(
            (fenced_out.status, fenced_out.grpc),
            (S::INTERNAL_SERVER_ERROR, Code::Internal)
        );
    }
}
