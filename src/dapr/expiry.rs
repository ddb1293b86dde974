//! When a key saved through the Dapr API expires: the store never tells
//! (no command reads a key's remaining time), yet an etag save's claim
//! ([`super::conditional`]) writes the key again, and a write replaces its
//! expiry. So that a save that fails after its claim leaves the key
//! expiring when it did, every Dapr write that gives a key an expiry
//! records it beside the key ([`set_recorded`]): `dapr-expiry||<key>`
//! holds `<deadline ms> <version>` and expires a little after the key. A
//! claim reads it with the key and carries the time left when the record
//! names the version it read ([`Recorded::deadline_at`]); otherwise the key
//! has no expiry as far as the Dapr API knows (one set outside it, e.g.
//! `PUT /keys/..?ttl=`, is not known).

use bytes::Bytes;

use super::keys::prefixed;
use crate::mqtt::RequestOptions;
use crate::protocol::{Hlc, SetCondition, SetOptions, hlc};
use crate::store::reserved::EXPIRY_PREFIX;
use crate::store::{RequestError, SetOutcome, StoreClient};

/// How long a record outlives its key, so that a claim in the key's last
/// moments still finds it.
const RECORD_OUTLIVES_KEY_MS: u64 = 1000;

/// An expiry record as stored: which version of the key expires when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Recorded {
    deadline_ms: u64,
    version: Hlc,
}

impl Recorded {
    fn encode(&self) -> Bytes {
        Bytes::from(format!("{} {}", self.deadline_ms, self.version.encode()))
    }

    fn decode(value: &[u8]) -> Option<Self> {
        let (deadline, version) = std::str::from_utf8(value).ok()?.split_once(' ')?;
        Some(Self {
            deadline_ms: deadline.parse().ok()?,
            version: Hlc::parse(version).ok()?,
        })
    }

    /// The deadline (wall-clock ms) of the key at `version`, if this
    /// record is about that version (a later write, with an expiry or
    /// without, makes it stale).
    pub(super) fn deadline_at(&self, version: &Hlc) -> Option<u64> {
        (self.version == *version).then_some(self.deadline_ms)
    }
}

/// The milliseconds left until `deadline_ms` (at least 1: the store takes
/// no zero expiry, and the key is due to go).
pub(super) fn time_left(deadline_ms: u64) -> u64 {
    deadline_ms.saturating_sub(hlc::now_ms()).max(1)
}

/// The expiry record of `key`, if any.
pub(super) async fn lookup(
    store: &StoreClient,
    key: &[u8],
) -> Result<Option<Recorded>, RequestError> {
    let read = store.get(prefixed(EXPIRY_PREFIX, key)).await?;
    Ok(read.and_then(|read| Recorded::decode(&read.value)))
}

/// Records that `key` at `version` expires at `deadline_ms`. A failure is
/// logged, not returned: the write it describes landed, and only a later
/// failed etag save of the key loses its expiry for want of it.
pub(super) async fn record(store: &StoreClient, key: &[u8], version: Hlc, deadline_ms: u64) {
    let left = deadline_ms.saturating_sub(hlc::now_ms());
    if left == 0 {
        return;
    }
    let recorded = Recorded {
        deadline_ms,
        version,
    };
    let options = SetOptions {
        condition: SetCondition::Always,
        expires_in_ms: Some(left.saturating_add(RECORD_OUTLIVES_KEY_MS)),
    };
    let set = store
        .set(
            prefixed(EXPIRY_PREFIX, key),
            recorded.encode(),
            options,
            &RequestOptions::default(),
        )
        .await;
    if let Err(error) = set {
        tracing::warn!(%error, "recording a key's expiry failed: an etag save that fails after its claim would drop it");
    }
}

/// `SET key value` with `options` (and `request`'s fencing token), then,
/// when it gave the key an expiry, the record of it. The deadline counts
/// from before the request left, so it is never later than the store's.
pub(super) async fn set_recorded(
    store: &StoreClient,
    key: Bytes,
    value: Bytes,
    options: SetOptions,
    request: &RequestOptions,
) -> Result<SetOutcome, RequestError> {
    let deadline = options
        .expires_in_ms
        .map(|ttl| hlc::now_ms().saturating_add(ttl));
    let outcome = store.set(key.clone(), value, options, request).await?;
    if let (Some(deadline), SetOutcome::Applied(Some(version))) = (deadline, &outcome) {
        record(store, &key, version.clone(), deadline).await;
    }
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_names_the_version_whose_deadline_it_is() {
        let version = Hlc::new(1_700_000_000_000, "store");
        let recorded = Recorded {
            deadline_ms: 1_700_000_003_000,
            version: version.clone(),
        };
        let decoded = Recorded::decode(&recorded.encode()).unwrap();
        assert_eq!(decoded, recorded);
        assert_eq!(decoded.deadline_at(&version), Some(1_700_000_003_000));
        let later = Hlc::new(1_700_000_000_001, "store");
        assert_eq!(decoded.deadline_at(&later), None);
        for garbage in [&b""[..], b"12", b"x 1:0:n", b"12 not-a-version", b"\xff 1"] {
            assert_eq!(Recorded::decode(garbage), None, "{garbage:?}");
        }
    }

    #[test]
    fn the_time_left_is_never_zero() {
        assert_eq!(time_left(0), 1);
        let left = time_left(hlc::now_ms() + 60_000);
        assert!((59_000..=60_000).contains(&left), "{left}");
    }
}
