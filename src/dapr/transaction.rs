//! Dapr transactions: every etag checked before anything is applied, and
//! never left half-applied for a reader of the Dapr API, whichever gateway
//! crashes or loses the broker in the middle.
//!
//! The operations apply in order, as Dapr's stores apply them: those on
//! one key fold into one ([`fold`]) with the first one's condition (its
//! etag or `first-write`, checked against the key as it was) and the last
//! one's effect. A later operation's condition meets the key as the
//! earlier ones left it: an etag never matches (the earlier write gives
//! the key a version no client has seen), a `first-write` matches only
//! after a delete.
//!
//! A transaction `X` on keys `k1 < k2 < ...`:
//!
//! 1. **Leases**, in key order (so two transactions cannot deadlock): the
//!    keys' lease keys (the ones conditional writes take) are set to
//!    `txn:X:<deadline>` with `NX` and no expiry; each lease's version is
//!    the fencing token of that key.
//! 2. **Checks**: each key is read and its etag (or `first-write`) checked,
//!    and the store is asked, without a change, whether it takes writes of
//!    the key fenced with its token ([`probe`]: not if a writer outside the
//!    Dapr API fenced it ahead of every lease). A mismatch or a refusal
//!    releases the leases: nothing was written.
//! 3. **Commit**: the intent record `dapr-txn||X` (every op, its value and
//!    its key's token, as bytes: [`Intent::encode`]) is written with `NX`.
//!    This one write decides: once it exists the transaction happened,
//!    whoever applies it. A commit the store surely did not take (refused,
//!    or never sent: too large for the broker) releases the leases.
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
//! find, so a read never sees a committed transaction's keys half applied.
//! Writers of the Dapr API take the same lease, so they resolve it too.
//! A gateway whose transaction failed with its leases or record possibly
//! left (an unknown commit, a failed apply or clean-up) resolves them
//! itself once the deadline has passed ([`settle_later`]).

use std::collections::HashMap;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::{Buf as _, BufMut as _, Bytes};
use serde::Deserialize;
use tokio::time::Instant;

use futures_util::future::FutureExt as _;

use super::error::DaprError;
use super::expiry;
use super::keys::intent_key;
use super::lease::{
    self, FIRST_PAUSE, LONGEST_PAUSE, fenced, is_outdated, lease_key, refused_for_token,
};
use super::settings::DaprSettings;
use crate::mqtt::{PoolError, RequestOptions};
use crate::protocol::{Hlc, SetCondition, SetOptions, hlc};
use crate::store::reserved::{OUTBOX_PREFIX, is_reserved};
use crate::store::{RequestError, SetOutcome, StoreClient, Versioned};

/// A lease held by a transaction: `txn:<id>:<deadline ms>`.
const TXN_LEASE: &str = "txn:";

/// An abort marker outlives any pause its transaction's gateway could
/// plausibly come back from.
const ABORTED_FOR: Duration = Duration::from_secs(24 * 3600);
const ABORTED: &[u8] = b"aborted";

/// The first bytes of an intent record (its format's name and version).
const RECORD_MAGIC: &[u8] = b"dapr-txn/2\n";

/// How often a gateway tries to resolve what its failed transaction left.
const SETTLE_ATTEMPTS: u32 = 60;
/// The longest pause between two of those tries.
const SETTLE_PAUSE: Duration = Duration::from_secs(30);

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
    /// An upsert's `first-write` without an etag: the key must be absent.
    pub only_if_absent: bool,
}

/// The intent record: what a committed transaction does, with each key's
/// fencing token, so that anyone can apply it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Intent {
    /// The value every lease of the transaction holds.
    lease: Bytes,
    ops: Vec<IntentOp>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct IntentOp {
    key: Bytes,
    /// The key's fencing token.
    token: Hlc,
    /// The new value; `None`: delete.
    value: Option<Bytes>,
    /// Its expiry in milliseconds.
    px: Option<u64>,
}

/// An op's kind in a record: delete, set, set with an expiry.
const DELETE: u8 = 0;
const SET: u8 = 1;
const SET_PX: u8 = 2;

impl Intent {
    /// The record's bytes: [`RECORD_MAGIC`], the lease value, the number of
    /// ops, then per op its key, token, kind, expiry and value, each
    /// length-prefixed (u32, big-endian). Values go in as they are, so a
    /// record is about the size of its values (a value a save takes fits
    /// a one-op transaction's record).
    fn encode(&self) -> Bytes {
        let tokens: Vec<String> = self.ops.iter().map(|op| op.token.encode()).collect();
        let size = RECORD_MAGIC.len()
            + 8
            + self.lease.len()
            + self
                .ops
                .iter()
                .zip(&tokens)
                .map(|(op, token)| {
                    21 + op.key.len() + token.len() + op.value.as_ref().map_or(0, Bytes::len)
                })
                .sum::<usize>();
        let mut out = Vec::with_capacity(size);
        out.put_slice(RECORD_MAGIC);
        put_field(&mut out, &self.lease);
        out.put_u32(u32::try_from(self.ops.len()).unwrap_or(u32::MAX));
        for (op, token) in self.ops.iter().zip(&tokens) {
            put_field(&mut out, &op.key);
            put_field(&mut out, token.as_bytes());
            match (&op.value, op.px) {
                (None, _) => out.put_u8(DELETE),
                (Some(value), None) => {
                    out.put_u8(SET);
                    put_field(&mut out, value);
                }
                (Some(value), Some(px)) => {
                    out.put_u8(SET_PX);
                    out.put_u64(px);
                    put_field(&mut out, value);
                }
            }
        }
        Bytes::from(out)
    }

    /// A record's intent (values share the record's bytes), or `None` for
    /// anything a gateway did not write. A record in the JSON form earlier
    /// versions wrote is read too, so that a gateway resolves what an older
    /// one left while both serve one store.
    fn decode(record: &Bytes) -> Option<Intent> {
        if !record.starts_with(RECORD_MAGIC) {
            return serde_json::from_slice::<LegacyIntent>(record)
                .ok()?
                .into_intent();
        }
        let mut fields = Fields {
            record,
            at: RECORD_MAGIC.len(),
        };
        let lease = fields.field()?;
        let count = fields.u32()?;
        let mut ops = Vec::new();
        for _ in 0..count {
            let key = fields.field()?;
            let token = Hlc::parse(std::str::from_utf8(&fields.field()?).ok()?).ok()?;
            let (value, px) = match fields.u8()? {
                DELETE => (None, None),
                SET => (Some(fields.field()?), None),
                SET_PX => {
                    let px = fields.u64()?;
                    (Some(fields.field()?), Some(px))
                }
                _ => return None,
            };
            ops.push(IntentOp {
                key,
                token,
                value,
                px,
            });
        }
        fields.is_done().then_some(Intent { lease, ops })
    }

    fn keys(&self) -> impl Iterator<Item = &Bytes> {
        self.ops.iter().map(|op| &op.key)
    }

    /// Whether this is the record of the transaction holding `lease` with
    /// `lease_value`: it names that lease value and the lease's key.
    fn binds(&self, lease_value: &[u8], lease: &[u8]) -> bool {
        self.lease.as_ref() == lease_value
            && self.keys().any(|key| lease_key(key).as_ref() == lease)
    }
}

/// An intent record as earlier versions wrote it: JSON, keys and values
/// in base64.
#[derive(Deserialize)]
struct LegacyIntent {
    lease: String,
    ops: Vec<LegacyOp>,
}

#[derive(Deserialize)]
struct LegacyOp {
    k: String,
    t: String,
    v: Option<String>,
    px: Option<u64>,
}

impl LegacyIntent {
    fn into_intent(self) -> Option<Intent> {
        let ops = self
            .ops
            .into_iter()
            .map(|op| {
                Some(IntentOp {
                    key: Bytes::from(BASE64.decode(&op.k).ok()?),
                    token: Hlc::parse(&op.t).ok()?,
                    value: match op.v {
                        Some(value) => Some(Bytes::from(BASE64.decode(value).ok()?)),
                        None => None,
                    },
                    px: op.px,
                })
            })
            .collect::<Option<_>>()?;
        Some(Intent {
            lease: Bytes::from(self.lease),
            ops,
        })
    }
}

fn put_field(out: &mut Vec<u8>, field: &[u8]) {
    out.put_u32(u32::try_from(field.len()).unwrap_or(u32::MAX));
    out.put_slice(field);
}

/// A reader of a record's fields, every length checked against what is
/// left (a record is bytes anyone may have written).
struct Fields<'a> {
    record: &'a Bytes,
    at: usize,
}

impl Fields<'_> {
    /// The next `len` bytes, as a slice of the record.
    fn take(&mut self, len: usize) -> Option<Bytes> {
        let end = self
            .at
            .checked_add(len)
            .filter(|&end| end <= self.record.len())?;
        let taken = self.record.slice(self.at..end);
        self.at = end;
        Some(taken)
    }

    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?.get_u8())
    }

    fn u32(&mut self) -> Option<u32> {
        Some(self.take(4)?.get_u32())
    }

    fn u64(&mut self) -> Option<u64> {
        Some(self.take(8)?.get_u64())
    }

    /// A length-prefixed field.
    fn field(&mut self) -> Option<Bytes> {
        let len = usize::try_from(self.u32()?).ok()?;
        self.take(len)
    }

    fn is_done(&self) -> bool {
        self.at == self.record.len()
    }
}

/// The transaction a lease value names, and its deadline.
fn txn_of(lease_value: &[u8]) -> Option<(String, u64)> {
    let text = std::str::from_utf8(lease_value).ok()?;
    let (id, deadline) = text.strip_prefix(TXN_LEASE)?.split_once(':')?;
    Some((id.to_owned(), deadline.parse().ok()?))
}

/// The operations, in order, as one per key (in the order keys first
/// appear): the first one's condition, the last one's effect. A later
/// operation's condition is checked against what the earlier ones left:
/// an etag never matches, a `first-write` only after a delete.
fn fold(ops: Vec<TxOp>) -> Result<Vec<TxOp>, DaprError> {
    let mut folded: Vec<TxOp> = Vec::with_capacity(ops.len());
    let mut index: HashMap<Bytes, usize> = HashMap::with_capacity(ops.len());
    for op in ops {
        let Some(&at) = index.get(&op.key) else {
            index.insert(op.key.clone(), folded.len());
            folded.push(op);
            continue;
        };
        let earlier = &mut folded[at];
        let present = earlier.value.is_some();
        if op.etag.is_some() || (op.only_if_absent && present) {
            return Err(DaprError::EtagMismatch);
        }
        earlier.value = op.value;
        earlier.ttl_ms = op.ttl_ms;
    }
    Ok(folded)
}

/// Runs a transaction: see the module's summary.
pub(super) async fn execute(
    store: &StoreClient,
    settings: &DaprSettings,
    ops: Vec<TxOp>,
) -> Result<(), DaprError> {
    let mut ops = fold(ops)?;
    ops.sort_by(|a, b| a.key.cmp(&b.key));
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
        check(store, &ops, &tokens).await
    }
    .await;
    if let Err(error) = held {
        let unreleased = release(store, ops.iter().map(|op| &op.key), &lease_value).await;
        settle_later(store, unreleased.iter(), deadline);
        return Err(error);
    }
    let intent = Intent {
        lease: lease_value.clone(),
        ops: ops
            .into_iter()
            .zip(tokens)
            .map(|(op, token)| IntentOp {
                key: op.key,
                token,
                value: op.value,
                px: op.ttl_ms,
            })
            .collect(),
    };
    let record = intent.encode();
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
            let unreleased = release(store, intent.keys(), &lease_value).await;
            settle_later(store, unreleased.iter(), deadline);
            return Err(DaprError::LeaseBusy(settings.etag_lease));
        }
        Err(error) if error.surely_not_applied() => {
            let unreleased = release(store, intent.keys(), &lease_value).await;
            settle_later(store, unreleased.iter(), deadline);
            return Err(match error {
                RequestError::Transport(PoolError::TooLarge { size, max }) => {
                    DaprError::RecordTooLarge { size, max }
                }
                error => error.into(),
            });
        }
        // Unknown whether the record landed: whoever finds the leases
        // resolves it either way, so the keys are never half applied.
        Err(error) => {
            settle_later(store, intent.keys(), deadline);
            return Err(error.into());
        }
    }
    if let Err(error) = apply(store, intent.ops.iter()).await {
        settle_later(store, intent.keys(), deadline);
        return Err(DaprError::Unapplied(Box::new(error)));
    }
    // Applied: what a failed clean-up leaves is settled, not reported.
    match clean_up(store, &id, &intent, record).await {
        Ok(unreleased) => settle_later(store, unreleased.iter(), deadline),
        Err(error) => {
            tracing::debug!(%error, "cleaning up after a transaction failed; it is resolved later");
            settle_later(store, intent.keys(), deadline);
        }
    }
    Ok(())
}

/// Every op's etag or condition against the keys as they are now, and
/// whether the store takes writes of each key fenced with its token.
async fn check(store: &StoreClient, ops: &[TxOp], tokens: &[Hlc]) -> Result<(), DaprError> {
    for (op, token) in ops.iter().zip(tokens) {
        let (current, probed) = tokio::join!(store.get(op.key.clone()), probe(store, op, token));
        let current = current?;
        probed?;
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

/// Whether the store takes writes of `op`'s key fenced with `token`, asked
/// without changing anything: a `VDEL` of a value the key never holds (a
/// fresh random one), fenced with the token, which the store refuses only
/// when the key carries a newer token.
async fn probe(store: &StoreClient, op: &TxOp, token: &Hlc) -> Result<(), DaprError> {
    let never_held = Bytes::from(format!("dapr-probe:{:032x}", rand::random::<u128>()));
    match store
        .vdel(op.key.clone(), never_held, Some(token.clone()))
        .await
    {
        Ok(_) => Ok(()),
        Err(error) if is_outdated(&error) => Err(DaprError::FencedOut),
        Err(error) => Err(error.into()),
    }
}

/// Applies a committed transaction's `ops`, each fenced with its key's
/// token.
async fn apply<'a>(
    store: &StoreClient,
    ops: impl Iterator<Item = &'a IntentOp>,
) -> Result<(), DaprError> {
    for op in ops {
        let fenced = fenced(&op.token);
        let written = match &op.value {
            Some(value) => {
                let options = SetOptions {
                    condition: SetCondition::Always,
                    expires_in_ms: op.px,
                };
                expiry::set_recorded(store, op.key.clone(), value.clone(), options, &fenced)
                    .await
                    .map(drop)
            }
            None => store
                .del(op.key.clone(), Some(op.token.clone()))
                .await
                .map(drop),
        };
        match written {
            // A newer holder already wrote after this transaction.
            Err(error) if is_outdated(&error) => {
                refused_for_token(store, &op.key, &op.token, Ok(())).await?;
            }
            other => other?,
        }
    }
    Ok(())
}

/// Deletes a transaction's intent record (conditional on `record`, the
/// record as stored), then releases its leases; the keys whose release
/// failed.
async fn clean_up(
    store: &StoreClient,
    id: &str,
    intent: &Intent,
    record: Bytes,
) -> Result<Vec<Bytes>, DaprError> {
    store.vdel(intent_key(id), record, None).await?;
    Ok(release(store, intent.keys(), &intent.lease).await)
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
    apply(store, ops.iter().copied()).await?;
    // A lease left held is the next finder's to resolve.
    clean_up(store, id, intent, record).await.map(drop)
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
        // An outbox marker commits with its transaction, so it is applied
        // with it; no other reserved key is ever an op.
        if is_reserved(&op.key) && !op.key.starts_with(OUTBOX_PREFIX.as_bytes()) {
            continue;
        }
        let held = store.get(lease_key(&op.key)).await?;
        if held.is_some_and(|held| held.value == intent.lease) {
            bound.push(op);
        }
    }
    Ok(bound)
}

/// Releases the leases the transaction holds; the keys whose release
/// failed (left for the next finder, or [`settle_later`]).
async fn release<'a>(
    store: &StoreClient,
    keys: impl Iterator<Item = &'a Bytes>,
    lease_value: &Bytes,
) -> Vec<Bytes> {
    let mut unreleased = Vec::new();
    for key in keys {
        if !lease::release(store, lease_key(key), lease_value.clone()).await {
            unreleased.push(key.clone());
        }
    }
    unreleased
}

/// Resolves, once `deadline` (wall-clock ms) has passed, whatever a failed
/// transaction may have left holding `keys` (its leases, its record), so
/// that it does not wait for a reader or writer of them: a committed
/// transaction is applied, one that did not commit is aborted. Tried again
/// while the store cannot be reached, a bounded number of times; a gateway
/// that stops first leaves it to the next finder.
fn settle_later<'a>(store: &StoreClient, keys: impl Iterator<Item = &'a Bytes>, deadline: u64) {
    let leases: Vec<Bytes> = keys.map(|key| lease_key(key)).collect();
    if leases.is_empty() {
        return;
    }
    let store = store.clone();
    tokio::spawn(async move {
        let wait = Duration::from_millis(deadline.saturating_sub(hlc::now_ms()) + 1);
        tokio::time::sleep(wait).await;
        for lease in leases {
            let mut pause = Duration::from_millis(100);
            for _ in 0..SETTLE_ATTEMPTS {
                match resolve(&store, &lease).await {
                    Ok(_) => break,
                    Err(error) => {
                        tracing::debug!(%error, "settling a failed transaction's lease; trying again");
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(SETTLE_PAUSE);
                    }
                }
            }
        }
    });
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
        Some(record) => match Intent::decode(&record.value) {
            Some(intent) if intent.binds(&held.value, lease) => {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn op(key: &str, value: Option<&str>) -> TxOp {
        TxOp {
            key: Bytes::copy_from_slice(key.as_bytes()),
            value: value.map(|value| Bytes::copy_from_slice(value.as_bytes())),
            ttl_ms: None,
            etag: None,
            only_if_absent: false,
        }
    }

    fn with_etag(mut op: TxOp) -> TxOp {
        op.etag = Some(Hlc::new(1_700_000_000_000, "store"));
        op
    }

    fn first_write(mut op: TxOp) -> TxOp {
        op.only_if_absent = true;
        op
    }

    #[test]
    fn operations_on_one_key_fold_into_the_first_condition_and_the_last_effect() {
        let folded = fold(vec![
            with_etag(op("a", Some("1"))),
            op("b", Some("x")),
            op("a", None),
            op("a", Some("2")),
            op("c", Some("y")),
            op("c", None),
        ])
        .unwrap();
        assert_eq!(
            folded,
            vec![
                with_etag(op("a", Some("2"))),
                op("b", Some("x")),
                op("c", None)
            ]
        );
    }

    #[test]
    fn a_later_operation_meets_the_key_as_the_earlier_ones_left_it() {
        let etag_after_a_write = fold(vec![op("a", Some("1")), with_etag(op("a", Some("2")))]);
        assert!(matches!(etag_after_a_write, Err(DaprError::EtagMismatch)));
        let etag_after_a_delete = fold(vec![op("a", None), with_etag(op("a", Some("2")))]);
        assert!(matches!(etag_after_a_delete, Err(DaprError::EtagMismatch)));
        let first_write_after_a_write =
            fold(vec![op("a", Some("1")), first_write(op("a", Some("2")))]);
        assert!(matches!(
            first_write_after_a_write,
            Err(DaprError::EtagMismatch)
        ));
        let first_write_after_a_delete =
            fold(vec![op("a", None), first_write(op("a", Some("2")))]).unwrap();
        assert_eq!(first_write_after_a_delete, vec![op("a", Some("2"))]);
    }

    fn intent() -> Intent {
        let token = Hlc::new(1_700_000_000_000, "store");
        Intent {
            lease: Bytes::from_static(b"txn:0123:1700000005000"),
            ops: vec![
                IntentOp {
                    key: Bytes::from_static(b"k\xff1"),
                    token: token.clone(),
                    value: Some(Bytes::from_static(b"\x00\x01 bytes")),
                    px: None,
                },
                IntentOp {
                    key: Bytes::from_static(b"k2"),
                    token: token.clone(),
                    value: Some(Bytes::new()),
                    px: Some(3000),
                },
                IntentOp {
                    key: Bytes::from_static(b"k3"),
                    token,
                    value: None,
                    px: None,
                },
            ],
        }
    }

    #[test]
    fn a_record_holds_its_values_as_they_are() {
        let intent = intent();
        let record = intent.encode();
        assert_eq!(Intent::decode(&record), Some(intent.clone()));
        let values: usize = intent
            .ops
            .iter()
            .map(|op| op.value.as_ref().map_or(0, Bytes::len))
            .sum();
        let keys_and_tokens: usize = intent
            .ops
            .iter()
            .map(|op| op.key.len() + op.token.encode().len())
            .sum();
        assert!(
            record.len() <= values + keys_and_tokens + intent.lease.len() + 100,
            "{} bytes",
            record.len()
        );
    }

    #[test]
    fn a_record_no_gateway_wrote_is_not_read() {
        let record = intent().encode();
        for cut in 0..record.len() {
            assert_eq!(Intent::decode(&record.slice(..cut)), None, "cut at {cut}");
        }
        let mut longer = record.to_vec();
        longer.push(0);
        assert_eq!(Intent::decode(&Bytes::from(longer)), None);
        let mut unknown_kind = record.to_vec();
        let kind_at = record.len() - 1; // the last op is a delete: its kind is last
        unknown_kind[kind_at] = 9;
        assert_eq!(Intent::decode(&Bytes::from(unknown_kind)), None);
        // A count far beyond the bytes allocates nothing up front.
        let mut huge = RECORD_MAGIC.to_vec();
        put_field(&mut huge, b"txn:x:1");
        huge.put_u32(u32::MAX);
        assert_eq!(Intent::decode(&Bytes::from(huge)), None);
        assert_eq!(Intent::decode(&Bytes::from_static(ABORTED)), None);
    }

    #[test]
    fn a_record_an_earlier_version_wrote_is_read() {
        let token = Hlc::new(1_700_000_000_000, "store");
        let legacy = serde_json::json!({
            "lease": "txn:0123:1700000005000",
            "ops": [
                {"k": BASE64.encode("k1"), "t": token.encode(), "v": BASE64.encode("\"v\""), "px": 3000},
                {"k": BASE64.encode("k2"), "t": token.encode(), "v": null, "px": null},
            ],
        });
        let record = Bytes::from(legacy.to_string());
        let intent = Intent::decode(&record).unwrap();
        assert_eq!(intent.lease.as_ref(), b"txn:0123:1700000005000");
        assert_eq!(
            intent.ops,
            vec![
                IntentOp {
                    key: Bytes::from_static(b"k1"),
                    token: token.clone(),
                    value: Some(Bytes::from_static(b"\"v\"")),
                    px: Some(3000),
                },
                IntentOp {
                    key: Bytes::from_static(b"k2"),
                    token,
                    value: None,
                    px: None,
                },
            ]
        );
        let bad_key = serde_json::json!({"lease": "txn:x:1", "ops": [{"k": "!", "t": "1:0:n", "v": null, "px": null}]});
        assert_eq!(Intent::decode(&Bytes::from(bad_key.to_string())), None);
    }
}
