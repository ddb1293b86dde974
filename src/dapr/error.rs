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
    /// The key carries a fencing token newer than this write's lease: a
    /// writer outside the Dapr API wrote it with a token ahead of the
    /// store's clock. Nothing was written.
    #[error(
        "the key carries a fencing token newer than the gateway's lease (written outside the Dapr API with a token ahead of the store's clock): nothing was written"
    )]
    FencedOut,
    /// A transaction committed (it will be applied whole), but applying it
    /// failed: the next Dapr read or write of any of its keys applies it.
    #[error(
        "the transaction committed but applying it failed ({0}): the next Dapr read or write of its keys applies it"
    )]
    Unapplied(Box<DaprError>),
    /// A transaction's intent record, which carries every value it
    /// writes, is larger than the broker takes. Nothing was written.
    #[error(
        "the transaction's intent record, which carries every value it writes, would be {size} bytes with the request's envelope, more than the broker's maximum packet size of {max} bytes: nothing was written"
    )]
    RecordTooLarge {
        /// The commit's packet size.
        size: usize,
        /// The largest packet the broker takes.
        max: usize,
    },
    /// Another etag write of the key held its lease for the whole wait.
    #[error("another conditional write of this key held it for {0:?}")]
    LeaseBusy(Duration),
    /// The extended metadata holds its most attributes already.
    #[error("the sidecar's extended metadata holds at most {0} attributes")]
    MetadataFull(usize),
    /// An extended metadata name over its limit.
    #[error("an extended metadata name may have at most {0} bytes")]
    MetadataNameTooLong(usize),
    /// An extended metadata value over its limit.
    #[error("an extended metadata value may have at most {0} bytes")]
    MetadataValueTooLarge(usize),
    /// A state query that cannot be run as asked (its JSON, its filter,
    /// its token, or a sorted result past the bound the gateway sorts).
    #[error("state store query failed: {0}")]
    Query(String),
    /// A configuration get of every key found more keys than one answer
    /// holds.
    #[error(
        "more than {0} configuration items under the configuration key prefix: name the keys to get"
    )]
    TooManyItems(usize),
    /// A configuration subscription that could not start.
    #[error("failed to subscribe to configuration: {0}")]
    Subscribe(String),
    /// An unsubscribe of no subscription of this gateway.
    #[error("failed to unsubscribe to configuration request {0}: subscription does not exist")]
    NoSubscription(String),
    /// The outbox's internal event of a transaction was not published, so
    /// the transaction did not run (daprd's message).
    #[error("error while publishing outbox message: {error}")]
    Outbox {
        /// The app id (daprd's error names it).
        app_id: String,
        /// Why.
        error: String,
    },
    /// The store refused the request or could not be reached.
    #[error(transparent)]
    Store(#[from] RequestError),
}
