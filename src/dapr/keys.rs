//! The store keys of Dapr's locks, and those the Dapr API keeps beside
//! the app's: a lease per key (conditional writes and transactions,
//! [`super::lease::lease_key`]), a transaction's intent record, and the
//! expiry of a key saved with `ttlInSeconds`, all under the gateway's
//! reserved prefixes ([`crate::store::reserved`]), which no caller reaches.

use bytes::Bytes;

use super::settings::{DaprSettings, LOCK_KEY_PREFIX, LockKeyPrefix, SEPARATOR};
use crate::store::reserved::INTENT_PREFIX;

/// The store key of the lock `resource`, laid out as Dapr's lock component
/// lays it out for its `keyPrefix`: `lock||<prefix>||<resource>`, or
/// `lock||<resource>` with `none`.
pub(super) fn lock_key(settings: &DaprSettings, resource: &str) -> Bytes {
    let prefix = match &settings.lock_key_prefix {
        LockKeyPrefix::AppId => Some(settings.app_id.as_str()),
        LockKeyPrefix::StoreName => Some(settings.lock_store.as_str()),
        LockKeyPrefix::None => None,
        LockKeyPrefix::Custom(prefix) => Some(prefix.as_str()),
    };
    Bytes::from(match prefix {
        Some(prefix) => format!("{LOCK_KEY_PREFIX}{prefix}{SEPARATOR}{resource}"),
        None => format!("{LOCK_KEY_PREFIX}{resource}"),
    })
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_keys_are_laid_out_as_daprs_lock_component_lays_them_out() {
        let settings = |lock_key_prefix| DaprSettings {
            app_id: "myapp".into(),
            lock_store: "locks".into(),
            lock_key_prefix,
            ..DaprSettings::default()
        };
        for (prefix, key) in [
            (LockKeyPrefix::AppId, "lock||myapp||order-42"),
            (LockKeyPrefix::StoreName, "lock||locks||order-42"),
            (LockKeyPrefix::None, "lock||order-42"),
            (LockKeyPrefix::Custom("team".into()), "lock||team||order-42"),
        ] {
            assert_eq!(
                lock_key(&settings(prefix.clone()), "order-42"),
                key,
                "{prefix:?}"
            );
        }
        // The default: the app id the metadata names.
        assert_eq!(
            lock_key(&DaprSettings::default(), "order-42"),
            "lock||statestore-gateway||order-42"
        );
    }
}
