//! Every rule Dapr's two front ends apply to a request before it reaches
//! the store, written once: the store's name, keys, saves, lock names and
//! expiry, counts and operation names. A broken rule is a [`Refusal`],
//! which [`super::answer`] turns into Dapr's HTTP answer or gRPC status.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use bytes::Bytes;
use thiserror::Error;

use crate::access::rules::{Access, Need, TopicNeed};
use crate::dapr::{Concurrency, SEPARATOR, Save, ttl_from_metadata};
use crate::http::state::AppState;

/// Why a Dapr request was refused before it reached the store.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum Refusal {
    /// No state store of that name.
    #[error("state store {0} is not found")]
    StateStoreNotFound(String),
    /// No lock store of that name.
    #[error("lock store {0} is not found")]
    LockStoreNotFound(String),
    /// No configuration store of that name.
    #[error("configuration store {0} not found")]
    ConfigurationStoreNotFound(String),
    /// An empty key.
    #[error("a key must not be empty")]
    EmptyKey,
    /// A key with `||`, the separator of Dapr's key prefixes.
    #[error("input key/keyPrefix '{key}' can't contain '{SEPARATOR}'")]
    IllegalKey {
        /// The key as the app named it.
        key: String,
        /// The state store it named.
        store: String,
    },
    /// A lock resource with `||`, which Dapr refuses as the lock
    /// operation's failure.
    #[error("{}: input key/keyPrefix '{resource}' can't contain '{SEPARATOR}'", call.failed())]
    IllegalResource {
        /// The resource as the app named it.
        resource: String,
        /// The operation refused.
        call: LockCall,
    },
    /// A key (with its prefix) longer than `--max-key-bytes`.
    #[error("a key may have at most {0} bytes")]
    KeyTooLong(usize),
    /// The caller's rules do not allow what it asked on this key or lock.
    #[error("access to key {0:?} is not allowed")]
    Forbidden(String),
    /// More items, keys or operations than `--max-batch-ops`.
    #[error("at most {max} {what}")]
    TooMany {
        /// The limit.
        max: usize,
        /// What was counted, as the message names it.
        what: Counted,
    },
    /// More list elements and map entries in all than a gRPC request may
    /// carry (items, keys, operations and their metadata, at every depth).
    #[error("a request may carry at most {0} list elements and map entries in all")]
    TooManyElements(usize),
    /// A request body or gRPC message over `--dapr-max-body-size`.
    #[error("stream too large: a request may have at most {0} bytes")]
    TooLarge(usize),
    /// A gRPC answer that would be over `--dapr-max-body-size`.
    #[error("the answer would be larger than the {0} bytes a message may have")]
    AnswerTooLarge(usize),
    /// A value larger than the store takes.
    #[error("a value may have at most {0} bytes")]
    ValueTooLarge(usize),
    /// `metadata.ttlInSeconds` that is not a whole number.
    #[error("{0}")]
    Ttl(String),
    /// A concurrency option Dapr does not have.
    #[error("unknown concurrency {0:?}: expected first-write or last-write")]
    Concurrency(String),
    /// A transaction operation other than `upsert` and `delete`.
    #[error("unknown operation {0:?}: expected upsert or delete")]
    Operation(String),
    /// A transaction operation without its request.
    #[error("an operation without its request")]
    OperationWithoutRequest,
    /// A lock request without a resource.
    #[error("resourceId is empty")]
    EmptyResource,
    /// A lock request without an owner.
    #[error("lockOwner is empty")]
    EmptyOwner,
    /// A lock resource whose lock key is longer than `--max-key-bytes`.
    #[error("resourceId may have at most {0} bytes with its lock key prefix")]
    ResourceTooLong(usize),
    /// A lock owner longer than the lock holder limit.
    #[error("lockOwner may have at most {0} bytes")]
    OwnerTooLong(usize),
    /// A lock's expiry of zero seconds or less.
    #[error("expiryInSeconds must be greater than zero")]
    Expiry,
    /// A body or parameter that cannot be read as Dapr's request.
    #[error("{0}")]
    Malformed(String),
    /// An HTTP configuration subscription on a gateway with no app to
    /// deliver its changes to.
    #[error("app channel is not initialized. cannot subscribe to configuration updates")]
    NoAppChannel,
    /// The gateway cannot reach the store (Dapr's health routes).
    #[error("the gateway is not connected to the state store")]
    NotReady,
    /// No pub/sub component of that name.
    #[error("pubsub {pubsub} is not found")]
    PubsubNotFound {
        /// The name asked for.
        pubsub: String,
        /// The request's metadata, as daprd names it in the error's
        /// `ErrorInfo` (over HTTP; none over gRPC).
        metadata: Option<BTreeMap<String, String>>,
    },
    /// A publish without a topic.
    #[error("topic is empty in pubsub {pubsub}")]
    TopicEmpty {
        /// The pub/sub component's name.
        pubsub: String,
        /// The request's metadata (the error's `ErrorInfo`).
        metadata: BTreeMap<String, String>,
    },
    /// A topic MQTT does not allow in a PUBLISH: daprd's publish failure
    /// (its MQTT component fails the publish), before anything is sent.
    #[error("error when publishing to topic {topic} in pubsub {pubsub}: {ILLEGAL_TOPIC}")]
    IllegalTopic {
        /// The pub/sub component's name.
        pubsub: String,
        /// The topic.
        topic: String,
    },
    /// The caller's rules do not allow publishing on the topic.
    #[error("topic {topic} is not allowed for app id {app_id}")]
    PubsubForbidden {
        /// The pub/sub component's name.
        pubsub: String,
        /// The topic.
        topic: String,
        /// The app id the gateway serves.
        app_id: String,
    },
    /// A bulk publish's events cannot be read (Dapr's messages).
    #[error("{}", fault.message(pubsub, topic))]
    BulkEvents {
        /// The pub/sub component's name.
        pubsub: String,
        /// The topic.
        topic: String,
        /// The app id the gateway serves (the error's `ErrorInfo`).
        app_id: String,
        /// What is wrong with them.
        fault: BulkFault,
    },
}

/// Why an illegal topic cannot be published to.
pub const ILLEGAL_TOPIC: &str =
    "an MQTT topic name holds no '+', '#' or NUL and has at most 65535 bytes";

/// What is wrong with a bulk publish's events, as daprd tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BulkFault {
    /// The body is not a list of entries (the parser's error).
    Unmarshal(String),
    /// An entry's event is not of its content type.
    Envelope(String),
    /// An entry id is missing or repeated.
    EntryId,
}

impl BulkFault {
    /// daprd's message for it.
    fn message(&self, pubsub: &str, topic: &str) -> String {
        match self {
            Self::Unmarshal(error) => format!(
                "error when unmarshaling the request for topic {topic} pubsub {pubsub}: {error}"
            ),
            Self::Envelope(error) => format!(
                "error when marshalling cloud event envelope for topic {topic} pubsub {pubsub}: {error}"
            ),
            Self::EntryId => format!(
                "error marshaling events to bytes for topic {topic} pubsub {pubsub}. error: {}",
                Self::ENTRY_ID
            ),
        }
    }

    /// daprd's error for a missing or repeated entry id.
    pub const ENTRY_ID: &str = "entryId is duplicated or not present for entry";
}

/// What [`Refusal::TooMany`] counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counted {
    /// Items of a save.
    Items,
    /// Keys of a bulk get.
    Keys,
    /// Operations of a transaction.
    Operations,
}

impl std::fmt::Display for Counted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Counted::Items => "items per request",
            Counted::Keys => "keys per request",
            Counted::Operations => "operations per transaction",
        })
    }
}

/// A lock operation, which Dapr names in a refused lock request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockCall {
    /// `tryLock`.
    TryLock,
    /// `unlock`.
    Unlock,
}

impl LockCall {
    /// How Dapr's message of a failed call begins.
    fn failed(self) -> &'static str {
        match self {
            LockCall::TryLock => "failed to try acquiring lock",
            LockCall::Unlock => "failed to release lock",
        }
    }
}

/// One item to save as either front end reads it off the wire.
#[derive(Debug)]
pub(super) struct SaveItem {
    /// The key as the app names it.
    pub key: String,
    /// The bytes to store.
    pub value: Bytes,
    /// The etag, empty for none.
    pub etag: Option<String>,
    /// The concurrency option.
    pub concurrency: Concurrency,
    /// `metadata.ttlInSeconds`, as text.
    pub ttl: Option<String>,
}

/// A transaction operation: an upsert, or a delete of the item's key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum OperationKind {
    /// `upsert`.
    Upsert,
    /// `delete`.
    Delete,
}

/// The rules as one caller's request meets them.
pub(super) struct Check<'a> {
    state: &'a AppState,
    access: &'a Access,
}

/// The state store a request names must be the gateway's.
pub(super) fn state_store(state: &AppState, name: &str) -> Result<(), Refusal> {
    if name == state.dapr.settings().state_store {
        return Ok(());
    }
    Err(Refusal::StateStoreNotFound(name.to_owned()))
}

/// The pub/sub component a request names must be one of the gateway's,
/// and its topic one MQTT allows in a PUBLISH.
pub(super) fn publish_target(
    state: &AppState,
    pubsub: &str,
    topic: &str,
    metadata: &HashMap<String, String>,
) -> Result<(), Refusal> {
    let sorted = || metadata.clone().into_iter().collect::<BTreeMap<_, _>>();
    if !state.dapr.has_pubsub(pubsub) {
        return Err(Refusal::PubsubNotFound {
            pubsub: pubsub.to_owned(),
            metadata: Some(sorted()),
        });
    }
    if topic.is_empty() {
        return Err(Refusal::TopicEmpty {
            pubsub: pubsub.to_owned(),
            metadata: sorted(),
        });
    }
    if topic.len() > usize::from(u16::MAX) || topic.contains(['+', '#', '\0']) {
        return Err(Refusal::IllegalTopic {
            pubsub: pubsub.to_owned(),
            topic: topic.to_owned(),
        });
    }
    Ok(())
}

/// A bulk publish's entry ids: each present and different (Dapr's rule,
/// and message).
pub(super) fn entry_ids<'a>(
    state: &AppState,
    pubsub: &str,
    topic: &str,
    ids: impl Iterator<Item = &'a str>,
) -> Result<(), Refusal> {
    let mut seen = std::collections::HashSet::new();
    for id in ids {
        if id.is_empty() || !seen.insert(id) {
            return Err(bulk_events(state, pubsub, topic, BulkFault::EntryId));
        }
    }
    Ok(())
}

/// A bulk publish's events refused for `fault`.
pub(super) fn bulk_events(
    state: &AppState,
    pubsub: &str,
    topic: &str,
    fault: BulkFault,
) -> Refusal {
    Refusal::BulkEvents {
        pubsub: pubsub.to_owned(),
        topic: topic.to_owned(),
        app_id: state.dapr.settings().app_id.clone(),
        fault,
    }
}

/// A bulk entry's metadata: the request's, with the entry's own over it.
pub(super) fn entry_metadata(
    request: &HashMap<String, String>,
    entry: HashMap<String, String>,
) -> HashMap<String, String> {
    let mut merged = request.clone();
    merged.extend(entry);
    merged
}

/// The lock store a request names must be the gateway's.
pub(super) fn lock_store(state: &AppState, name: &str) -> Result<(), Refusal> {
    if name == state.dapr.settings().lock_store {
        return Ok(());
    }
    Err(Refusal::LockStoreNotFound(name.to_owned()))
}

/// The configuration store a request names must be the gateway's.
pub(super) fn configuration_store(state: &AppState, name: &str) -> Result<(), Refusal> {
    if name == state.dapr.settings().configuration_store {
        return Ok(());
    }
    Err(Refusal::ConfigurationStoreNotFound(name.to_owned()))
}

/// A concurrency option by Dapr's name (none or empty: `last-write`).
pub(super) fn concurrency(name: Option<&str>) -> Result<Concurrency, Refusal> {
    match name {
        None | Some("" | "last-write") => Ok(Concurrency::LastWrite),
        Some("first-write") => Ok(Concurrency::FirstWrite),
        Some(other) => Err(Refusal::Concurrency(other.to_owned())),
    }
}

/// A transaction operation by Dapr's name.
pub(super) fn operation(name: &str) -> Result<OperationKind, Refusal> {
    match name {
        "upsert" => Ok(OperationKind::Upsert),
        "delete" => Ok(OperationKind::Delete),
        other => Err(Refusal::Operation(other.to_owned())),
    }
}

/// At most `max` of `what`: the count rule of both front ends, which they
/// apply while reading a request, before its elements are held.
pub(super) fn at_most(max: usize, count: usize, what: Counted) -> Result<(), Refusal> {
    if count <= max {
        return Ok(());
    }
    Err(Refusal::TooMany { max, what })
}

/// A lock's expiry: whole seconds, more than zero.
pub(super) fn expiry(seconds: i64) -> Result<Duration, Refusal> {
    u64::try_from(seconds)
        .ok()
        .filter(|&s| s > 0)
        .map(Duration::from_secs)
        .ok_or(Refusal::Expiry)
}

impl<'a> Check<'a> {
    /// The rules for `access`'s requests to the gateway in `state`.
    pub(super) fn new(state: &'a AppState, access: &'a Access) -> Self {
        Self { state, access }
    }

    /// The key's store key: not empty, without `||` (Dapr keeps it for
    /// its key prefixes), within the key limit with its prefix, and the
    /// caller may do `need` to it.
    pub(super) fn key(&self, key: &str, need: Need) -> Result<Bytes, Refusal> {
        if key.is_empty() {
            return Err(Refusal::EmptyKey);
        }
        if key.contains(SEPARATOR) {
            return Err(Refusal::IllegalKey {
                key: key.to_owned(),
                store: self.state.dapr.settings().state_store.clone(),
            });
        }
        let store_key = self.state.dapr.store_key(key);
        if store_key.len() > self.state.limits.max_key_bytes {
            return Err(Refusal::KeyTooLong(self.state.limits.max_key_bytes));
        }
        self.allowed(&store_key, need)?;
        Ok(store_key)
    }

    /// The configuration items `names`: each not empty, its store key
    /// within the key limit, and the caller may read it.
    pub(super) fn configuration_keys(&self, names: &[String]) -> Result<(), Refusal> {
        for name in names {
            if name.is_empty() {
                return Err(Refusal::EmptyKey);
            }
            let store_key = self.state.dapr.configuration_key(name);
            if store_key.len() > self.state.limits.max_key_bytes {
                return Err(Refusal::KeyTooLong(self.state.limits.max_key_bytes));
            }
            self.allowed(&store_key, Need::Read)?;
        }
        Ok(())
    }

    /// A save of one item: its key may be written, its expiry is
    /// `query_ttl` (the request's `metadata.ttlInSeconds`, which Dapr
    /// merges over each item's metadata), else the item's, its value
    /// within the value limit.
    pub(super) fn save(&self, item: SaveItem, query_ttl: Option<&str>) -> Result<Save, Refusal> {
        self.key(&item.key, Need::Write)?;
        let ttl = query_ttl.or(item.ttl.as_deref());
        let ttl_ms = ttl_from_metadata(ttl).map_err(Refusal::Ttl)?;
        let limit = self.state.value_limit();
        if item.value.len() > limit {
            return Err(Refusal::ValueTooLarge(limit));
        }
        Ok(Save {
            key: item.key,
            value: item.value,
            etag: item.etag.filter(|etag| !etag.is_empty()),
            concurrency: item.concurrency,
            ttl_ms,
        })
    }

    /// A `tryLock` request's resource and owner: see [`Check::lock`].
    pub(super) fn try_lock(&self, resource: &str, owner: &str) -> Result<(), Refusal> {
        self.lock(resource, owner, LockCall::TryLock)
    }

    /// An `unlock` request's resource and owner: see [`Check::lock`].
    pub(super) fn unlock(&self, resource: &str, owner: &str) -> Result<(), Refusal> {
        self.lock(resource, owner, LockCall::Unlock)
    }

    /// A lock request's resource and owner: present, the resource without
    /// `||` (as Dapr's lock key), both within their limits (the resource
    /// as its lock key), and the caller may write the lock key.
    fn lock(&self, resource: &str, owner: &str, call: LockCall) -> Result<(), Refusal> {
        if resource.is_empty() {
            return Err(Refusal::EmptyResource);
        }
        if owner.is_empty() {
            return Err(Refusal::EmptyOwner);
        }
        if resource.contains(SEPARATOR) {
            return Err(Refusal::IllegalResource {
                resource: resource.to_owned(),
                call,
            });
        }
        let max_owner = self.state.locks.settings().max_holder_bytes;
        if owner.len() > max_owner {
            return Err(Refusal::OwnerTooLong(max_owner));
        }
        let lock_key = self.state.dapr.lock_key(resource);
        let max_key = self.state.limits.max_key_bytes;
        if lock_key.len() > max_key {
            return Err(Refusal::ResourceTooLong(max_key));
        }
        self.allowed(&lock_key, Need::Write)
    }

    /// The caller's rules let it publish on `topic` (`brokerResources`,
    /// method `Publish`).
    pub(super) fn publish(&self, pubsub: &str, topic: &str) -> Result<(), Refusal> {
        self.access
            .require_topic(topic, TopicNeed::Publish)
            .map_err(|_| Refusal::PubsubForbidden {
                pubsub: pubsub.to_owned(),
                topic: topic.to_owned(),
                app_id: self.state.dapr.settings().app_id.clone(),
            })
    }

    fn allowed(&self, store_key: &[u8], need: Need) -> Result<(), Refusal> {
        self.access
            .require(store_key, need)
            .map_err(|_| Refusal::Forbidden(String::from_utf8_lossy(store_key).into_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operations_and_concurrency_are_read_by_daprs_names() {
        assert_eq!(operation("upsert"), Ok(OperationKind::Upsert));
        assert_eq!(operation("delete"), Ok(OperationKind::Delete));
        assert_eq!(
            operation("merge"),
            Err(Refusal::Operation("merge".to_owned()))
        );
        assert_eq!(concurrency(None), Ok(Concurrency::LastWrite));
        assert_eq!(concurrency(Some("")), Ok(Concurrency::LastWrite));
        assert_eq!(
            concurrency(Some("first-write")),
            Ok(Concurrency::FirstWrite)
        );
        assert!(matches!(
            concurrency(Some("eventual")),
            Err(Refusal::Concurrency(_))
        ));
    }

    #[test]
    fn a_lock_expires_after_a_positive_number_of_seconds() {
        assert_eq!(expiry(5), Ok(Duration::from_secs(5)));
        assert_eq!(expiry(0), Err(Refusal::Expiry));
        assert_eq!(expiry(-1), Err(Refusal::Expiry));
    }
}
