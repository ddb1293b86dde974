//! The store keys the Dapr API keeps beside the app's: a lease per key
//! (conditional writes and transactions), a transaction's intent record,
//! and the expiry of a key saved with `ttlInSeconds`.

use bytes::Bytes;

/// The prefix of the lease keys of conditional writes: `<prefix><key>`.
pub const LEASE_PREFIX: &str = "dapr-etag-lease||";
/// The prefix of intent records: `<prefix><transaction id>`.
pub const INTENT_PREFIX: &str = "dapr-txn||";
/// The prefix of expiry records: `<prefix><key>`.
pub const EXPIRY_PREFIX: &str = "dapr-expiry||";

/// The intent record of transaction `id`.
pub(super) fn intent_key(id: &str) -> Bytes {
    Bytes::from(format!("{INTENT_PREFIX}{id}"))
}

/// `prefix` then `key`.
pub(super) fn prefixed(prefix: &str, key: &[u8]) -> Bytes {
    let mut prefixed = Vec::with_capacity(prefix.len() + key.len());
    prefixed.extend_from_slice(prefix.as_bytes());
    prefixed.extend_from_slice(key);
    Bytes::from(prefixed)
}
