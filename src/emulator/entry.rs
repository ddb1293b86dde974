//! One stored key, as the store holds it and the persistence log records it.

use bytes::Bytes;

use crate::protocol::Hlc;

/// One stored key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The value (may be empty).
    pub value: Bytes,
    /// The version its last SET got.
    pub version: Hlc,
    /// The newest fencing token a write presented; later writes need one at
    /// least as new.
    pub fencing_token: Option<Hlc>,
    /// Wall-clock milliseconds at which the key expires (PX).
    pub expires_at_ms: Option<u64>,
    /// Whether its last SET asked for persistence.
    pub persistent: bool,
}
