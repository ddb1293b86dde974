//! How Dapr answers a failure, over HTTP (a status and Dapr's `errorCode`
//! in `{"errorCode", "message"}`) and over gRPC (a status code), side by
//! side in one table: a [`Refusal`] of the request, or a [`DaprError`] of
//! the operation it ran. Both front ends answer through [`Failure`], so a
//! case means the same over either.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use tonic::Code;

use super::check::Refusal;
use crate::dapr::DaprError;
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
    /// What went wrong, the same over both.
    pub message: String,
}

use StatusCode as S;

const MALFORMED: &str = "ERR_MALFORMED_REQUEST";

/// The table of refusals: one row per case.
fn refusal_row(refusal: &Refusal) -> (StatusCode, &'static str, Code) {
    match refusal {
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
    }
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
    };
    let (status, grpc) = match (operation, error) {
        (_, DaprError::MalformedEtag(_) | DaprError::DuplicateKey) => {
            (S::BAD_REQUEST, Code::InvalidArgument)
        }
        (Operation::Get | Operation::Save | Operation::Delete, DaprError::EtagMismatch) => {
            (S::CONFLICT, Code::Aborted)
        }
        (_, _) => (S::INTERNAL_SERVER_ERROR, Code::Internal),
    };
    (status, code, grpc)
}

impl From<Refusal> for Failure {
    fn from(refusal: Refusal) -> Self {
        let (status, code, grpc) = refusal_row(&refusal);
        Self {
            status,
            code,
            grpc,
            message: refusal.to_string(),
        }
    }
}

impl Failure {
    /// `operation` failed with `error`.
    pub fn of(operation: Operation, error: DaprError) -> Self {
        let (status, code, grpc) = failure_row(operation, &error);
        Self {
            status,
            code,
            grpc,
            message: error.to_string(),
        }
    }

    /// A closure mapping `operation`'s errors (for `map_err`).
    pub fn on(operation: Operation) -> impl Fn(DaprError) -> Self {
        move |error| Self::of(operation, error)
    }
}

impl IntoResponse for Failure {
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

impl From<Failure> for tonic::Status {
    fn from(failure: Failure) -> Self {
        tonic::Status::new(failure.grpc, failure.message)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::http::dapr::check::Counted;

    /// One refusal of each kind; the match has no wildcard, so a new kind
    /// must be added here.
    fn every_refusal() -> Vec<Refusal> {
        let all = vec![
            Refusal::StateStoreNotFound("other".into()),
            Refusal::LockStoreNotFound("other".into()),
            Refusal::EmptyKey,
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
        ];
        for refusal in &all {
            match refusal {
                Refusal::StateStoreNotFound(_)
                | Refusal::LockStoreNotFound(_)
                | Refusal::EmptyKey
                | Refusal::KeyTooLong(_)
                | Refusal::Forbidden(_)
                | Refusal::TooMany { .. }
                | Refusal::TooManyElements(_)
                | Refusal::TooLarge(_)
                | Refusal::AnswerTooLarge(_)
                | Refusal::ValueTooLarge(_)
                | Refusal::Ttl(_)
                | Refusal::Concurrency(_)
                | Refusal::Operation(_)
                | Refusal::OperationWithoutRequest
                | Refusal::EmptyResource
                | Refusal::EmptyOwner
                | Refusal::ResourceTooLong(_)
                | Refusal::OwnerTooLong(_)
                | Refusal::Expiry
                | Refusal::Malformed(_)
                | Refusal::NotReady => {}
            }
        }
        all
    }

    fn every_error() -> Vec<DaprError> {
        vec![
            DaprError::EtagMismatch,
            DaprError::MalformedEtag("nope".into()),
            DaprError::TransactionsOff,
            DaprError::DuplicateKey,
            DaprError::LeaseBusy(Duration::from_secs(1)),
            DaprError::Store(crate::store::RequestError::UnexpectedReply {
                verb: "SET",
                reply: "-ERR".into(),
            }),
        ]
    }

    const OPERATIONS: [Operation; 6] = [
        Operation::Get,
        Operation::Save,
        Operation::Delete,
        Operation::Transaction,
        Operation::TryLock,
        Operation::Unlock,
    ];

    /// The gRPC code that means what an HTTP status means.
    fn same_meaning(status: StatusCode, grpc: Code) -> bool {
        match status.as_u16() {
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
            same_meaning(status, grpc.code()),
            "{failure:?}: HTTP {status} but gRPC {:?}",
            grpc.code()
        );
        assert_eq!(body["errorCode"], failure.code);
        assert!(failure.code.starts_with("ERR_"), "{failure:?}");
        assert_eq!(body["message"], grpc.message(), "{failure:?}");
        assert!(!grpc.message().is_empty(), "{failure:?}");
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

    #[test]
    fn an_etag_mismatch_is_a_conflict_except_in_a_transaction() {
        let save = Failure::of(Operation::Save, DaprError::EtagMismatch);
        assert_eq!((save.status, save.code), (S::CONFLICT, "ERR_STATE_SAVE"));
        let transaction = Failure::of(Operation::Transaction, DaprError::EtagMismatch);
        assert_eq!(
            (transaction.status, transaction.grpc),
            (S::INTERNAL_SERVER_ERROR, Code::Internal)
        );
        let duplicate = Failure::of(Operation::Transaction, DaprError::DuplicateKey);
        assert_eq!(
            (duplicate.status, duplicate.grpc),
            (S::BAD_REQUEST, Code::InvalidArgument)
        );
    }
}
