//! The store keys the Dapr API keeps beside the app's: a lease per key
//! (conditional writes and transactions, [`super::lease::lease_key`]) and
//! a transaction's intent record, both under the gateway's reserved
//! prefixes ([`crate::store::reserved`]), which no caller reaches.

use bytes::Bytes;

use crate::store::reserved::INTENT_PREFIX;

/// The intent record of transaction `id`.
pub(super) fn intent_key(id: &str) -> Bytes {
    Bytes::from(format!("{INTENT_PREFIX}{id}"))
}
