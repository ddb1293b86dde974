//! An optional access list, so that clients can meet `not authorized`.
//!
//! A JSON object from client id patterns to key prefixes:
//!
//! ```json
//! {
//!   "gateway":   { "read": [""],         "write": ["app/"] },
//!   "sensor-*":  { "read": ["sensors/"], "write": ["sensors/"] },
//!   "*":         { "read": ["public/"] }
//! }
//! ```
//!
//! A pattern is an exact client id, or a prefix followed by `*`. An exact
//! match wins, then the longest prefix. GET and KEYNOTIFY need `read`; SET,
//! DEL and VDEL need `write` (which does not imply `read`); SCAN lists only
//! the keys the client may read. A client no pattern matches may do
//! nothing. The prefix `""` means every key.
//!
//! The client id is the request's `__srcId`, which the client itself
//! asserts: this exercises error paths, it is not a security boundary.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;
use thiserror::Error;

/// What a request does to a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// GET, KEYNOTIFY.
    Read,
    /// SET, DEL, VDEL.
    Write,
}

/// Why an access list could not be loaded.
#[derive(Debug, Error)]
pub enum AclError {
    /// The file could not be read.
    #[error("access list {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The JSON does not have the documented shape.
    #[error("access list is not valid: {0}")]
    Invalid(#[from] serde_json::Error),
}

/// The key prefixes one client pattern may read and write.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Grant {
    /// Prefixes of keys it may GET and watch.
    #[serde(default)]
    pub read: Vec<String>,
    /// Prefixes of keys it may SET, DEL and VDEL.
    #[serde(default)]
    pub write: Vec<String>,
}

impl Grant {
    fn allows(&self, key: &[u8], access: Access) -> bool {
        let prefixes = match access {
            Access::Read => &self.read,
            Access::Write => &self.write,
        };
        prefixes
            .iter()
            .any(|prefix| key.starts_with(prefix.as_bytes()))
    }
}

/// Client id patterns and their grants.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct AccessList {
    grants: BTreeMap<String, Grant>,
}

impl AccessList {
    /// Parses the JSON form.
    pub fn from_json(text: &str) -> Result<Self, AclError> {
        Ok(serde_json::from_str(text)?)
    }

    /// Reads and parses a JSON file.
    pub fn load(path: &Path) -> Result<Self, AclError> {
        let text = std::fs::read_to_string(path).map_err(|source| AclError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_json(&text)
    }

    /// Whether `client_id` may access `key` that way.
    pub fn allows(&self, client_id: &str, key: &[u8], access: Access) -> bool {
        self.grant_for(client_id)
            .is_some_and(|grant| grant.allows(key, access))
    }

    fn grant_for(&self, client_id: &str) -> Option<&Grant> {
        if let Some(grant) = self.grants.get(client_id) {
            return Some(grant);
        }
        self.grants
            .iter()
            .filter_map(|(pattern, grant)| {
                let prefix = pattern.strip_suffix('*')?;
                client_id
                    .starts_with(prefix)
                    .then_some((prefix.len(), grant))
            })
            .max_by_key(|(len, _)| *len)
            .map(|(_, grant)| grant)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list() -> AccessList {
        AccessList::from_json(
            r#"{
                "gateway":  { "read": [""], "write": ["app/"] },
                "sensor-*": { "read": ["sensors/"], "write": ["sensors/"] },
                "sensor-admin*": { "read": [""], "write": [""] },
                "*":        { "read": ["public/"] }
            }"#,
        )
        .unwrap()
    }

    #[test]
    fn exact_ids_get_their_grant() {
        let acl = list();
        assert!(acl.allows("gateway", b"anything", Access::Read));
        assert!(acl.allows("gateway", b"app/x", Access::Write));
        assert!(!acl.allows("gateway", b"other/x", Access::Write));
    }

    #[test]
    fn the_longest_prefix_pattern_wins() {
        let acl = list();
        assert!(acl.allows("sensor-7", b"sensors/t", Access::Write));
        assert!(!acl.allows("sensor-7", b"public/x", Access::Read));
        assert!(acl.allows("sensor-admin-1", b"app/x", Access::Write));
        assert!(acl.allows("stranger", b"public/x", Access::Read));
        assert!(!acl.allows("stranger", b"public/x", Access::Write));
    }

    #[test]
    fn write_does_not_imply_read_and_unmatched_clients_get_nothing() {
        let acl = AccessList::from_json(r#"{ "w": { "write": ["k"] } }"#).unwrap();
        assert!(acl.allows("w", b"k1", Access::Write));
        assert!(!acl.allows("w", b"k1", Access::Read));
        assert!(!acl.allows("other", b"k1", Access::Write));
        assert!(!acl.allows("", b"k1", Access::Read));
    }

    #[test]
    fn binary_keys_are_matched_bytewise() {
        let acl = AccessList::from_json(r#"{ "c": { "read": ["\u0000"] } }"#).unwrap();
        assert!(acl.allows("c", &[0, 255], Access::Read));
        assert!(!acl.allows("c", &[1], Access::Read));
    }

    #[test]
    fn malformed_lists_are_refused() {
        for bad in [
            "[]",
            r#"{ "c": { "read": "k" } }"#,
            r#"{ "c": { "reed": ["k"] } }"#,
            "{",
        ] {
            assert!(AccessList::from_json(bad).is_err(), "{bad}");
        }
    }
}
