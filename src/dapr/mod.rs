//! Dapr's building blocks over the store and the broker: what each Dapr
//! operation does in store commands or MQTT messages, shared by Dapr's HTTP
//! routes and gRPC service ([`crate::http::dapr`]), which only translate
//! shapes. Pub/sub: `publish` makes an event's MQTT message as daprd makes
//! its CloudEvent; [`pubsub`] holds delivery's rules (subscriptions,
//! routes, what an app's answer means, retries); [`app`] reaches the app.
//! [`query`] and [`metadata`] hold the state query and the sidecar's own
//! metadata.
//!
//! - A read is `GET`; the etag is the key's version (its HLC).
//! - A write or delete without an etag is one `SET`/`DEL`; `first-write`
//!   without an etag is `SET NX` ("only if absent"). With transactions on,
//!   each takes its key's lease first (see below). A write that gives the
//!   key an expiry records it ([`expiry`]) for the claims of etag writes.
//! - A write or delete **with** an etag is a [`conditional`] write: the
//!   store has no compare-and-set on versions, so it is built from a
//!   [`lease`] per key and fencing tokens, correct across any number of
//!   gateways.
//! - A transaction (with `--dapr-transactions`) applies its operations in
//!   order: it folds those on one key into one, takes every key's lease,
//!   checks every etag, commits by one intent record and applies it; see
//!   [`transaction`], which a reader of a key resolves before reading it.
//! - `tryLock` is `SET lock||<prefix>||<resource> owner NX PX` (not
//!   re-entrant, as Dapr's); `unlock` is `VDEL` of that key with the
//!   owner. The key is Dapr's lock key ([`DaprStore::lock_key`]), apart
//!   from every state key; `/locks` and the SDKs' lock clients reach the
//!   same lock by that key, and exclude Dapr's holders as they exclude
//!   each other.

pub mod app;
mod conditional;
mod config_subscriptions;
pub mod configuration;
mod error;
mod expiry;
mod keys;
mod lease;
pub mod metadata;
mod outbox;
mod publish;
pub mod pubsub;
pub mod query;
mod settings;
mod transaction;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream::{self, FuturesOrdered, Stream, StreamExt as _};

use crate::mqtt::RequestOptions;
use crate::protocol::{Hlc, SetCondition, SetOptions, StoreError};
use crate::store::{DelOutcome, RequestError, SetOutcome, StoreClient, VdelOutcome, Versioned};

pub use error::DaprError;
pub use outbox::{Change, PROJECTION, internal_topic};
pub use publish::{CLOUDEVENT_CONTENT_TYPE, Event, PUBSUB_COMPONENT_TYPE, PubsubError};
pub use settings::{
    AppProtocol, AppSettings, DEFAULT_APP_CALL_TIMEOUT, DaprSettings, KeyPrefix, LOCK_KEY_PREFIX,
    LockKeyPrefix, OutboxSettings, SEPARATOR,
};
pub use transaction::TxOp;

/// The state store's component type in Dapr's metadata.
pub const STATE_COMPONENT_TYPE: &str = "state.azure.iotoperations";
/// The lock store's component type.
pub const LOCK_COMPONENT_TYPE: &str = "lock.azure.iotoperations";
/// The configuration store's component type.
pub const CONFIGURATION_COMPONENT_TYPE: &str = "configuration.azure.iotoperations";
/// The runtime version Dapr's metadata names.
pub const RUNTIME_VERSION: &str = concat!("statestore-gateway/", env!("CARGO_PKG_VERSION"));

/// How many saves of one request run at once.
const SAVE_PARALLELISM: usize = 16;

/// How many events of one bulk publish are in flight at once.
const PUBLISH_PARALLELISM: usize = 16;

/// One event of a bulk publish that was not published: its entry id and
/// why.
pub type FailedEntry = (String, PubsubError);

/// One component as Dapr's metadata lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Component<'a> {
    /// The name apps call it by.
    pub name: &'a str,
    /// Its type (`state.azure.iotoperations`).
    pub kind: &'static str,
    /// Its version.
    pub version: &'static str,
    /// The capabilities that hold with the gateway's settings.
    pub capabilities: &'static [&'static str],
}

/// Dapr's concurrency option of a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Concurrency {
    /// `last-write` (or unspecified): without an etag, the write wins.
    #[default]
    LastWrite,
    /// `first-write`: without an etag, only if the key is absent.
    FirstWrite,
}

/// One state item to save.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Save {
    /// The key as the app names it.
    pub key: String,
    /// The bytes to store.
    pub value: Bytes,
    /// The etag the write is conditional on.
    pub etag: Option<String>,
    /// The item's concurrency option.
    pub concurrency: Concurrency,
    /// `metadata.ttlInSeconds` > 0, in milliseconds.
    pub ttl_ms: Option<u64>,
}

/// One key to delete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delete {
    /// The key as the app names it.
    pub key: String,
    /// The etag the delete is conditional on.
    pub etag: Option<String>,
    /// The concurrency option (a delete without an etag ignores it).
    pub concurrency: Concurrency,
}

/// One operation of a transaction, as either front end reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxOperation {
    /// The item (a delete's key, etag and concurrency).
    pub save: Save,
    /// A delete rather than an upsert.
    pub delete: bool,
    /// What an upsert publishes through an outbox.
    pub change: Change,
}

/// What `unlock` came to, numbered as Dapr's `UnlockResponse.Status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnlockStatus {
    /// The owner held the lock and released it.
    Success = 0,
    /// Nobody holds the lock.
    LockDoesNotExist = 1,
    /// Someone else holds it.
    LockBelongsToOthers = 2,
}

/// Dapr's operations over the store. Cheap to clone.
#[derive(Debug, Clone)]
pub struct DaprStore {
    store: StoreClient,
    settings: Arc<DaprSettings>,
    extended: Arc<metadata::ExtendedMetadata>,
    subscriptions: Arc<config_subscriptions::Subscriptions>,
    /// Whether the outbox's relay is subscribed (see [`outbox`]).
    relay_subscribed: Arc<AtomicBool>,
}

/// How many keys of a bulk get are read at once, at most (and when the
/// app leaves it to the gateway).
const BULK_PARALLELISM: usize = 16;

/// One key of a bulk get, and what reading it came to.
pub type BulkRead = (String, Result<Option<Versioned<Bytes>>, DaprError>);

impl DaprStore {
    /// The operations over `store`.
    pub fn new(store: StoreClient, settings: DaprSettings) -> Self {
        Self {
            store,
            settings: Arc::new(settings),
            extended: Arc::default(),
            subscriptions: Arc::default(),
            relay_subscribed: Arc::default(),
        }
    }

    /// The settings.
    pub fn settings(&self) -> &DaprSettings {
        &self.settings
    }

    /// The sidecar's extended metadata (`PUT /v1.0/metadata/{name}`).
    pub fn extended_metadata(&self) -> &metadata::ExtendedMetadata {
        &self.extended
    }

    /// The store key of the app's state key.
    pub fn store_key(&self, key: &str) -> Bytes {
        match self.settings.key_prefix {
            KeyPrefix::None => Bytes::copy_from_slice(key.as_bytes()),
            KeyPrefix::AppId => Bytes::from(format!("{}{SEPARATOR}{key}", self.settings.app_id)),
        }
    }

    /// The store key of the lock `resource`: `lock||[<prefix>||]<resource>`,
    /// as Dapr's lock component names it, apart from every state key.
    pub fn lock_key(&self, resource: &str) -> Bytes {
        keys::lock_key(&self.settings, resource)
    }

    /// The value and etag of `key`, or `None` when it is absent.
    pub async fn get(&self, key: &str) -> Result<Option<Versioned<Bytes>>, DaprError> {
        let key = self.store_key(key);
        if self.settings.transactions {
            return transaction::read(&self.store, key, self.settings.lease_wait).await;
        }
        Ok(self.store.get(key).await?)
    }

    /// The state store's capabilities: those that hold with these settings.
    pub fn capabilities(&self) -> &'static [&'static str] {
        if self.settings.transactions {
            &["ETAG", "TRANSACTIONAL", "TTL", "QUERY_API"]
        } else {
            &["ETAG", "TTL", "QUERY_API"]
        }
    }

    /// The components Dapr's metadata lists: the state store, the lock
    /// store, the configuration store, then each pub/sub component.
    pub fn components(&self) -> Vec<Component<'_>> {
        let pubsubs = self.settings.pubsubs.iter().map(|name| Component {
            name,
            kind: PUBSUB_COMPONENT_TYPE,
            version: "v1",
            capabilities: &[],
        });
        [
            Component {
                name: &self.settings.state_store,
                kind: STATE_COMPONENT_TYPE,
                version: "v1",
                capabilities: self.capabilities(),
            },
            Component {
                name: &self.settings.lock_store,
                kind: LOCK_COMPONENT_TYPE,
                version: "v1",
                capabilities: &[],
            },
            Component {
                name: &self.settings.configuration_store,
                kind: CONFIGURATION_COMPONENT_TYPE,
                version: "v1",
                capabilities: &[],
            },
        ]
        .into_iter()
        .chain(pubsubs)
        .collect()
    }

    /// Whether `name` is one of the pub/sub components.
    pub fn has_pubsub(&self, name: &str) -> bool {
        self.settings.pubsubs.iter().any(|pubsub| pubsub == name)
    }

    /// Publishes `event` through the pub/sub component `pubsub` (see
    /// [`pubsub`]): one MQTT message, acknowledged by the broker.
    pub async fn publish(&self, pubsub: &str, event: Event) -> Result<(), PubsubError> {
        let message = publish::message(
            &self.settings.app_id,
            pubsub,
            event,
            std::time::SystemTime::now(),
        )?;
        self.store.pool().publish(message).await?;
        Ok(())
    }

    /// Publishes each `(entry id, event)`, a few at once. An event that
    /// cannot be made refuses them all, before any is published (as
    /// daprd); otherwise the answer is those the broker did not take.
    pub async fn publish_bulk(
        &self,
        pubsub: &str,
        entries: Vec<(String, Event)>,
    ) -> Result<Vec<FailedEntry>, PubsubError> {
        let now = std::time::SystemTime::now();
        let messages = entries
            .into_iter()
            .map(|(id, event)| {
                Ok((
                    id,
                    publish::message(&self.settings.app_id, pubsub, event, now)?,
                ))
            })
            .collect::<Result<Vec<_>, PubsubError>>()?;
        let pool = self.store.pool();
        let failed = stream::iter(messages)
            .map(|(id, message)| async move {
                let published = pool.publish(message).await;
                published.err().map(|error| (id, PubsubError::from(error)))
            })
            .buffered(PUBLISH_PARALLELISM)
            .filter_map(std::future::ready)
            .collect()
            .await;
        Ok(failed)
    }

    /// A checked save as a transaction's op (`delete`: the key is deleted
    /// instead), its etag read as a version. A delete without an etag
    /// ignores `first-write`, as a single delete does.
    fn tx_op(&self, save: Save, delete: bool) -> Result<TxOp, DaprError> {
        let etag = save.etag.as_deref().map(parse_etag).transpose()?;
        Ok(TxOp {
            key: self.store_key(&save.key),
            value: (!delete).then_some(save.value),
            ttl_ms: save.ttl_ms,
            only_if_absent: !delete
                && etag.is_none()
                && save.concurrency == Concurrency::FirstWrite,
            etag,
        })
    }

    /// Runs a transaction (see [`transaction`]); refused unless the
    /// settings turn transactions on. With an outbox, its upserts are
    /// published once it committed (see [`outbox`]): each operation's
    /// `change` is what its event carries; a projection is not written.
    pub async fn transaction(&self, operations: Vec<TxOperation>) -> Result<(), DaprError> {
        if !self.settings.transactions {
            return Err(DaprError::TransactionsOff);
        }
        let Some(outbox) = &self.settings.outbox else {
            let ops = operations
                .into_iter()
                .map(|operation| self.tx_op(operation.save, operation.delete))
                .collect::<Result<_, _>>()?;
            return transaction::execute(&self.store, &self.settings, ops).await;
        };
        let mut ops = Vec::with_capacity(operations.len());
        let (mut changes, mut projections) = (Vec::new(), Vec::new());
        for TxOperation {
            save,
            delete,
            change,
        } in operations
        {
            if delete {
                ops.push(self.tx_op(save, true)?);
            } else if change.is_projection() {
                projections.push(change);
            } else {
                ops.push(self.tx_op(save, false)?);
                changes.push(change);
            }
        }
        let prepared = outbox::prepare(&self.settings, outbox, &changes, &projections);
        outbox::publish_internal(self.store.pool(), &self.settings.app_id, &prepared).await?;
        ops.extend(prepared.markers);
        transaction::execute(&self.store, &self.settings, ops).await
    }

    /// The outbox's relay (see [`outbox`]), to run until shutdown, when
    /// the state store has an outbox: its own broker connection, client id
    /// `client_id`.
    pub fn outbox_relay(
        &self,
        broker: crate::mqtt::BrokerSettings,
        client_id: String,
    ) -> Option<impl std::future::Future<Output = ()> + Send + 'static> {
        let outbox = self.settings.outbox.clone()?;
        Some(outbox::relay(
            self.store.clone(),
            self.settings.clone(),
            outbox,
            broker,
            client_id,
            self.relay_subscribed.clone(),
        ))
    }

    /// Whether the state store has an outbox, whose events carry each
    /// upsert's metadata.
    pub fn has_outbox(&self) -> bool {
        self.settings.outbox.is_some()
    }

    /// Whether the outbox, if any, can take transactions: its relay is
    /// subscribed to the internal topic (before then, the broker would drop
    /// the internal events, and transactions fail).
    pub fn outbox_ready(&self) -> bool {
        self.settings.outbox.is_none() || self.relay_subscribed.load(Ordering::Acquire)
    }

    /// Each key's value and etag, in the order asked, as the reads are
    /// done. The first read runs alone; then at most `parallelism` (0: the
    /// gateway's choice; at most 16) run at once, and fewer while values
    /// are large: reads not yet taken from the stream (running, or done
    /// but waiting for those before them), times the largest value read so
    /// far, stay within `held_bytes` (one read at least). So a bulk get of
    /// large values holds a few of them, whatever its number of keys.
    pub fn get_bulk(
        &self,
        keys: Vec<String>,
        parallelism: usize,
        held_bytes: usize,
    ) -> impl Stream<Item = BulkRead> + Send + 'static {
        let parallelism = match parallelism {
            0 => BULK_PARALLELISM,
            asked => asked.min(BULK_PARALLELISM),
        };
        let store = self.clone();
        let mut keys = keys.into_iter();
        let mut reading = FuturesOrdered::new();
        let mut largest: Option<usize> = None;
        stream::poll_fn(move |cx| {
            let window = largest.map_or(1, |largest| {
                (held_bytes / largest.max(1)).clamp(1, parallelism)
            });
            while reading.len() < window {
                let Some(key) = keys.next() else { break };
                let store = store.clone();
                reading.push_back(async move {
                    let read = store.get(&key).await;
                    (key, read)
                });
            }
            let read: Option<BulkRead> = std::task::ready!(reading.poll_next_unpin(cx));
            if let Some((_, result)) = &read {
                let size = match result {
                    Ok(Some(versioned)) => versioned.value.len(),
                    _ => 0,
                };
                largest = Some(largest.unwrap_or(0).max(size));
            }
            std::task::Poll::Ready(read)
        })
    }

    /// Saves one item: see the module's summary for the commands.
    pub async fn save(&self, save: Save) -> Result<(), DaprError> {
        let key = self.store_key(&save.key);
        let options = SetOptions {
            condition: SetCondition::Always,
            expires_in_ms: save.ttl_ms,
        };
        if let Some(etag) = &save.etag {
            let expected = parse_etag(etag)?;
            let write = conditional::Write::Set {
                value: save.value,
                options,
            };
            return self.conditional(key, Some(expected), write).await;
        }
        let options = SetOptions {
            condition: match save.concurrency {
                Concurrency::FirstWrite => SetCondition::OnlyIfMissing,
                Concurrency::LastWrite => SetCondition::Always,
            },
            ..options
        };
        if self.settings.transactions {
            // A transaction may hold the key: take its lease like it (which
            // rolls a committed one forward first), so the write, `NX` or
            // not, is ordered before or after the whole transaction.
            let write = conditional::Write::Set {
                value: save.value,
                options,
            };
            return self.conditional(key, None, write).await;
        }
        let set = expiry::set_recorded(
            &self.store,
            key.clone(),
            save.value.clone(),
            options,
            &RequestOptions::default(),
        )
        .await;
        match set {
            Ok(SetOutcome::Applied(_)) => Ok(()),
            Ok(SetOutcome::NotApplied) => Err(DaprError::EtagMismatch),
            // The key carries a fencing token: an etag write left it. A
            // first-write finds it present; a last-write takes the lease.
            Err(error) if requires_token(&error) => match save.concurrency {
                Concurrency::FirstWrite => Err(DaprError::EtagMismatch),
                Concurrency::LastWrite => {
                    let write = conditional::Write::Set {
                        value: save.value,
                        options,
                    };
                    self.conditional(key, None, write).await
                }
            },
            Err(error) => Err(error.into()),
        }
    }

    /// Saves every item, each as its own write, a few at once; the first
    /// failure in the items' order is the answer (the others ran).
    pub async fn save_all(&self, saves: Vec<Save>) -> Result<(), DaprError> {
        let results: Vec<_> = stream::iter(saves)
            .map(|save| self.save(save))
            .buffered(SAVE_PARALLELISM)
            .collect()
            .await;
        results.into_iter().collect()
    }

    /// Deletes one key (an absent key without an etag is no error).
    pub async fn delete(&self, delete: Delete) -> Result<(), DaprError> {
        let key = self.store_key(&delete.key);
        if let Some(etag) = &delete.etag {
            let expected = parse_etag(etag)?;
            return self
                .conditional(key, Some(expected), conditional::Write::Delete)
                .await;
        }
        if self.settings.transactions {
            return self
                .conditional(key, None, conditional::Write::Delete)
                .await;
        }
        match self.store.del(key.clone(), None).await {
            Ok(DelOutcome::Deleted(_) | DelOutcome::Missing) => Ok(()),
            Err(error) if requires_token(&error) => {
                self.conditional(key, None, conditional::Write::Delete)
                    .await
            }
            Err(error) => Err(error.into()),
        }
    }

    /// `tryLock`: true when `owner` now holds `resource` for `expiry`;
    /// false when anyone (the owner too) already holds it.
    pub async fn try_lock(
        &self,
        resource: &str,
        owner: &str,
        expiry: Duration,
    ) -> Result<bool, DaprError> {
        let options = SetOptions {
            condition: SetCondition::OnlyIfMissing,
            expires_in_ms: Some(u64::try_from(expiry.as_millis()).unwrap_or(u64::MAX)),
        };
        let set = self
            .store
            .set(
                self.lock_key(resource),
                Bytes::copy_from_slice(owner.as_bytes()),
                options,
                &RequestOptions::default(),
            )
            .await;
        match set {
            Ok(SetOutcome::Applied(_)) => Ok(true),
            Ok(SetOutcome::NotApplied) => Ok(false),
            // A key with a fencing token exists, so the lock is taken.
            Err(error) if requires_token(&error) => Ok(false),
            Err(error) => Err(error.into()),
        }
    }

    /// `unlock`: releases `resource` if `owner` holds it.
    pub async fn unlock(&self, resource: &str, owner: &str) -> Result<UnlockStatus, DaprError> {
        let vdel = self
            .store
            .vdel(
                self.lock_key(resource),
                Bytes::copy_from_slice(owner.as_bytes()),
                None,
            )
            .await;
        match vdel {
            Ok(VdelOutcome::Deleted(_)) => Ok(UnlockStatus::Success),
            Ok(VdelOutcome::Missing) => Ok(UnlockStatus::LockDoesNotExist),
            Ok(VdelOutcome::ValueDiffers) => Ok(UnlockStatus::LockBelongsToOthers),
            Err(error) => Err(error.into()),
        }
    }

    async fn conditional(
        &self,
        key: Bytes,
        expected: Option<Hlc>,
        write: conditional::Write,
    ) -> Result<(), DaprError> {
        conditional::run(
            &self.store,
            &self.settings,
            key,
            expected,
            write,
            transaction::RESOLVE,
        )
        .await
    }
}

/// An etag as the store's version it must be.
fn parse_etag(etag: &str) -> Result<Hlc, DaprError> {
    Hlc::parse(etag).map_err(|_| DaprError::MalformedEtag(etag.to_owned()))
}

/// Whether the store refused a request because the key carries a fencing
/// token and the request had none.
fn requires_token(error: &RequestError) -> bool {
    matches!(
        error,
        RequestError::Refused {
            error: StoreError::FencingTokenRequired,
            ..
        }
    )
}

/// Dapr's `metadata.ttlInSeconds`: whole seconds; zero or less means no
/// expiry, as Dapr reads it.
pub fn ttl_from_metadata(value: Option<&str>) -> Result<Option<u64>, String> {
    let Some(value) = value else {
        return Ok(None);
    };
    let seconds: i64 = value
        .trim()
        .parse()
        .map_err(|_| format!("metadata.ttlInSeconds must be a whole number, not {value:?}"))?;
    Ok(u64::try_from(seconds)
        .ok()
        .filter(|&s| s > 0)
        .map(|s| s.saturating_mul(1000)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_in_seconds_is_milliseconds_and_zero_or_less_is_none() {
        assert_eq!(ttl_from_metadata(None), Ok(None));
        assert_eq!(ttl_from_metadata(Some("5")), Ok(Some(5000)));
        assert_eq!(ttl_from_metadata(Some("0")), Ok(None));
        assert_eq!(ttl_from_metadata(Some("-1")), Ok(None));
        assert!(ttl_from_metadata(Some("1.5")).is_err());
        assert!(ttl_from_metadata(Some("ten")).is_err());
    }

    #[test]
    fn an_etag_must_be_a_version() {
        assert!(matches!(
            parse_etag("not-a-version"),
            Err(DaprError::MalformedEtag(_))
        ));
        let version = Hlc::new(1_700_000_000_000, "node");
        assert_eq!(parse_etag(&version.encode()).ok(), Some(version));
    }
}
