//! The store keys the Dapr API keeps beside the app's: a lease per key
//! (conditional writes and transactions) and a transaction's intent record.

use bytes::Bytes;

/// The prefix of the lease keys of conditional writes: `<prefix><key>`.
pub const LEASE_PREFIX: &str = "dapr-etag-lease||";
/// The prefix of intent records: `<prefix><transaction id>`.
pub const INTENT_PREFIX: &str = "dapr-txn||";

/// The intent record of transaction `id`.
pub(super) fn intent_key(id: &str) -> Bytes {
    Bytes::from(format!("{INTENT_PREFIX}{id}"))
}
