//! What watchers are told: a key's events and snapshots, with ids that
//! never go back.

use std::sync::OnceLock;

use bytes::Bytes;

use crate::protocol::Hlc;

/// Values longer than this are left out of watch events, and out of the
/// hub's memory: the event says `value_omitted` and the value's length, and
/// a `GET` of the key reads it (raw or as JSON, written piece by piece).
/// The event of a value this long is at most about 7.4 MiB (JSON escapes
/// and base64), within the default `--watch-buffer-bytes`.
pub const MAX_EVENT_VALUE_BYTES: usize = 1 << 20;

/// A key's value as the hub keeps it and its events carry it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchedValue {
    /// The value, at most [`MAX_EVENT_VALUE_BYTES`] long.
    Bytes(Bytes),
    /// A longer value: only its length is kept.
    Omitted(usize),
}

impl WatchedValue {
    /// The bytes, unless they were left out.
    pub fn bytes(&self) -> Option<&Bytes> {
        match self {
            Self::Bytes(bytes) => Some(bytes),
            Self::Omitted(_) => None,
        }
    }

    /// The value as the hub keeps it: like [`From`], in an allocation of
    /// its own, so that a small value does not keep the whole packet (or
    /// read buffer) it came in.
    pub(super) fn kept(value: Bytes) -> Self {
        match Self::from(value) {
            Self::Bytes(bytes) => Self::Bytes(Bytes::copy_from_slice(&bytes)),
            omitted => omitted,
        }
    }
}

/// The value, or its length alone when it is over [`MAX_EVENT_VALUE_BYTES`].
impl From<Bytes> for WatchedValue {
    fn from(value: Bytes) -> Self {
        if value.len() > MAX_EVENT_VALUE_BYTES {
            Self::Omitted(value.len())
        } else {
            Self::Bytes(value)
        }
    }
}

/// What a key holds, as far as the hub knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// The value; `None` when the key is absent.
    pub value: Option<WatchedValue>,
    /// The store's version: of the value, or of the delete that removed
    /// it; `None` for a key that was absent when read.
    pub version: Option<Hlc>,
    /// The id of the event that led here (see [`Snapshot::id`]).
    id: SnapshotId,
}

/// A snapshot's event id, held apart from its version only when it
/// differs (rare): the hub keeps a snapshot per followed key.
#[derive(Debug, Clone, PartialEq, Eq)]
enum SnapshotId {
    None,
    Version,
    Other(Box<Hlc>),
}

impl Snapshot {
    /// What a key holds: `value` at `version`, told by the event `id`.
    pub fn new(value: Option<WatchedValue>, version: Option<Hlc>, id: Option<Hlc>) -> Self {
        let id = match id {
            None => SnapshotId::None,
            Some(id) if Some(&id) == version.as_ref() => SnapshotId::Version,
            Some(id) => SnapshotId::Other(Box::new(id)),
        };
        Self { value, version, id }
    }

    /// The id of the event that led here (see [`KeyEvent::id`]).
    pub fn id(&self) -> Option<&Hlc> {
        match &self.id {
            SnapshotId::None => None,
            SnapshotId::Version => self.version.as_ref(),
            SnapshotId::Other(id) => Some(id),
        }
    }
}

/// What a watcher is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// The current state: first, after a resync, or after falling behind.
    Sync {
        /// The hub re-registered after a reconnect and the key had moved.
        resync: bool,
        /// The watcher fell behind and skipped events.
        lagged: bool,
    },
    /// The key was set.
    Set,
    /// The key was deleted (DEL, VDEL or expiry).
    Delete,
    /// The hub cannot currently follow the key; a `resync` follows when it can.
    Error,
    /// A followed pattern's initial listing is complete: every key it
    /// matched (`keys` of them) had its `sync`. The event's `key` is the
    /// pattern.
    Listed {
        /// Keys the pattern matched.
        keys: usize,
    },
    /// A followed pattern takes no new keys (a limit is reached); the
    /// event's `key` is the pattern, `error` says which limit.
    PatternError,
}

/// One event for the watchers of a key.
#[derive(Debug, Clone)]
pub struct KeyEvent {
    /// What happened.
    pub kind: EventKind,
    /// The key (the pattern, for a pattern's own events).
    pub key: Bytes,
    /// The value after the event, if the key exists.
    pub value: Option<WatchedValue>,
    /// The key's version after the event (the store's).
    pub version: Option<Hlc>,
    /// The event's identity (the SSE `id:`), strictly increasing per key
    /// while the key is watched: the store's version, unless that is not
    /// newer than the last id (a delete found only by a resync has no
    /// version; a restarted store can go back), then just after the last.
    pub id: Option<Hlc>,
    /// Why following the key failed (for [`EventKind::Error`]).
    pub error: Option<String>,
    /// The event's SSE frame, rendered once by the first watcher that sends
    /// it and shared by the others (10,000 watchers, one serialisation).
    pub rendered: OnceLock<Bytes>,
}

impl KeyEvent {
    /// What the event may come to hold: the value, its base64 and the SSE
    /// frame that carries both (rendered once, shared by every watcher).
    pub fn weight(&self) -> usize {
        let value = self
            .value
            .as_ref()
            .and_then(WatchedValue::bytes)
            .map_or(0, Bytes::len);
        let error = self.error.as_ref().map_or(0, String::len);
        // Value + base64 in the frame, plus the value itself; the key twice.
        value + 2 * (value + value.div_ceil(3) * 4) + 2 * self.key.len() + error + 256
    }

    /// An event of `key`, not yet rendered: the one place an event is
    /// put together.
    pub fn new(
        kind: EventKind,
        key: Bytes,
        value: Option<WatchedValue>,
        version: Option<Hlc>,
        id: Option<Hlc>,
    ) -> Self {
        Self {
            kind,
            key,
            value,
            version,
            id,
            error: None,
            rendered: OnceLock::new(),
        }
    }

    /// A `delete` of `key` with this version and event id.
    pub(super) fn delete(key: &Bytes, version: Option<Hlc>, id: Option<Hlc>) -> Self {
        Self::new(EventKind::Delete, key.clone(), None, version, id)
    }

    /// A `sync` of `key` to `snapshot`.
    pub(super) fn sync(key: &Bytes, snapshot: &Snapshot, resync: bool, lagged: bool) -> Self {
        Self::new(
            EventKind::Sync { resync, lagged },
            key.clone(),
            snapshot.value.clone(),
            snapshot.version.clone(),
            snapshot.id().cloned(),
        )
    }

    /// This event's state as a first `sync` (a stream's first word of a
    /// key is its state, whatever changed it).
    pub(super) fn as_sync(&self) -> Self {
        Self::new(
            EventKind::Sync {
                resync: false,
                lagged: false,
            },
            self.key.clone(),
            self.value.clone(),
            self.version.clone(),
            self.id.clone(),
        )
    }

    /// An `error` of `key`: the hub cannot follow it now, for `why`.
    pub(super) fn error(key: &Bytes, why: String) -> Self {
        Self {
            error: Some(why),
            ..Self::new(EventKind::Error, key.clone(), None, None, None)
        }
    }

    /// A pattern's `listed`: its initial listing had `keys` keys.
    pub(super) fn listed(pattern: &Bytes, keys: usize) -> Self {
        Self::new(
            EventKind::Listed { keys },
            pattern.clone(),
            None,
            None,
            None,
        )
    }

    /// A pattern's `error`: it takes no new keys, for `why`.
    pub(super) fn pattern_error(pattern: &Bytes, why: String) -> Self {
        Self {
            error: Some(why),
            ..Self::new(EventKind::PatternError, pattern.clone(), None, None, None)
        }
    }
}

/// The id for the next event of a key whose last event had `last`: the
/// store's `version` when it is newer, else just after `last`.
pub(super) fn next_id(last: Option<&Hlc>, version: Option<&Hlc>) -> Option<Hlc> {
    match (last, version) {
        (Some(last), Some(version)) if version > last => Some(version.clone()),
        (Some(last), _) => Some(last.successor()),
        (None, version) => version.cloned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hlc(wall_ms: u64, counter: u64) -> Hlc {
        Hlc {
            wall_ms,
            counter,
            node: "StateStore".into(),
        }
    }

    #[test]
    fn a_snapshot_holds_its_id_apart_only_when_it_is_not_its_version() {
        let value = Some(WatchedValue::Bytes(Bytes::from_static(b"v")));
        let same = Snapshot::new(value.clone(), Some(hlc(5, 0)), Some(hlc(5, 0)));
        assert_eq!(same.id, SnapshotId::Version);
        assert_eq!(same.id(), Some(&hlc(5, 0)));
        let ahead = Snapshot::new(value, Some(hlc(2, 0)), Some(hlc(5, 4)));
        assert_eq!(ahead.id(), Some(&hlc(5, 4)));
        assert_eq!(ahead.version, Some(hlc(2, 0)));
        let deleted = Snapshot::new(None, None, Some(hlc(5, 1)));
        assert_eq!(deleted.id(), Some(&hlc(5, 1)));
        assert_eq!(Snapshot::new(None, None, None).id(), None);
        // A version without an id is told without one.
        assert_eq!(Snapshot::new(None, Some(hlc(5, 0)), None).id(), None);
    }

    #[test]
    fn a_kept_value_is_a_copy_of_its_bytes_alone() {
        let packet = Bytes::from(b"header|21.5|trailer".to_vec());
        let WatchedValue::Bytes(kept) = WatchedValue::kept(packet.slice(7..11)) else {
            panic!("a short value is kept");
        };
        assert_eq!(kept, Bytes::from_static(b"21.5"));
        assert_ne!(
            kept.as_ptr(),
            packet[7..].as_ptr(),
            "not a slice of the packet"
        );
        let long = Bytes::from(vec![0; MAX_EVENT_VALUE_BYTES + 1]);
        assert_eq!(
            WatchedValue::kept(long),
            WatchedValue::Omitted(MAX_EVENT_VALUE_BYTES + 1)
        );
    }

    #[test]
    fn ids_follow_the_store_and_never_go_back() {
        assert_eq!(next_id(None, None), None);
        assert_eq!(next_id(None, Some(&hlc(5, 0))), Some(hlc(5, 0)));
        assert_eq!(next_id(Some(&hlc(5, 0)), Some(&hlc(7, 0))), Some(hlc(7, 0)));
        // A delete found by a resync (no version): just after the last id.
        assert_eq!(next_id(Some(&hlc(5, 0)), None), Some(hlc(5, 1)));
        // A store that went back: still after the last id.
        assert_eq!(next_id(Some(&hlc(5, 3)), Some(&hlc(2, 0))), Some(hlc(5, 4)));
    }
}
