//! Why a Dapr operation failed (a leaf: the operations and the
//! conditional writes both return it).

use std::time::Duration;

use thiserror::Error;

use crate::store::RequestError;

/// Why a Dapr operation failed; the HTTP and gRPC sides each map these
/// onto Dapr's codes in one place.
#[derive(Debug, Clone, Error)]
pub enum DaprError {
    /// The etag is not the key's current version (or the key is absent),
    /// or `first-write` found the key present: nothing changed.
    #[error("possible etag mismatch: the key was changed or does not exist")]
    EtagMismatch,
    /// An etag that cannot be one of the store's versions.
    #[error("invalid etag {0:?}: etags are the store's versions")]
    MalformedEtag(String),
    /// A transaction on a gateway without `--dapr-transactions`.
    #[error(
        "this state store does not support transactions: turn them on with --dapr-transactions (every Dapr read and write then checks its key's lease)"
    )]
    TransactionsOff,
    /// A transaction names one key twice.
    #[error("a transaction may name each key once")]
    DuplicateKey,
    /// Another etag write of the key held its lease for the whole wait.
    #[error("another conditional write of this key held it for {0:?}")]
    LeaseBusy(Duration),
    /// The store refused the request or could not be reached.
    #[error(transparent)]
    Store(#[from] RequestError),
}
