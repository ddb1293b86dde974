//! Dapr transactions: every etag checked before anything is applied, and
//! never left half-applied for a reader of the Dapr API, whichever gateway
//! crashes or loses the broker in the middle.
//!
//! A transaction `X` on keys `k1 < k2 < ...`:
//!
//! 1. **Leases**, in key order (so two transactions cannot deadlock): the
//!    keys' lease keys (the ones conditional writes take) are set to
//!    `txn:X:<deadline>` with `NX` and no expiry; each lease's version is
//!    the fencing token of that key.
//! 2. **Checks**: each key is read and its etag (or `first-write`) checked.
//!    A mismatch releases the leases: nothing was written.
//! 3. **Commit**: the intent record `dapr-txn||X` (every op, its value and
//!    its key's token) is written with `NX`. This one write decides: once
//!    it exists the transaction happened, whoever applies it.
//! 4. **Apply**: each op, fenced with its key's token.
//! 5. **Clean up**: the intent record, then the leases, are deleted.
//!
//! Whoever finds a key's lease held by a transaction resolves it
//! ([`resolve`]): a committed one (its intent record exists) is applied
//! again by the finder, with the same tokens (a second apply of the same
//! op with the same token is the same write), then cleaned up; one past
//! its deadline without a record is aborted by writing `aborted` to its
//! record's key with `NX`, so its own gateway, if it is only paused,
//! cannot commit afterwards. A finder acts on a record only if it names
//! the lease value that led to it and that lease's key, and applies an op
//! only while the op's key's lease holds that value ([`bound_ops`]): a record
//! moves only keys whose leases name its transaction. Leases and records
//! live under the gateway's reserved prefixes, which no caller reaches.
//! Readers of the Dapr API read a key's lease
//! between two reads of the key ([`read`]), and resolve a transaction they
//! find, so a read never sees a committed transaction's keys half applied. Writers of the Dapr
//! API take the same lease, so they resolve it too.

use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use futures_util::future::FutureExt as _;

use super::error::DaprError;
use super::keys::intent_key;
use super::lease::{self, FIRST_PAUSE, LONGEST_PAUSE, fenced, is_outdated, lease_key};
use super::settings::DaprSettings;
use crate::mqtt::RequestOptions;
use crate::protocol::{Hlc, SetCondition, SetOptions, hlc};
use crate::store::reserved::is_reserved;
use crate::store::{RequestError, SetOutcome, StoreClient, Versioned};

/// A lease held by a transaction: `txn:<id>:<deadline ms>`.
const TXN_LEASE: &str = "txn:";

/// An abort marker outlives any pause its transaction's gateway could
/// plausibly come back from.
const ABORTED_FOR: Duration = Duration::from_secs(24 * 3600);
const ABORTED: &[u8] = b"aborted";

/// One operation of a transaction, on a store key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxOp {
    /// The store key.
    pub key: Bytes,
    /// The new value (`None`: delete the key).
    pub value: Option<Bytes>,
    /// The value's expiry.
    pub ttl_ms: Option<u64>,
    /// The etag the op is conditional on.
    pub etag: Option<Hlc>,
    /// `first-write` without an etag: the key must be absent.
    pub only_if_absent: bool,
}

/// The intent record: what a committed transaction does, with each key's
/// fencing token, so that anyone can apply it.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Intent {
    /// The value every lease of the transaction holds.
    lease: String,
    ops: Vec<IntentOp>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct IntentOp {
    /// The key, base64.
    k: String,
    /// The key's fencing token.
    t: String,
    /// The new value, base64; absent: delete.
    v: Option<String>,
    /// Its expiry in milliseconds.
    px: Option<u64>,
}

impl Intent {
    /// Whether this is the record of the transaction holding `lease` with
    /// `lease_value`: it names that lease value and the lease's key.
    fn binds(&self, lease_value: &[u8], lease: &[u8]) -> bool {
        self.lease.as_bytes() == lease_value
            && self.ops.iter().any(|op| {
                BASE64
                    .decode(&op.k)
                    .is_ok_and(|key| lease_key(&key).as_ref() == lease)
            })
    }
}

/// The transaction a lease value names, and its deadline.
fn txn_of(lease_value: &[u8]) -> Option<(String, u64)> {
    let text = std::str::from_utf8(lease_value).ok()?;
    let (id, deadline) = text.strip_prefix(TXN_LEASE)?.split_once(':')?;
    Some((id.to_owned(), deadline.parse().ok()?))
}

/// Runs a transaction: see the module's summary.
pub(super) async fn execute(
    store: &StoreClient,
    settings: &DaprSettings,
    mut ops: Vec<TxOp>,
) -> Result<(), DaprError> {
    ops.sort_by(|a, b| a.key.cmp(&b.key));
    if ops.windows(2).any(|pair| pair[0].key == pair[1].key) {
        return Err(DaprError::DuplicateKey);
    }
    let id = format!("{:032x}", rand::random::<u128>());
    let deadline =
        hlc::now_ms() + u64::try_from(settings.etag_lease.as_millis()).unwrap_or(u64::MAX);
    let lease_value = Bytes::from(format!("{TXN_LEASE}{id}:{deadline}"));
    let mut tokens = Vec::with_capacity(ops.len());
    let held = async {
        for op in &ops {
            let lease = lease_key(&op.key);
            let token = lease::take(
                store,
                &lease,
                &lease_value,
                None,
                settings.lease_wait,
                RESOLVE,
            )
            .await?;
            tokens.push(token);
        }
        check(store, &ops).await
    }
    .await;
    if let Err(error) = held {
        release(store, ops.iter().map(|op| &op.key), &lease_value).await;
        return Err(error);
    }
    let intent = Intent {
        lease: String::from_utf8_lossy(&lease_value).into_owned(),
        ops: ops
            .iter()
            .zip(&tokens)
            .map(|(op, token)| IntentOp {
                k: BASE64.encode(&op.key),
                t: token.encode(),
                v: op.value.as_ref().map(|value| BASE64.encode(value)),
                px: op.ttl_ms,
            })
            .collect(),
    };
    let record = Bytes::from(serde_json::to_vec(&intent).map_err(|error| {
        DaprError::Store(RequestError::UnexpectedReply {
            verb: "SET",
            reply: error.to_string(),
        })
    })?);
    let committed = store
        .set(
            intent_key(&id),
            record.clone(),
            SetOptions {
                condition: SetCondition::OnlyIfMissing,
                expires_in_ms: None,
            },
            &RequestOptions::default(),
        )
        .await;
    match committed {
        Ok(SetOutcome::Applied(_)) => {}
        // Aborted by another gateway: this one passed its deadline.
        Ok(SetOutcome::NotApplied) => {
            release(store, ops.iter().map(|op| &op.key), &lease_value).await;
            return Err(DaprError::LeaseBusy(settings.etag_lease));
        }
        // Unknown whether the record landed: whoever finds the leases
        // resolves it either way, so the keys are never half applied.
        Err(error) => return Err(error.into()),
    }
    let ops: Vec<&IntentOp> = intent.ops.iter().collect();
    finish(store, &id, &intent, &ops, record).await
}

/// Every op's etag or condition against the keys as they are now.
async fn check(store: &StoreClient, ops: &[TxOp]) -> Result<(), DaprError> {
    for op in ops {
        let current = store.get(op.key.clone()).await?;
        let matches = match (&op.etag, &current) {
            (Some(etag), Some(Versioned { version, .. })) => version.as_ref() == Some(etag),
            (Some(_), None) => false,
            (None, current) => !(op.only_if_absent && current.is_some()),
        };
        if !matches {
            return Err(DaprError::EtagMismatch);
        }
    }
    Ok(())
}

/// Applies `ops` of a committed transaction (all of them, or those of a
/// found record that [`bound_ops`] keeps) and cleans up after it; `record`
/// is the intent record as stored (its delete is conditional on it).
async fn finish(
    store: &StoreClient,
    id: &str,
    intent: &Intent,
    ops: &[&IntentOp],
    record: Bytes,
) -> Result<(), DaprError> {
    for op in ops {
        let (Ok(key), Ok(token)) = (BASE64.decode(&op.k), Hlc::parse(&op.t)) else {
            continue;
        };
        let key = Bytes::from(key);
        let fenced = fenced(&token);
        let written = match op.v.as_ref().and_then(|v| BASE64.decode(v).ok()) {
            Some(value) => {
                let options = SetOptions {
                    condition: SetCondition::Always,
                    expires_in_ms: op.px,
                };
                store
                    .set(key, Bytes::from(value), options, &fenced)
                    .await
                    .map(drop)
            }
            None => store.del(key, Some(token)).await.map(drop),
        };
        match written {
            // A newer holder already wrote after this transaction.
            Err(error) if is_outdated(&error) => {}
            other => other?,
        }
    }
    store.vdel(intent_key(id), record, None).await?;
    let keys: Vec<Bytes> = intent
        .ops
        .iter()
        .filter_map(|op| BASE64.decode(&op.k).ok().map(Bytes::from))
        .collect();
    release(store, keys.iter(), &Bytes::from(intent.lease.clone())).await;
    Ok(())
}

/// The ops of a record found by [`resolve`] that it may apply: those whose
/// key's lease holds the transaction's lease value. A transaction holds
/// every key's lease from before its record exists until all its ops are
/// applied, so every op of a record a gateway wrote passes (an op whose
/// lease was released was applied by whoever released it), and a record
/// moves only keys whose leases name its transaction.
async fn bound_ops<'a>(
    store: &StoreClient,
    intent: &'a Intent,
) -> Result<Vec<&'a IntentOp>, DaprError> {
    let mut bound = Vec::with_capacity(intent.ops.len());
    for op in &intent.ops {
        let Ok(key) = BASE64.decode(&op.k) else {
            continue;
        };
        if is_reserved(&key) {
            continue;
        }
        let held = store.get(lease_key(&key)).await?;
        if held.is_some_and(|held| held.value.as_ref() == intent.lease.as_bytes()) {
            bound.push(op);
        }
    }
    Ok(bound)
}

/// Releases the leases the transaction holds (failures are left for the
/// next finder to resolve).
async fn release<'a>(
    store: &StoreClient,
    keys: impl Iterator<Item = &'a Bytes>,
    lease_value: &Bytes,
) {
    for key in keys {
        lease::release(store, lease_key(key), lease_value.clone()).await;
    }
}

/// [`resolve`] as the leases of conditional writes and transactions take it.
pub(super) const RESOLVE: lease::Resolve = |store, lease| resolve(store, lease).boxed();

/// Resolves the transaction holding `lease`, if one does: applies a
/// committed one, aborts one past its deadline. True when the lease may
/// now be free (try again at once).
pub(super) async fn resolve(store: &StoreClient, lease: &Bytes) -> Result<bool, DaprError> {
    let Some(held) = store.get(lease.clone()).await? else {
        return Ok(true);
    };
    let Some((id, deadline)) = txn_of(&held.value) else {
        return Ok(false);
    };
    let record = store.get(intent_key(&id)).await?;
    match record {
        Some(record) if record.value.as_ref() == ABORTED => {
            store.vdel(lease.clone(), held.value, None).await?;
            Ok(true)
        }
        // Acted on only if it is the record of the transaction whose
        // lease led here; any other is waited for as a live holder.
        Some(record) => match serde_json::from_slice::<Intent>(&record.value) {
            Ok(intent) if intent.binds(&held.value, lease) => {
                let ops = bound_ops(store, &intent).await?;
                finish(store, &id, &intent, &ops, record.value).await?;
                Ok(true)
            }
            _ => Ok(false),
        },
        None if hlc::now_ms() > deadline => {
            let abort = store
                .set(
                    intent_key(&id),
                    Bytes::from_static(ABORTED),
                    SetOptions {
                        condition: SetCondition::OnlyIfMissing,
                        expires_in_ms: Some(ABORTED_FOR.as_millis() as u64),
                    },
                    &RequestOptions::default(),
                )
                .await?;
            if abort == SetOutcome::NotApplied {
                // It committed meanwhile: apply it.
                return Box::pin(resolve(store, lease)).await;
            }
            store.vdel(lease.clone(), held.value, None).await?;
            Ok(true)
        }
        None => Ok(false),
    }
}

/// A Dapr read of `key`: the key, its lease, then the key again, until
/// both reads of the key agree and nothing holding the lease wrote it.
///
/// A transaction holding the lease is resolved first. A conditional
/// write's claim (the value it read, written again under its lease) is
/// never returned: a key written after its lease was taken is in the
/// middle of a write, which is waited for, up to `wait`. Reading the
/// lease between two reads of the key closes the gap a lease read first
/// leaves (a whole write landing between the two reads).
pub(super) async fn read(
    store: &StoreClient,
    key: Bytes,
    wait: Duration,
) -> Result<Option<Versioned<Bytes>>, DaprError> {
    let lease = lease_key(&key);
    let deadline = Instant::now() + wait;
    let mut pause = FIRST_PAUSE;
    loop {
        let first = store.get(key.clone()).await?;
        let held = store.get(lease.clone()).await?;
        let mid_write = match &held {
            Some(held) if txn_of(&held.value).is_some() => {
                resolve(store, &lease).await?;
                false
            }
            Some(held) => version_of(&first) > held.version.as_ref(),
            None => false,
        };
        if !mid_write {
            let second = store.get(key.clone()).await?;
            if version_of(&second) == version_of(&first) {
                return Ok(second);
            }
        }
        if Instant::now() + pause >= deadline {
            return Err(DaprError::LeaseBusy(wait));
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(LONGEST_PAUSE);
    }
}

fn version_of(read: &Option<Versioned<Bytes>>) -> Option<&Hlc> {
    read.as_ref().and_then(|read| read.version.as_ref())
}
