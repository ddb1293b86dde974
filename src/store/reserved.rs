//! The keys the gateway keeps for itself (a leaf): the records of Dapr's
//! etag writes, transactions, expiries and outbox markers. No caller reaches them through any route,
//! whatever its rules say: access refuses them, listings and pattern
//! watches leave them out, so that only gateways (and clients holding
//! broker credentials) ever write them.
//!
//! The prefixes are those running gateways already use: a gateway of
//! this version and an older one on the same store find each other's
//! records.

/// The prefix of a key's lease (Dapr etag writes and transactions):
/// `<prefix><key>`.
pub const LEASE_PREFIX: &str = "dapr-etag-lease||";

/// The prefix of a Dapr transaction's intent record: `<prefix><id>`.
pub const INTENT_PREFIX: &str = "dapr-txn||";

/// The prefix of the expiry a Dapr save with `ttlInSeconds` gave a key:
/// `<prefix><key>`.
pub const EXPIRY_PREFIX: &str = "dapr-expiry||";

/// The prefix of the marker a Dapr transaction with an outbox commits
/// with each event it publishes: `<prefix><event id>`.
pub const OUTBOX_PREFIX: &str = "dapr-outbox||";

/// Every reserved prefix.
pub const RESERVED_PREFIXES: [&str; 4] =
    [LEASE_PREFIX, INTENT_PREFIX, EXPIRY_PREFIX, OUTBOX_PREFIX];

/// The reserved prefix `key` starts with, if any.
pub fn reserved_prefix(key: &[u8]) -> Option<&'static str> {
    RESERVED_PREFIXES
        .into_iter()
        .find(|prefix| key.starts_with(prefix.as_bytes()))
}

/// Whether `key` is one of the gateway's own records.
pub fn is_reserved(key: &[u8]) -> bool {
    reserved_prefix(key).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_under_a_reserved_prefix_are_reserved_and_no_others() {
        assert_eq!(
            reserved_prefix(b"dapr-etag-lease||orders/1"),
            Some(LEASE_PREFIX)
        );
        assert_eq!(
            reserved_prefix(b"dapr-txn||x/orders/evil"),
            Some(INTENT_PREFIX)
        );
        assert_eq!(
            reserved_prefix(b"dapr-expiry||orders/1"),
            Some(EXPIRY_PREFIX)
        );
        assert_eq!(
            reserved_prefix(b"dapr-outbox||outbox-1"),
            Some(OUTBOX_PREFIX)
        );
        assert!(is_reserved(b"dapr-txn||"));
        // A prefix counts only at the start, whole and in its own case.
        let others =
            "orders/dapr-txn||x dapr-txn| dapr-etag-lease|x DAPR-TXN||x myapp||dapr-txn||x";
        for key in others.split(' ').chain([""]) {
            assert!(!is_reserved(key.as_bytes()), "{key:?}");
        }
    }
}
